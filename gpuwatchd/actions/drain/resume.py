"""Resume: undo gpuwatchd's own drain once the faults are over (``drain.resume``).

The node is resumed only when no drain incident is unresolved, ``drain.resume_hold`` has
passed since the last one resolved, and gpuwatchd owns the drain (or, in dry-run, would
hold one). A failed resume retries with a backoff, at most ``drain.attempts`` times. A
resume step is the store, the driver and the time; the controller records its outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver
from gpuwatchd.actions.drain.incidents import (
    Incident,
    in_states,
    last_resolved,
    mark_resumed,
    read_node_drain,
    released,
    resume_failed,
    set_note,
    unresolved_count,
)
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig

RESUME_RESULTS = ("resumed", "unnoted", "not_ours", "not_drained", "dry_run", "failed")
# the incidents whose drain a resume undoes (the newest names it)
_UNDONE = ("drained", "already", "noted", "dry_run")


@dataclass(frozen=True)
class ResumeStep:
    """What one resume did: the driver's ``result``, or ``error`` when it failed."""

    incident: Incident | None
    result: DrainResult | None = None
    error: str | None = None


def resume(
    store: Store,
    driver: Driver,
    now: float,
    cfg: DrainConfig,
    *,
    pretend_drained: bool,
    backoff: Callable[[int], float],
) -> ResumeStep | None:
    """Resume the node if it is time (``None``: not yet, or nothing of ours to undo).

    ``pretend_drained``: dry-run holds a drain it only said; ``backoff(attempts)``: the
    wait before the next try after a failure."""
    row = read_node_drain(store)
    if (
        not (row.owned or pretend_drained)
        or row.next_attempt > now
        or row.resume_attempts >= cfg.attempts
    ):
        return None
    last = last_resolved(store)
    if unresolved_count(store) or last is None or now < last + cfg.resume_hold:
        return None
    drained = in_states(store, _UNDONE)
    inc = drained[-1] if drained else None
    try:
        result = driver.resume(inc.as_mapping() if inc is not None else None, cfg.dry_run)
    except DrainError as exc:
        attempts = row.resume_attempts + 1
        with store.tx() as conn:
            resume_failed(conn, attempts, now + backoff(attempts), str(exc))
        return ResumeStep(inc, error=str(exc))
    with store.tx() as conn:
        released(conn, result.result)
        mark_resumed(conn, now)
        set_note(conn, "dry_run_drained", "")
    return ResumeStep(inc, result)
