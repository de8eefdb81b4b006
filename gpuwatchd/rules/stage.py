"""The rule engine as the daemon and simulate wire it: rules from the config, a state
store, and reload.

``rules_stage(config, clock, durable=True)`` is what ``gpuwatchd run`` puts in its
pipeline (state in ``state_dir``); ``durable=False`` is simulate's (state in memory).
Reload (SIGHUP) goes through ``reload_hook``, which ``Daemon.reload`` calls with the new
config: the new rules are loaded and fully validated first; on any error the running
rules stay, the problems are logged as ``PATH:LINE:COL: message`` and
``gpuwatchd_rules_reload_success`` drops to 0 until a reload succeeds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable

from gpuwatchd.config.loader import Config, load_config
from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.eventlog import log_transitions
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DeviceEvent, GpuSample, XidEvent
from gpuwatchd.rules.engine import Engine
from gpuwatchd.rules.loader import rules_from_config
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.rules.store import StateStore

log = logging.getLogger(__name__)

SIMULATE_BOOT_ID = "simulate"


class RulesStage:
    """A pipeline ``Stage`` around the ``Engine`` that knows where its rules come from."""

    def __init__(self, config: Config, engine: Engine, extra_files: Iterable[str] = ()) -> None:
        self.config = config
        self.engine = engine
        self.extra_files = tuple(extra_files)

    # -- Stage ----------------------------------------------------------------------------
    def observe(self, record: GpuSample | DeviceEvent | XidEvent) -> None:
        self.engine.observe(record)

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        transitions = self.engine.evaluate(now, view)
        log_transitions(transitions)  # every fire and resolve at info level
        return transitions

    def families(self, view: NodeView, fams: Families) -> None:
        self.engine.families(view, fams)

    def close(self) -> None:
        self.engine.close()

    # -- reload ---------------------------------------------------------------------------
    def load(self, config: Config) -> RuleSet:
        return rules_from_config(config, self.extra_files)

    def reload_hook(self, new: Config) -> Callable[[], None]:
        """``Daemon.reload``'s hook: validate the new rules now (raising ``ConfigError``,
        which keeps the old rules), swap them in when every hook has succeeded. The extra
        NVML fields stay the running ones (the backend polls them from start-up), so a rule
        on a field added by the reload is refused until a restart."""
        new = dataclasses.replace(new, fields=self.config.fields)
        try:
            rules = self.load(new)
        except ConfigError:
            self.engine.reload_success = False
            raise

        def commit() -> None:
            self.engine.catalog = new.xid.catalog()
            self.engine.replace_rules(rules)
            self.engine.reload_success = True
            self.config = new
            log.info("loaded %d rule(s) from %d file(s)", len(rules.rules), len(rules.files))

        return commit

    def reload(self, config: Config | None = None) -> bool:
        """Reload the rules (from ``config``, or the running config's file read again).
        True on success; on failure the old rules stay and the problems are logged."""
        try:
            if config is None:
                old = self.config
                config = load_config(old.source, must_exist=old.source is not None)
            self.reload_hook(config)()
        except ConfigError as exc:
            self.engine.reload_success = False
            for line in exc.lines():
                log.error("%s", line)
            log.error("rule reload failed: keeping the %d running rule(s)", len(self.engine.rules))
            return False
        return True


def rules_stage(
    config: Config,
    clock: Clock,
    *,
    durable: bool,
    extra_files: Iterable[str] = (),
    store: StateStore | None = None,
) -> RulesStage:
    """The rule engine for a pipeline. Raises ``ConfigError`` when the rules do not load.

    ``durable``: keep alert states and counter history in ``config.state_dir`` (the
    daemon); otherwise in memory (simulate, rule tests).
    """
    rules = rules_from_config(config, extra_files)
    if store is None:
        store = (
            StateStore.in_state_dir(config.state_dir)
            if durable
            else StateStore(":memory:", boot_id=SIMULATE_BOOT_ID)
        )
    engine = Engine(rules, store, clock, catalog=config.xid.catalog(), ignore=config.gpus.ignore)
    return RulesStage(config, engine, extra_files)
