"""The drain notice: ``drain.notify_command`` runs once per drain while it is pending (a
site's checkpoint hook), not once per alert of a cascade and not when gpuwatchd holds the
node drained already (there is no drain to wait for)."""

from __future__ import annotations

import logging
import os

from gpuwatchd.actions.drain.drivers.base import DrainError, incident_env, run_argv
from gpuwatchd.actions.drain.incidents import (
    Incident,
    node_owned,
    others_announced,
    set_notified,
)
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig

# the logger keeps the name it had as one module (docs/config.md names it)
log = logging.getLogger("gpuwatchd.actions.drain")


def announce(
    store: Store,
    inc: Incident,
    node: str,
    cfg: DrainConfig,
    *,
    pending: str,
    pretend_drained: bool,
    run: bool,
) -> None:
    """Mark ``inc`` announced and run the notify command if this drain needs a notice.

    ``pending``: the pending state's name; ``pretend_drained``: dry-run holds a drain it
    only said; ``run=False`` (simulate) logs what it would run."""
    with store.tx() as conn:
        others = others_announced(conn, pending, inc.key)
        owned = node_owned(conn)
        set_notified(conn, inc.key, 1)
    argv = cfg.notify_command
    if not argv:
        return
    if others or owned or pretend_drained:
        log.info("drain pending for %s: the node's drain is announced already", inc.reason)
        return
    if cfg.dry_run or not run:
        log.warning("drain pending for %s: would run %s (dry run)", inc.reason, argv[0])
        return
    env = {
        **os.environ,
        **incident_env("drain_pending", node, inc.as_mapping(), inc.reason),
        "GPUWATCHD_DRAIN_AT": f"{inc.drain_at:.3f}",
        "GPUWATCHD_GRACE_SECONDS": f"{inc.drain_at - inc.opened:g}",
    }
    try:
        res = run_argv(argv, timeout=cfg.timeout, env=env)
        if res.returncode != 0:
            log.error("drain notify command %s exited with status %d", argv[0], res.returncode)
    except DrainError as exc:
        log.error("drain notify command: %s", exc)
