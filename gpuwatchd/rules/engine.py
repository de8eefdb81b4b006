"""The rule engine: records in, alert transitions out. A pipeline ``Stage``.

``observe`` takes every record a source emits (samples, device events, XIDs) and keeps
only what the loaded rules need: the latest sample per GPU and the history of the counters
that windowed rules look at (``CounterBank``), and recent trusted XIDs (the ``Snapshot``'s
``XidLog``). ``evaluate(now, view)`` asks each rule's evaluator (made by its condition
kind, ``rules/conditions/``) where its condition holds, and steps each alert's state
machine (``AlertBook``).

The engine is pure: time comes from ``now`` (the clock only times evaluations for the
duration metric), so simulate and the daemon behave alike. A condition that cannot be
evaluated (the GPU is lost or stale, the field is missing) holds the alert where it is.
State lives in a ``StateStore``: a restart does not re-page a firing alert and does not
forget one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DeviceEvent, DrainOutcome, GpuSample, GpuStatus, XidEvent
from gpuwatchd.rules.alertbook import TRANSITION_STATES, Alert, AlertBook
from gpuwatchd.rules.conditions.base import Evaluator, Trigger
from gpuwatchd.rules.conditions.registry import BY_KEY
from gpuwatchd.rules.counterbank import CounterBank
from gpuwatchd.rules.model import Rule, RuleSet
from gpuwatchd.rules.snapshot import PROCESSES, XID_RETENTION_MIN, Snapshot
from gpuwatchd.rules.store import PERSIST_RESOLUTION, StateStore
from gpuwatchd.xid import catalog as xid_catalog

__all__ = ["Alert", "Engine"]

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 60.0  # seconds of clock time between writes of counter history
TRIM_INTERVAL = 86400.0
PERIODIC = 60.0  # seconds between evaluations of "periodic" rules when nothing moved
ALERT_STATES = ("pending", "firing")
HURRY_TRIGGERS = frozenset({"xid", "sxid"})  # rules whose alerts end on a quiet window


@dataclass
class _Loaded:
    """One loaded rule: its evaluator, what moves it, its fixed template values."""

    rule: Rule
    evaluator: Evaluator
    trigger: Trigger
    fields: frozenset[str] | None  # sample fields whose change also moves it (None: none)
    values: dict[str, Any]
    since_cycle: int  # engine cycles before it was loaded
    fresh: bool = True  # not evaluated since it was loaded
    failures: int = 0


@dataclass
class _Timers:
    """Clock times of the engine's periodic chores (None: not yet)."""

    periodic: float | None = None
    flush: float | None = None
    trim: float | None = None
    last_now: float | None = None


@dataclass
class EngineStats:
    """What the engine counts for its metrics."""

    cycles: int = 0
    last_duration: float = 0.0
    reload_success: bool = True
    xids_ignored: int = 0
    xids_seen: int = 0  # the XidLog's number at the last evaluation
    sxids_seen: int = 0  # the SXid log's
    drains_seen: int = 0  # the drain outcomes' change count
    warned: set[str] = field(default_factory=set)  # rules whose failure was logged


def _moved_by(
    trigger: Trigger, reads: frozenset[str] | None, rule: Rule
) -> tuple[Trigger, frozenset[str] | None]:
    """What makes a rule run again: its kind's trigger, narrowed to "fields" when the kind
    knows which sample fields it reads, and a change of its guard's (``when``) field."""
    fields = reads if trigger == "sample" else None
    if fields is not None:
        trigger = "fields"
    guard = rule.when
    if guard is not None and trigger != "sample":
        fields = (fields or frozenset()) | {guard.field}
    return trigger, fields


class Engine:
    """The rule engine stage (``observe``/``evaluate``/``families``/``close``)."""

    def __init__(
        self,
        rules: RuleSet,
        store: StateStore,
        clock: Clock,
        *,
        catalog: xid_catalog.Catalog | None = None,
        ignore: tuple[str, ...] = (),
    ) -> None:
        self.store = store
        self.clock = clock
        self.ignore = frozenset(i.upper() for i in ignore)  # gpus.ignore: never alerted on
        self._catalog = catalog or xid_catalog.Catalog.default()
        self.stats = EngineStats()
        self._lock = threading.RLock()
        self._loaded: dict[str, _Loaded] = {}  # by rule name, in load order
        self._bank = CounterBank(store)
        self._snap = Snapshot(
            self._catalog, self._bank.touched, self._bank.meta, self._bank.changed
        )
        self._book = AlertBook(store)
        self._timers = _Timers()
        self.hurry = False  # an event rule's alert is active: evaluate at every poll
        self.replace_rules(rules)

    # -- rules ------------------------------------------------------------------------
    @property
    def catalog(self) -> xid_catalog.Catalog:
        """The XID catalog (config overrides applied) the rules' templates read."""
        return self._catalog

    @catalog.setter
    def catalog(self, catalog: xid_catalog.Catalog) -> None:
        with self._lock:  # the evaluators read it from the snapshot: both change together
            self._catalog = catalog
            self._snap.catalog = catalog

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(x.rule for x in self._loaded.values())

    @property
    def reload_success(self) -> bool:
        return self.stats.reload_success

    @reload_success.setter
    def reload_success(self, ok: bool) -> None:
        self.stats.reload_success = ok

    @property
    def xids_ignored(self) -> int:
        return self.stats.xids_ignored

    def replace_rules(self, new: RuleSet) -> None:
        """Swap in a new rule set. Alerts of rules that still exist (by name) keep their
        state; firing alerts of rules that are gone are resolved at the next evaluation."""
        with self._lock:
            names = {r.name for r in new.rules}
            old = self._loaded
            now = self._timers.last_now
            if now is None:
                now = self.clock.now()
            for name in [n for n in self._book.alerts if n not in names]:
                gone = old.get(name)
                self._book.retire(name, gone.rule if gone is not None else None, now)
            gpu_fields: set[str] = set()
            link_fields: set[str] = set()
            xid_window = XID_RETENTION_MIN
            loaded: dict[str, _Loaded] = {}
            for rule in new.rules:
                kind = BY_KEY[rule.kind]
                c = rule.condition
                needs = kind.needs(c)
                gpu_fields |= needs.gpu_counters
                link_fields |= needs.link_counters
                xid_window = max(xid_window, needs.xid_window)
                evaluator = kind.evaluator(rule, self._snap)
                before = old.get(rule.name)
                if before is not None:
                    evaluator.adopt(before.evaluator)
                trigger, fields = _moved_by(kind.trigger(c), kind.reads(c), rule)
                loaded[rule.name] = _Loaded(
                    rule=rule,
                    evaluator=evaluator,
                    trigger=trigger,
                    fields=fields,
                    values={"rule": rule.name, **kind.values(c)},
                    since_cycle=before.since_cycle if before is not None else self.stats.cycles,
                    failures=before.failures if before is not None else 0,
                )
            self._loaded = loaded
            self._bank.watch(gpu_fields, link_fields, any(r.per_link for r in new.rules))
            self._snap.xids.retention = xid_window
            self._snap.sxids.retention = xid_window
            self._book.adopt(new.rules)

    def urgent_inputs(self, period: float) -> tuple[frozenset[str], bool]:
        """What in a new sample must be judged before the next periodic evaluation,
        ``period`` seconds apart: the counters a rule keeps history of, the fields read by
        rules that would fire or resolve sooner than a period (``for`` shorter than it),
        and (the bool) the NVLink link samples when a link rule exists."""
        with self._lock:
            fields: set[str] = set(self._bank.gpu_fields)
            links = bool(self._bank.link_fields)
            for x in self._loaded.values():
                if x.trigger == "links":
                    links = True
                elif x.trigger == "fields" and x.fields is not None and x.rule.for_ < period:
                    fields |= x.fields
            fields.discard(PROCESSES)
            return frozenset(fields), links

    # -- observe ------------------------------------------------------------------------
    def observe(self, record: GpuSample | DeviceEvent | XidEvent | DrainOutcome) -> None:
        if isinstance(record, GpuSample):
            if record.status is GpuStatus.OK:
                with self._lock:
                    self._bank.observe(record)
        elif isinstance(record, DrainOutcome):
            with self._lock:
                self._snap.drains.observe(record)
        elif isinstance(record, XidEvent):
            if record.trusted and record.kind == "sxid":
                with self._lock:
                    self._snap.sxids.add(record)  # the sxid condition's, not the XID rules'
                return
            if (
                not record.trusted
                or (record.pci_bus_id or "").upper() in self.ignore
                or (record.uuid or "").upper() in self.ignore
            ):
                self.stats.xids_ignored += 1
                return
            with self._lock:
                if record.enriches:
                    self._snap.xids.enrich(record)
                else:
                    self._snap.xids.add(record)

    # -- evaluate -----------------------------------------------------------------------
    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        with self._lock:
            started = self.clock.monotonic()
            snap = self._snap
            snap.sync(view, self._bank.data_of)
            if self._bank.links_moved:
                snap.links_moved = True
                self._bank.links_moved = False
            timers = self._timers
            timers.last_now = now
            book = self._book
            out: list[AlertTransition] = book.queued
            book.queued = []
            # What can have changed since the last evaluation. A rule whose inputs did not
            # change and that has no pending or firing alert keeps its answer (none), so
            # it is not evaluated again: a quiet node costs little per poll.
            periodic = timers.periodic is None or now - timers.periodic >= PERIODIC
            if periodic:
                timers.periodic = now
            touched = bool(snap.touched)
            status = snap.status_moved
            moved: dict[Trigger, bool] = {
                "sample": True,
                "fields": status,
                "counter": touched,
                "periodic": touched or periodic,
                "xid": snap.xids.seq != self.stats.xids_seen,
                "sxid": snap.sxids.seq != self.stats.sxids_seen,
                "drain": snap.drains.seq != self.stats.drains_seen,
                "status": status,
                "links": snap.links_moved or status,
            }
            self.stats.xids_seen = snap.xids.seq
            self.stats.sxids_seen = snap.sxids.seq
            self.stats.drains_seen = snap.drains.seq
            changed = snap.changed
            active = book.active
            for name, x in self._loaded.items():
                is_active = bool(active[name])
                if (
                    not moved[x.trigger]
                    and not is_active
                    and not x.fresh
                    and (x.fields is None or (not status and changed.isdisjoint(x.fields)))
                ):
                    continue
                try:
                    if x.fresh:
                        x.evaluator.restore(self.store, snap, now)
                    hits, unknown = x.evaluator.evaluate(snap, now, is_active, x.fresh)
                    if hits or active[name]:
                        book.step(x.rule, x.values, snap, hits, unknown, now, out)
                except Exception:
                    x.failures += 1
                    if name not in self.stats.warned:
                        self.stats.warned.add(name)
                        log.exception("rule %s failed to evaluate", name)
                x.fresh = False
            snap.settled(now)
            # An alert of an event rule (XID, SXid) resolves when its quiet window ends and
            # a new event then pages anew: while one is pending or firing, the evaluator
            # keeps the poll's pace so that resolve is not held back by the period.
            self.hurry = any(
                active[name] and x.trigger in HURRY_TRIGGERS for name, x in self._loaded.items()
            )
            self._persist(now)
            self.stats.cycles += 1
            self.stats.last_duration = max(self.clock.monotonic() - started, 0.0)
            return out

    def _persist(self, now: float) -> None:
        timers = self._timers
        if timers.flush is None:
            timers.flush = now
        elif now - timers.flush >= FLUSH_INTERVAL:
            timers.flush = now
            self._bank.flush(now)
            self._save_evaluators(now)
            self._book.touch_active()
            if timers.trim is None or now - timers.trim >= TRIM_INTERVAL:
                timers.trim = now
                self.store.trim(now)
        self._book.save(now)

    def _save_evaluators(self, now: float) -> None:
        for name, x in self._loaded.items():
            try:
                x.evaluator.save(self.store, now)
            except Exception:
                x.failures += 1
                if name not in self.stats.warned:
                    self.stats.warned.add(name)
                    log.exception("rule %s failed to save its state", name)

    # -- reading the state ----------------------------------------------------------------
    def evaluations(self, rule: str) -> int:
        """How many times the rule was evaluated (every cycle since it was loaded)."""
        x = self._loaded.get(rule)
        return 0 if x is None else self.stats.cycles - x.since_cycle

    def alerts(self, state: AlertState | None = None) -> list[Alert]:
        """Alerts (optionally in one state), sorted by rule and labels."""
        with self._lock:
            found = [
                a
                for table in self._book.alerts.values()
                for a in table.values()
                if (state is None and a.state is not AlertState.INACTIVE) or a.state is state
            ]
        return sorted(found, key=lambda a: (a.rule, sorted(a.labels.items())))

    def current(self, rule: str, fingerprint: str) -> tuple[Mapping[str, str], float | None] | None:
        """A firing alert's annotations and value as the last evaluation rendered them
        (None when it is not firing): what a repeat or a later message says."""
        with self._lock:
            a = self._book.alerts.get(rule, {}).get(fingerprint)
            if a is None or a.state is not AlertState.FIRING:
                return None
            return a.annotations, a.value

    def history(self, rule: str, fingerprint: str, days: int = 14) -> dict[str, Any] | None:
        """What a firing memory-trend or XID-recurrence alert judged, per day: the daily
        increase of the rule's counter on the GPU (memory_trend) or the day's count of the
        XID codes the rule watches on it (xid_recurrence), for the last ``days`` days up
        to the last evaluation, and when it fired. None for other alerts."""
        with self._lock:
            x = self._loaded.get(rule)
            a = self._book.alerts.get(rule, {}).get(fingerprint)
            now = self._timers.last_now
            if x is None or a is None or a.state is not AlertState.FIRING or now is None:
                return None
            uuid = a.labels.get("uuid", "")
            starts = [now - (days - i) * 86400.0 for i in range(days)]
            c = x.rule.condition
            if x.rule.kind == "memory_trend":
                field_name = str(getattr(c, "field", ""))
                data = self._bank.gpus.get(uuid)
                h = data.hist.get(field_name) if data is not None else None
                if h is None:
                    return None
                per_day = [max(h.increase(t, t + 86400.0), 0.0) for t in starts]
                what = field_name
            elif x.rule.kind == "xid_recurrence":
                codes = frozenset(getattr(c, "codes", ()) or ())
                pci = a.labels.get("pci_bus_id", "").upper()
                per_day = [0.0] * days
                for ev in self._snap.xids.newest_first(0):
                    if (ev.pci_bus_id or "").upper() != pci or (codes and ev.xid not in codes):
                        continue
                    i = int((ev.timestamp - starts[0]) // 86400.0)
                    if 0 <= i < days:
                        per_day[i] += 1.0
                what = "XID " + "/".join(str(n) for n in sorted(codes)) if codes else "XIDs"
            else:
                return None
            return {
                "what": what,
                "day_starts": starts,
                "per_day": per_day,
                "fired_at": a.fired_at,
                "now": now,
            }

    # -- metrics ------------------------------------------------------------------------
    def families(self, view: NodeView, fams: Families) -> None:
        with self._lock:
            rules = self.rules
            fams.get(
                "gpuwatchd_rules_loaded", "gauge", "Alert rules loaded and evaluated.", []
            ).add([], float(len(rules)))
            fams.get(
                "gpuwatchd_rules_reload_success",
                "gauge",
                "1 when the last load of the rule files succeeded; 0 while a failed reload "
                "left the previous rules running.",
                [],
            ).add([], 1.0 if self.stats.reload_success else 0.0)
            fams.get(
                "gpuwatchd_rule_evaluation_duration_seconds",
                "gauge",
                "How long the last evaluation of all rules took.",
                [],
            ).add([], self.stats.last_duration)
            evals = fams.get(
                "gpuwatchd_rule_evaluations_total",
                "counter",
                "Evaluation cycles since each rule was loaded (a rule whose inputs did not move "
                "is skipped in a cycle).",
                ["rule"],
            )
            fails = fams.get(
                "gpuwatchd_rule_evaluation_failures_total",
                "counter",
                "Evaluations of each rule that failed with an internal error.",
                ["rule"],
            )
            alerts_f = fams.get(
                "gpuwatchd_alerts",
                "gauge",
                "Alerts by rule, severity and state (pending or firing).",
                ["rule", "severity", "state"],
            )
            trans = fams.get(
                "gpuwatchd_alert_transitions_total",
                "counter",
                "Alert state changes by rule and new state (pending, firing, resolved).",
                ["rule", "state"],
            )
            counts: dict[tuple[str, str, str], int] = {}
            for rule in rules:
                sevs = {rule.severity.value}
                if rule.escalate is not None:
                    sevs.add(rule.escalate.severity.value)
                for sev in sorted(sevs, key=lambda s: -AlertSeverity(s).rank):
                    for st in ALERT_STATES:
                        counts[(rule.name, sev, st)] = 0
                for a in self._book.alerts.get(rule.name, {}).values():
                    if a.state is AlertState.PENDING or a.state is AlertState.FIRING:
                        k = (rule.name, a.severity.value, a.state.value)
                        counts[k] = counts.get(k, 0) + 1
            transitions = self._book.transitions
            for rule in rules:
                evals.add([rule.name], float(self.evaluations(rule.name)))
                fails.add([rule.name], float(self._loaded[rule.name].failures))
                for st in TRANSITION_STATES:
                    trans.add([rule.name, st], float(transitions.get((rule.name, st), 0)))
            for (name, sev, st), n in counts.items():
                alerts_f.add([name, sev, st], float(n))
            pci = view.pci_gpus
            if pci is not None:
                fams.get(
                    "gpuwatchd_pci_gpus",
                    "gauge",
                    "NVIDIA GPUs (display or 3D controllers) on the PCI bus (udev or sysfs).",
                    [],
                ).add([], float(pci))

    def close(self) -> None:
        """Write everything not yet written (all counter points) and close the store."""
        with self._lock:
            now = self._timers.last_now
            if now is not None:
                self._bank.flush(now + PERSIST_RESOLUTION)
                self._save_evaluators(now)
                self._book.touch_all_active()
                self._book.save(now)
            self.store.close()
