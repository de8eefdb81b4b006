"""The rule engine as the daemon and simulate wire it: rules from the config, a state
store, and reload.

``rules_stage(settings, clock, durable=True)`` is what ``gpuwatchd run`` puts in its
pipeline (state in ``state_dir``); ``durable=False`` is simulate's (state in memory). It is
built from ``RulesSettings`` (the ``rules`` and ``xid`` sections and the facts the rules
read), never from the whole config.

The stage owns the ``rules`` and ``xid`` sections at a reload (SIGHUP): ``prepare`` loads
and fully validates the new rules (the rule files are read again even when the sections
did not change); on any error the running rules stay, the reload is refused with the
problems as ``PATH:LINE:COL: message`` and ``gpuwatchd_rules_reload_success`` drops to 0
until a reload succeeds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuwatchd.config.stages import RulesSettings
from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.eventlog import log_transitions
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DeviceEvent, DrainOutcome, GpuSample, XidEvent
from gpuwatchd.core.reloading import Prepared
from gpuwatchd.rules.engine import Engine
from gpuwatchd.rules.loader import rules_from_settings
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.rules.store import StateStore

log = logging.getLogger(__name__)

SIMULATE_BOOT_ID = "simulate"


class RulesStage:
    """A pipeline ``Stage`` around the ``Engine`` that knows where its rules come from."""

    sections = ("rules", "xid")

    def __init__(
        self, settings: RulesSettings, engine: Engine, extra_files: Iterable[str] = ()
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.extra_files = tuple(extra_files)
        # the Stage's observe is the engine's own (no relay in between)
        self.observe: Callable[[GpuSample | DeviceEvent | XidEvent | DrainOutcome], None] = (
            engine.observe
        )
        self._urgent_fields, self._urgent_links = engine.urgent_inputs(self.period)

    @property
    def period(self) -> float:
        """Seconds between evaluations when nothing urgent arrives (``rules.evaluation_
        interval``; the poll interval when that is longer), or 0 (every poll) while an
        XID or SXid alert is pending or firing: its end is a matter of time, and the next
        event pages anew only once it ended."""
        return 0.0 if self.engine.hurry else self.settings.rules.evaluation_interval

    def urgent_sample(self, previous: GpuSample, sample: GpuSample) -> bool:
        """Whether a GPU's new sample must be judged now rather than at the next periodic
        evaluation: its status changed, a counter a rule keeps moved, a field read by a
        rule with a ``for`` shorter than the period changed, or (with link rules) a link
        sample changed. Called on the source's thread: reads only what a reload swaps
        whole."""
        if previous.status is not sample.status:
            return True
        old, new = previous.fields, sample.fields
        if old is not new:
            for name in self._urgent_fields:
                a, b = old.get(name), new.get(name)
                if a != b and (a == a or b == b):  # NaN to NaN is no change
                    return True
        return (
            self._urgent_links
            and previous.links is not sample.links
            and previous.links != sample.links
        )

    # -- Stage ----------------------------------------------------------------------------
    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        transitions = self.engine.evaluate(now, view)
        log_transitions(transitions)  # every fire and resolve at info level
        return transitions

    def families(self, view: NodeView, fams: Families) -> None:
        self.engine.families(view, fams)

    def close(self) -> None:
        self.engine.close()

    # -- reload ---------------------------------------------------------------------------
    def load(self, settings: RulesSettings) -> RuleSet:
        return rules_from_settings(settings, self.extra_files)

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        """The ``rules`` and ``xid`` sections at a reload: validate the new rules now
        (raising ``ConfigError``, which keeps the old rules), swap them in when every owner
        has agreed. The extra NVML fields stay the running ones (the backend polls them
        from start-up), so a rule on a field added by the reload is refused until a
        restart."""
        settings = dataclasses.replace(
            self.settings,
            rules=new.get("rules", self.settings.rules),
            xid=new.get("xid", self.settings.xid),
        )
        try:
            rules = self.load(settings)
        except ConfigError:
            self.engine.reload_success = False
            raise

        def commit() -> None:
            self.engine.catalog = settings.xid.catalog()
            self.engine.replace_rules(rules)
            self.engine.reload_success = True
            self.settings = settings
            self._urgent_fields, self._urgent_links = self.engine.urgent_inputs(self.period)
            log.info("loaded %d rule(s) from %d file(s)", len(rules.rules), len(rules.files))

        return Prepared(commit)

    def reload(self, settings: RulesSettings) -> bool:
        """Reload the rules from ``settings`` (its ``rules`` and ``xid``). True on success;
        on failure the old rules stay and the problems are logged."""
        try:
            applied = self.prepare({"rules": settings.rules, "xid": settings.xid}, frozenset())
        except ConfigError as exc:
            for line in exc.lines():
                log.error("%s", line)
            log.error("rule reload failed: keeping the %d running rule(s)", len(self.engine.rules))
            return False
        assert applied.apply is not None
        applied.apply()
        return True


def rules_stage(
    settings: RulesSettings,
    clock: Clock,
    *,
    durable: bool,
    extra_files: Iterable[str] = (),
    store: StateStore | None = None,
) -> RulesStage:
    """The rule engine for a pipeline. Raises ``ConfigError`` when the rules do not load.

    ``durable``: keep alert states and counter history in ``settings.state_dir`` (the
    daemon); otherwise in memory (simulate, rule tests).
    """
    rules = rules_from_settings(settings, extra_files)
    if store is None:
        store = (
            StateStore.in_state_dir(settings.state_dir)
            if durable
            else StateStore(":memory:", boot_id=SIMULATE_BOOT_ID)
        )
    engine = Engine(rules, store, clock, catalog=settings.xid.catalog(), ignore=settings.ignore)
    return RulesStage(settings, engine, extra_files)
