"""The rule engine: records in, alert transitions out. A pipeline ``Stage``.

``observe`` takes every record a source emits (samples, device events, XIDs) and keeps
only what the loaded rules need: the latest sample per GPU, the history of counters that
windowed rules look at, and recent XIDs. ``evaluate(now, view)`` applies every rule to
every series (a GPU, an NVLink link, an XID code on a GPU, or the node) and steps each
alert's state machine:

    inactive --condition--> pending --held for `for`--> firing --condition gone for
    `keep_firing_for` (xid: `quiet`)--> resolved (inactive again)

One alert exists per rule and series; each transition carries a per-alert sequence
number. The engine is pure: time comes from ``now`` (the clock only times evaluations for
the duration metric), so simulate and the daemon behave alike. A condition that cannot be
evaluated (the GPU is lost or stale, the field is missing) holds the alert where it is.
State lives in a ``StateStore``: a restart does not re-page a firing alert and does not
forget one.
"""

from __future__ import annotations

import logging
import math
import operator
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition, fingerprint
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.fields import decode_clock_event_reasons
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DeviceEvent, GpuInfo, GpuSample, GpuStatus, LinkSample, XidEvent
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.model import (
    Count,
    GpuCount,
    GpuStatusIs,
    Guard,
    Increase,
    PcieDowntrained,
    PeerOutlier,
    Rate,
    Rule,
    RuleSet,
    Selector,
    StuckWorkload,
    Threshold,
    Throttle,
    Trend,
    XidMatch,
    rises_only,
)
from gpuwatchd.rules.store import PERSIST_RESOLUTION, AlertRecord, CounterRecord, StateStore
from gpuwatchd.xid import catalog as xid_catalog

log = logging.getLogger(__name__)

Key = tuple[int, int, int]  # (GPU index or -1, link or -1, XID or -1)
NODE_KEY: Key = (-1, -1, -1)
Hit = tuple[float, dict[str, Any] | None]
Hits = dict[Key, Hit]

FLUSH_INTERVAL = 60.0  # seconds of clock time between writes of counter history
TRIM_INTERVAL = 86400.0
TREND_RECHECK = 300.0
XID_RETENTION_MIN = 3600.0
ALERT_STATES = ("pending", "firing")
TRANSITION_STATES = ("pending", "firing", "resolved")

_OPS: Mapping[str, Callable[[float, float], bool]] = MappingProxyType(
    {
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
        "==": operator.eq,
        "!=": operator.ne,
    }
)
_NO_HITS: Hits = {}


@dataclass(slots=True)
class Alert:
    """One rule applied to one series."""

    rule: str
    fingerprint: str
    labels: Mapping[str, str]
    key: Key | None
    state: AlertState = AlertState.INACTIVE
    active_since: float = 0.0
    last_true: float = 0.0
    fired_at: float | None = None
    sequence: int = 0
    value: float | None = None
    extra: dict[str, Any] | None = None
    severity: AlertSeverity = AlertSeverity.INFO
    escalated: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)
    boot_id: str = ""
    saved_last_true: float = 0.0

    def record(self) -> AlertRecord:
        return AlertRecord(
            fingerprint=self.fingerprint,
            rule=self.rule,
            labels=self.labels,
            state=self.state.value,
            severity=self.severity.value,
            active_since=self.active_since,
            last_true=self.last_true,
            fired_at=self.fired_at,
            sequence=self.sequence,
            value=self.value,
            annotations=self.annotations,
            boot_id=self.boot_id,
            escalated=self.escalated,
        )


class _GpuData:
    """What the engine keeps of one GPU (by UUID, so it survives index changes)."""

    __slots__ = ("hist", "index", "link_hist", "links", "sample", "uuid")

    def __init__(self, uuid: str, index: int) -> None:
        self.uuid = uuid
        self.index = index
        self.sample: GpuSample | None = None
        self.hist: dict[str, CounterHistory] = {}
        self.link_hist: dict[str, dict[int, CounterHistory]] = {}
        self.links: tuple[LinkSample, ...] | None = None


class _G:
    """One GPU as seen by one evaluation."""

    __slots__ = ("data", "index", "info", "sample", "status")

    def __init__(self, info: GpuInfo, status: GpuStatus, data: _GpuData) -> None:
        self.index = info.index
        self.info = info
        self.status = status
        self.data = data
        ok = status is GpuStatus.OK
        self.sample = data.sample if ok else None


@dataclass(frozen=True, slots=True)
class _Xid:
    seq: int
    event: XidEvent


def _median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0


def _selected(sel: Selector, info: GpuInfo) -> bool:
    if sel.models and info.name not in sel.models:
        return False
    return not sel.gpus or info.uuid.upper() in sel.gpus or info.pci_bus_id.upper() in sel.gpus


def _series_key(uuid: str, field_name: str, link: int = -1) -> str:
    return f"{uuid}|{field_name}" if link < 0 else f"{uuid}|{link}|{field_name}"


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
        self.ignore = frozenset(i.upper() for i in ignore)  # gpus.ignore: never alerted on
        self.clock = clock
        self.catalog = catalog or xid_catalog.Catalog.default()
        self._lock = threading.RLock()
        self._rules: tuple[Rule, ...] = ()
        self._gpus: dict[str, _GpuData] = {}
        self._cur: list[_G] = []
        self._by_index: dict[int, _G] = {}
        self._by_uuid_index: dict[str, int] = {}
        self._pci_index: dict[str, int] = {}
        self._node = ""
        self._view: NodeView | None = None
        self._gpu_fields: tuple[str, ...] = ()
        self._link_fields: tuple[str, ...] = ()
        self._xids: deque[_Xid] = deque()
        self._xid_seq = 0
        self._xid_cursor: dict[str, int] = {}
        self._xid_retention = XID_RETENTION_MIN
        self._alerts: dict[str, dict[str, Alert]] = {}
        self._active: dict[str, dict[str, None]] = {}  # insertion-ordered sets
        self._idents: dict[tuple[str, Key, str], tuple[str, Mapping[str, str]]] = {}
        self._wcache: dict[str, dict[CounterHistory, tuple[int, float]]] = {}
        self._static: dict[str, dict[str, Any]] = {}
        self._dirty: dict[str, Alert] = {}
        self._queued: list[AlertTransition] = []
        self._restore: dict[str, CounterRecord] = {}
        self._persisted: dict[CounterHistory, tuple[str, int, float]] = {}
        self._meta: dict[CounterHistory, tuple[str, str, int]] = {}  # uuid, field, link
        self._touched: set[CounterHistory] = set()  # changed since the last evaluation
        self._unflushed: set[CounterHistory] = set()  # changed since the last flush
        self._true: dict[str, dict[CounterHistory, None]] = {}  # windowed rules: true series
        self._full_pass: set[str] = set()  # rules that must look at every series once
        self._link_cache: dict[str, dict[str, tuple[object, list[tuple[Key, Hit]]]]] = {}
        self._watch_links = False
        self._links_moved = True  # a GPU's link samples changed since the last evaluation
        self._statuses: tuple[GpuStatus, ...] = ()
        self._status_moved = True  # a GPU's status changed since the last evaluation
        self._rechecked: dict[str, float] = {}
        self._trigger: dict[str, str] = {}  # rule -> what must move for it to be evaluated
        self._last_periodic: float | None = None
        self._xid_seen = 0
        self._guards: dict[Guard, tuple[set[int], set[int]]] = {}  # per evaluation
        self._cycle_of: dict[str, int] = {}  # rule -> cycles before it was loaded
        self._last_flush: float | None = None
        self._last_trim: float | None = None
        self._last_now: float | None = None
        self._warned: set[str] = set()
        # metrics
        self.failures: dict[str, int] = {}
        self.transitions: dict[tuple[str, str], int] = {}
        self.cycles = 0
        self.last_duration = 0.0
        self.reload_success = True
        self.xids_ignored = 0
        self._load_state()
        self.replace_rules(rules)

    # -- rules ------------------------------------------------------------------------
    @property
    def rules(self) -> tuple[Rule, ...]:
        return self._rules

    def replace_rules(self, new: RuleSet) -> None:
        """Swap in a new rule set. Alerts of rules that still exist (by name) keep their
        state; firing alerts of rules that are gone are resolved at the next evaluation."""
        with self._lock:
            names = {r.name for r in new.rules}
            old = {r.name: r for r in self._rules}
            now = self._last_now if self._last_now is not None else self.clock.now()
            for name in [n for n in self._alerts if n not in names]:
                for alert in self._alerts.pop(name).values():
                    if alert.state is AlertState.FIRING:
                        self._queued.append(
                            self._transition(
                                old.get(name),
                                alert,
                                AlertState.RESOLVED,
                                now,
                                note="the rule was removed or disabled",
                            )
                        )
                    alert.state = AlertState.INACTIVE
                    self._dirty[alert.fingerprint] = alert
                self._active.pop(name, None)
            for name in [n for n in self.failures if n not in names]:
                del self.failures[name]
            for name in [n for n in self._cycle_of if n not in names]:
                del self._cycle_of[name]
            for key in [k for k in self.transitions if k[0] not in names]:
                del self.transitions[key]
            self._rules = new.rules
            gpu_fields: set[str] = set()
            link_fields: set[str] = set()
            xid_window = XID_RETENTION_MIN
            for rule in new.rules:
                self._cycle_of.setdefault(rule.name, self.cycles)
                self.failures.setdefault(rule.name, 0)
                for state in TRANSITION_STATES:
                    self.transitions.setdefault((rule.name, state), 0)
                self._alerts.setdefault(rule.name, {})
                self._active.setdefault(rule.name, {})
                c = rule.condition
                if isinstance(c, Increase | Rate | Count | Trend):
                    (link_fields if c.link else gpu_fields).add(c.field)
                elif isinstance(c, PeerOutlier) and c.window is not None:
                    gpu_fields.add(c.field)
                elif isinstance(c, XidMatch):
                    xid_window = max(xid_window, c.window)
                    self._xid_cursor.setdefault(rule.name, self._xid_seq)
                self._static[rule.name] = self._static_values(rule)
                self._trigger[rule.name] = self._trigger_of(rule)
            self._gpu_fields = tuple(sorted(gpu_fields))
            self._link_fields = tuple(sorted(link_fields))
            self._watch_links = bool(link_fields) or any(r.per_link for r in new.rules)
            self._full_pass = {r.name for r in new.rules}
            self._true = {r.name: {} for r in new.rules}
            self._link_cache.clear()
            self._xid_retention = xid_window
            self._wcache.clear()
            self._idents.clear()
            # re-attach restored alerts to their rules
            for alerts in self._alerts.values():
                for alert in alerts.values():
                    if alert.state is not AlertState.INACTIVE:
                        self._active.setdefault(alert.rule, {})[alert.fingerprint] = None

    @staticmethod
    def _trigger_of(rule: Rule) -> str:
        """Which change can alter the rule's answer (see ``evaluate``)."""
        c = rule.condition
        if rule.when is not None:
            return "sample"
        if isinstance(c, Increase | Rate | Count):
            return "counter" if rises_only(c.op) else "sample"
        if isinstance(c, Trend) or (isinstance(c, PeerOutlier) and c.window is not None):
            return "periodic"
        if isinstance(c, XidMatch):
            return "xid"
        if isinstance(c, GpuStatusIs):
            return "status"
        if isinstance(c, Threshold) and c.link:
            return "links"
        return "sample"

    @staticmethod
    def _static_values(rule: Rule) -> dict[str, Any]:
        c = rule.condition
        out: dict[str, Any] = {"rule": rule.name}
        if hasattr(c, "field"):
            out["field"] = c.field
        window = getattr(c, "window", None)
        if window is not None:
            out["window"] = format_duration(window)
        if isinstance(c, Threshold | Increase | Rate | Count):
            out["threshold"] = c.value
        return out

    # -- durable state ------------------------------------------------------------------
    def _load_state(self) -> None:
        self._restore = self.store.load_counters()
        for rec in self.store.load_alerts():
            try:
                state = AlertState(rec.state)
                severity = AlertSeverity(rec.severity)
            except ValueError:
                continue
            alert = Alert(
                rule=rec.rule,
                fingerprint=rec.fingerprint,
                labels=MappingProxyType(dict(rec.labels)),
                key=None,
                state=state,
                active_since=rec.active_since,
                last_true=rec.last_true,
                fired_at=rec.fired_at,
                sequence=rec.sequence,
                value=rec.value,
                severity=severity,
                escalated=rec.escalated,
                annotations=MappingProxyType(dict(rec.annotations)),
                boot_id=rec.boot_id,
                saved_last_true=rec.last_true,
            )
            self._alerts.setdefault(rec.rule, {})[rec.fingerprint] = alert
        restored = sum(
            1 for a in self._alerts.values() for x in a.values() if x.state is AlertState.FIRING
        )
        if restored:
            log.info("restored %d firing alert(s) from %s", restored, self.store.path)

    def _history(self, g: _GpuData, name: str, link: int = -1) -> CounterHistory:
        h = CounterHistory()
        key = _series_key(g.uuid, name, link)
        rec = self._restore.pop(key, None)
        persisted_t = -math.inf
        if rec is not None:
            points = list(rec.points)
            if rec.last_raw is not None and rec.last_t is not None:
                current = rec.last_raw + rec.offset
                if not points or (points[-1][1] != current and rec.last_t > points[-1][0]):
                    points.append((rec.last_t, current))
            h.restore(points, rec.last_raw, rec.offset, rec.last_t)
            if points:
                persisted_t = points[-1][0]
        self._persisted[h] = (key, h.version, persisted_t)
        self._meta[h] = (g.uuid, name, link)
        self._touched.add(h)
        if link < 0:
            g.hist[name] = h
        else:
            g.link_hist.setdefault(name, {})[link] = h
        return h

    def _flush(self, now: float) -> None:
        """Write new counter points (one per 5-minute bucket) and reset bookkeeping."""
        batch: dict[str, CounterRecord] = {}
        cutoff = math.floor(now / PERSIST_RESOLUTION) * PERSIST_RESOLUTION
        changed, self._unflushed = self._unflushed, set()
        persisted = {}
        for h in changed:
            key, version, persisted_t = self._persisted[h]
            if h.version == version:
                continue
            new = [p for p in h.points_between(persisted_t, cutoff - 1e-9)]
            points: list[tuple[float, float]] = []
            for t, v in new:
                bucket = math.floor(t / PERSIST_RESOLUTION)
                if points and math.floor(points[-1][0] / PERSIST_RESOLUTION) == bucket:
                    points[-1] = (t, v)
                else:
                    points.append((t, v))
            batch[key] = CounterRecord(h.last_raw, h.offset, h.last_t, points)
            last_t = points[-1][0] if points else persisted_t
            persisted[h] = (key, h.version, last_t)
        if batch and not self.store.save_counters(batch, now):
            self._unflushed |= changed  # the disk failed: write these with the next flush
            return
        self._persisted.update(persisted)

    def _save_alerts(self, now: float) -> None:
        if self._dirty:
            if not self.store.save_alerts([a.record() for a in self._dirty.values()], now):
                return  # the disk failed: they stay dirty and go with the next save
            for a in self._dirty.values():
                a.saved_last_true = a.last_true
            self._dirty.clear()

    # -- observe ------------------------------------------------------------------------
    def observe(self, record: GpuSample | DeviceEvent | XidEvent) -> None:
        if isinstance(record, GpuSample):
            self._observe_sample(record)
        elif isinstance(record, XidEvent):
            if (
                not record.trusted
                or record.kind == "sxid"
                or (record.pci_bus_id or "").upper() in self.ignore
                or (record.uuid or "").upper() in self.ignore
            ):
                self.xids_ignored += 1
                return
            with self._lock:
                if record.enriches:
                    self._enrich(record)
                    return
                self._xid_seq += 1
                self._xids.append(_Xid(self._xid_seq, record))

    def _enrich(self, record: XidEvent) -> None:
        """The partner report of an XID already counted: its details replace the first
        report's in place (same incident, no new count). Called with the lock held."""
        for i in range(len(self._xids) - 1, -1, -1):
            held = self._xids[i].event
            if (
                held.xid == record.xid
                and (held.pci_bus_id or "").upper() == (record.pci_bus_id or "").upper()
            ):
                self._xids[i] = _Xid(self._xids[i].seq, record)
                return

    def _observe_sample(self, s: GpuSample) -> None:
        if s.status is not GpuStatus.OK:
            return
        with self._lock:
            g = self._gpus.get(s.uuid)
            if g is None:
                g = self._gpus[s.uuid] = _GpuData(s.uuid, s.gpu)
            g.index = s.gpu
            g.sample = s
            t = s.timestamp
            if self._gpu_fields:
                fields = s.fields
                hist = g.hist
                for name in self._gpu_fields:
                    v = fields.get(name)
                    if v is not None:
                        h = hist.get(name)
                        if h is None:
                            h = self._history(g, name)
                        if h.add(t, v):
                            self._touched.add(h)
                            self._unflushed.add(h)
            if self._watch_links:
                links = s.links
                if links is g.links or links == g.links:
                    return  # unchanged: no counter moved (and cached link results hold)
                g.links = links
                self._links_moved = True
                for name in self._link_fields:
                    table = g.link_hist.get(name)
                    for ls in links:
                        v = ls.fields.get(name)
                        if v is None:
                            continue
                        h = table.get(ls.link) if table is not None else None
                        if h is None:
                            h = self._history(g, name, ls.link)
                            table = g.link_hist[name]
                        if h.add(t, v):
                            self._touched.add(h)
                            self._unflushed.add(h)

    # -- evaluate -----------------------------------------------------------------------
    def _sync(self, view: NodeView) -> None:
        self._view = view
        self._node = view.node_name
        cur = self._cur
        gpus = view.gpus
        if len(cur) != len(gpus) or any(
            g.info is not gs.info for g, gs in zip(cur, gpus, strict=True)
        ):
            cur = []
            for gs in gpus:
                info = gs.info
                data = self._gpus.get(info.uuid)
                if data is None:
                    data = self._gpus[info.uuid] = _GpuData(info.uuid, info.index)
                cur.append(_G(info, gs.status, data))
            self._cur = cur
            self._by_index = {g.index: g for g in cur}
            self._by_uuid_index = {g.info.uuid: g.index for g in cur}
            self._pci_index = {g.info.pci_bus_id.upper(): g.index for g in cur}
            self._statuses = tuple(gs.status for gs in gpus)
            self._status_moved = True
            return
        ok = GpuStatus.OK
        for g, gs in zip(cur, gpus, strict=True):
            status = gs.status
            g.status = status
            g.sample = g.data.sample if status is ok else None
        statuses = tuple(gs.status for gs in gpus)
        if statuses != self._statuses:
            self._statuses = statuses
            self._status_moved = True

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        with self._lock:
            started = self.clock.monotonic()
            self._sync(view)
            self._last_now = now
            out: list[AlertTransition] = self._queued
            self._queued = []
            conditions = self._conditions
            active = self._active
            full = self._full_pass
            self._guards.clear()
            # What can have changed since the last evaluation. A rule whose inputs did not
            # change and that has no pending or firing alert keeps its answer (none), so
            # it is not evaluated again: a quiet node costs little per poll.
            periodic = self._last_periodic is None or now - self._last_periodic >= 60.0
            if periodic:
                self._last_periodic = now
            moved = {
                "sample": True,
                "counter": bool(self._touched),
                "periodic": bool(self._touched) or periodic,
                "xid": self._xid_seq != self._xid_seen,
                "status": self._status_moved,
                "links": self._links_moved or self._status_moved,
            }
            self._xid_seen = self._xid_seq
            trigger = self._trigger
            for rule in self._rules:
                name = rule.name
                if not moved[trigger[name]] and not active[name] and name not in full:
                    continue
                try:
                    hits, unknown = conditions[rule.kind](self, rule, now)
                    if hits or active[rule.name]:
                        self._step(rule, hits, unknown, now, out)
                except Exception:
                    self.failures[rule.name] = self.failures.get(rule.name, 0) + 1
                    if rule.name not in self._warned:
                        self._warned.add(rule.name)
                        log.exception("rule %s failed to evaluate", rule.name)
            self._touched.clear()
            self._full_pass.clear()
            self._links_moved = False
            self._status_moved = False
            self._trim_xids(now)
            self._persist(now)
            self.cycles += 1
            self.last_duration = max(self.clock.monotonic() - started, 0.0)
            return out

    def _persist(self, now: float) -> None:
        if self._last_flush is None:
            self._last_flush = now
        elif now - self._last_flush >= FLUSH_INTERVAL:
            self._last_flush = now
            self._flush(now)
            for name, fps in self._active.items():
                alerts = self._alerts[name]
                for fp in fps:
                    a = alerts[fp]
                    if a.last_true != a.saved_last_true:
                        self._dirty[fp] = a
            if self._last_trim is None or now - self._last_trim >= TRIM_INTERVAL:
                self._last_trim = now
                self.store.trim(now)
        self._save_alerts(now)

    def _trim_xids(self, now: float) -> None:
        horizon = now - self._xid_retention - 60.0
        xids = self._xids
        while xids and xids[0].event.timestamp < horizon:
            xids.popleft()

    # -- the state machine ----------------------------------------------------------------
    def _identity(self, rule: Rule, key: Key) -> tuple[str, Mapping[str, str]]:
        g = self._by_index.get(key[0]) if key[0] >= 0 else None
        uuid = g.info.uuid if g is not None else ""
        cache_key = (rule.name, key, uuid)
        found = self._idents.get(cache_key)
        if found is not None:
            return found
        labels: dict[str, str] = {"node": self._node}
        if g is not None:
            info = g.info
            labels["gpu"] = str(info.index)
            labels["uuid"] = info.uuid
            labels["pci_bus_id"] = info.pci_bus_id
            labels["model"] = info.name
        if key[1] >= 0:
            labels["link"] = str(key[1])
        if key[2] >= 0:
            labels["xid"] = str(key[2])
        labels.update(rule.labels)
        frozen = MappingProxyType(labels)
        found = (fingerprint(rule.name, frozen), frozen)
        self._idents[cache_key] = found
        return found

    def _resolve_key(self, alert: Alert) -> Key | None:
        """The series of an alert restored from the store, in this boot's GPU numbering."""
        labels = alert.labels
        uuid = labels.get("uuid", "")
        index = -1
        if uuid:
            found = self._by_uuid_index.get(uuid)
            if found is None:
                return None  # the GPU is not (yet) present: hold
            index = found
        link = int(labels["link"]) if labels.get("link", "").isdigit() else -1
        xid = int(labels["xid"]) if labels.get("xid", "").isdigit() else -1
        return (index, link, xid)

    def _step(
        self, rule: Rule, hits: Hits, unknown: set[int], now: float, out: list[AlertTransition]
    ) -> None:
        alerts = self._alerts[rule.name]
        active = self._active[rule.name]
        touched: set[str] = set()
        for key, (value, extra) in hits.items():
            fp, labels = self._identity(rule, key)
            alert = alerts.get(fp)
            if alert is None:
                alert = alerts[fp] = Alert(rule.name, fp, labels, key, severity=rule.severity)
            alert.key = key
            touched.add(fp)
            self._on_true(rule, alert, now, value, extra, out)
        if len(active) > len(touched) or not touched.issuperset(active):
            for fp in [f for f in active if f not in touched]:
                alert = alerts[fp]
                if alert.key is None:
                    alert.key = self._resolve_key(alert)
                    if alert.key is None:
                        continue
                index = alert.key[0]
                if index in unknown or (index >= 0 and index not in self._by_index):
                    continue  # cannot tell: hold
                self._on_false(rule, alert, now, out)

    def _on_true(
        self,
        rule: Rule,
        alert: Alert,
        now: float,
        value: float,
        extra: dict[str, Any] | None,
        out: list[AlertTransition],
    ) -> None:
        alert.value = value
        alert.extra = extra
        alert.last_true = now
        state = alert.state
        if state is AlertState.FIRING:
            if alert.boot_id != self.store.boot_id:
                self._survived_reboot(rule, alert, now, out)
            return
        if state is AlertState.INACTIVE:
            alert.active_since = now
            self._active[rule.name][alert.fingerprint] = None
            if rule.for_ > 0:
                alert.state = AlertState.PENDING
                alert.severity = rule.severity
                alert.boot_id = self.store.boot_id
                alert.annotations = self._render(rule, alert)
                out.append(self._transition(rule, alert, AlertState.PENDING, now))
                return
        if now - alert.active_since >= rule.for_:
            self._fire(rule, alert, now, out)

    def _fire(self, rule: Rule, alert: Alert, now: float, out: list[AlertTransition]) -> None:
        alert.state = AlertState.FIRING
        alert.fired_at = now
        alert.escalated = False
        alert.severity = rule.severity
        esc = rule.escalate
        if esc is not None:
            boots = self.store.fault_boots(alert.fingerprint, now - esc.within)
            boots.discard(self.store.boot_id)
            alert.escalated = bool(boots)
        if alert.escalated and esc is not None:
            alert.severity = esc.severity
        alert.boot_id = self.store.boot_id
        alert.annotations = self._render(rule, alert)
        out.append(self._transition(rule, alert, AlertState.FIRING, now))

    def _survived_reboot(
        self, rule: Rule, alert: Alert, now: float, out: list[AlertTransition]
    ) -> None:
        """A firing alert restored from an earlier boot whose condition still holds."""
        esc = rule.escalate
        previous = alert.boot_id
        alert.boot_id = self.store.boot_id
        self._dirty[alert.fingerprint] = alert
        if esc is None or alert.escalated or (previous and now - alert.active_since > esc.within):
            return
        alert.escalated = True
        alert.severity = esc.severity
        alert.annotations = self._render(rule, alert)
        out.append(self._transition(rule, alert, AlertState.FIRING, now))

    def _on_false(self, rule: Rule, alert: Alert, now: float, out: list[AlertTransition]) -> None:
        if alert.state is AlertState.PENDING:
            alert.state = AlertState.INACTIVE
            self._active[rule.name].pop(alert.fingerprint, None)
            self._dirty[alert.fingerprint] = alert
            return
        if alert.state is AlertState.FIRING:
            hold = rule.hold
            if hold > 0 and now - alert.last_true < hold:
                return
            out.append(self._transition(rule, alert, AlertState.RESOLVED, now))
            alert.state = AlertState.INACTIVE
            alert.escalated = False
            self._active[rule.name].pop(alert.fingerprint, None)

    def _transition(
        self,
        rule: Rule | None,
        alert: Alert,
        state: AlertState,
        now: float,
        note: str = "",
    ) -> AlertTransition:
        alert.sequence += 1
        self._dirty[alert.fingerprint] = alert
        name = alert.rule
        self.transitions[(name, state.value)] = self.transitions.get((name, state.value), 0) + 1
        annotations = alert.annotations
        if note:
            annotations = MappingProxyType({**annotations, "resolved_reason": note})
        drain = False
        routes: tuple[str, ...] = ()
        if rule is not None:
            drain = rule.drain or (
                alert.escalated and rule.escalate is not None and rule.escalate.drain
            )
            routes = rule.routes
        return AlertTransition(
            rule=name,
            state=state,
            severity=alert.severity,
            labels=alert.labels,
            annotations=annotations,
            value=alert.value,
            active_since=alert.active_since,
            timestamp=now,
            drain=drain,
            routes=routes,
            sequence=alert.sequence,
        )

    def _render(self, rule: Rule, alert: Alert) -> Mapping[str, str]:
        templates = dict(rule.annotations)
        if alert.escalated and rule.escalate is not None:
            templates.update(rule.escalate.annotations)
        if not templates:
            return MappingProxyType({})
        values: dict[str, Any] = dict(self._static.get(rule.name, {}))
        values.update(alert.labels)
        values.setdefault("link", "")
        values["node"] = self._node or alert.labels.get("node", "")
        values["severity"] = alert.severity.value
        values["value"] = alert.value
        if alert.extra:
            values.update(alert.extra)
        return MappingProxyType({k: t.render(values) for k, t in templates.items()})

    # -- conditions -----------------------------------------------------------------------
    def _targets(self, rule: Rule) -> tuple[list[_G], set[int]]:
        """The GPUs a rule looks at now (``select``, then ``when``) and those whose ``when``
        cannot be evaluated (no sample). Guards are computed once per evaluation."""
        gpus = self._cur
        if rule.select is not None:
            sel = rule.select
            gpus = [g for g in gpus if _selected(sel, g.info)]
        guard = rule.when
        if guard is None:
            return gpus, set()
        found = self._guards.get(guard)
        if found is None:
            passed: set[int] = set()
            unknown: set[int] = set()
            op = _OPS[guard.op]
            for g in self._cur:
                s = g.sample
                v = s.fields.get(guard.field) if s is not None else None
                if v is None:
                    unknown.add(g.index)
                elif op(v, guard.value):
                    passed.add(g.index)
            found = self._guards[guard] = (passed, unknown)
        passed, unknown = found
        return [g for g in gpus if g.index in passed], {g.index for g in gpus} & unknown

    def _c_threshold(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, Threshold)
        if (
            c.link
            and not self._links_moved
            and not self._status_moved
            and not self._active[rule.name]
            and rule.name not in self._full_pass
        ):
            return _NO_HITS, set()  # no link sample changed: the answer is still "none"
        targets, unknown = self._targets(rule)
        op = _OPS[c.op]
        name, limit = c.field, c.value
        hits: Hits = {}
        for g in targets:
            s = g.sample
            if s is None:
                unknown.add(g.index)
                continue
            if c.link:
                links = g.data.links if g.data.links is not None else s.links
                cache = self._link_cache.setdefault(rule.name, {})
                cached = cache.get(g.data.uuid)
                if cached is not None and cached[0] is links:
                    found = cached[1]
                else:
                    found = [
                        ((g.index, ls.link, -1), (v, None))
                        for ls in links
                        if (v := ls.fields.get(name)) is not None and op(v, limit)
                    ]
                    cache[g.data.uuid] = (links, found)
                hits.update(found)
                continue
            v = s.fields.get(name)
            if v is None:
                unknown.add(g.index)
            elif op(v, limit):
                hits[(g.index, -1, -1)] = (v, None)
        return hits, unknown

    def _series(self, g: _G, name: str, link: bool) -> list[tuple[int, CounterHistory]]:
        if link:
            table = g.data.link_hist.get(name)
            return sorted(table.items()) if table else []
        h = g.data.hist.get(name)
        return [(-1, h)] if h is not None else []

    def _c_window(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, Increase | Rate | Count)
        op = _OPS[c.op]
        start = now - c.window
        true = self._true[rule.name]
        hits: Hits = {}
        if rises_only(c.op) and rule.when is None and rule.name not in self._full_pass:
            if not self._touched and not true:
                return _NO_HITS, set()
            # Only a series that moved can turn true: without new points an increase, a
            # rate or a count over a sliding window can only shrink. So look at the
            # series that moved since the last evaluation and at those that were true.
            todo: list[tuple[int, int, CounterHistory]] = []
            for h in (*self._touched, *true):
                uuid, name, series_link = self._meta[h]
                if name != c.field:  # GPU and link fields have distinct names
                    continue
                index = self._by_uuid_index.get(uuid)
                if index is None:
                    continue
                if rule.select is not None and not _selected(
                    rule.select, self._by_index[index].info
                ):
                    continue
                todo.append((index, series_link, h))
            todo = sorted(set(todo), key=lambda x: (x[0], x[1]))  # deterministic order
            unknown: set[int] = set()
        else:
            targets, unknown = self._targets(rule)
            todo = [
                (g.index, link_no, h)
                for g in targets
                for link_no, h in self._series(g, c.field, c.link)
            ]
        for index, link_no, h in todo:
            if isinstance(c, Count):
                v = float(h.changes(start, now))
            else:
                v = h.increase(start, now)
                if isinstance(c, Rate):
                    v /= c.window
            if op(v, c.value):
                hits[(index, link_no, -1)] = (v, None)
                true[h] = None
            else:
                true.pop(h, None)
        return hits, unknown

    def _c_trend(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, Trend)
        if not self._active[rule.name] and rule.name not in self._full_pass:
            last = self._rechecked.get(rule.name)
            moved = any(self._meta[h][1] == c.field for h in self._touched)
            if not moved and last is not None and now - last < TREND_RECHECK:
                return _NO_HITS, set()
            self._rechecked[rule.name] = now
        targets, unknown = self._targets(rule)
        cache = self._wcache.setdefault(rule.name, {})
        hits: Hits = {}
        w0 = now - c.window
        b0 = w0 - c.baseline
        for g in targets:
            for link, h in self._series(g, c.field, c.link):
                if len(h) < 2:
                    continue
                seen = cache.get(h)
                if seen is not None and seen[0] == h.version and now - seen[1] < TREND_RECHECK:
                    continue
                hit = self._trend(c, h, now, w0, b0)
                if hit is None:
                    cache[h] = (h.version, now)
                else:
                    cache.pop(h, None)
                    hits[(g.index, link, -1)] = hit
        return hits, unknown

    @staticmethod
    def _trend(c: Trend, h: CounterHistory, now: float, w0: float, b0: float) -> Hit | None:
        recent = h.increase(w0, now)
        if recent < c.min_increase:
            return None
        if h.ts[0] > b0:
            return None  # the baseline period is not covered by history yet
        base = h.increase(b0, w0)
        rate_recent = recent / c.window
        rate_base = max(base, 1.0) / c.baseline
        ratio = rate_recent / rate_base
        if ratio < c.factor:
            return None
        width = c.window / c.slices
        prev = h.value_at(w0)
        busy = 0
        for i in range(1, c.slices + 1):
            v = h.value_at(w0 + i * width)
            if v is not None and prev is not None and v > prev:
                busy += 1
            prev = v
        if busy < c.min_slices:
            return None
        return recent, {"ratio": ratio, "baseline_rate": base / c.baseline * 3600.0}

    def _c_peer_outlier(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, PeerOutlier)
        if c.window is not None and not self._active[rule.name]:
            # Counters: nothing to do unless one of them moved (or once a minute, for
            # errors leaving the window).
            last = self._rechecked.get(rule.name)
            moved = any(self._meta[h][1] == c.field for h in self._touched)
            if not moved and last is not None and now - last < 60.0:
                return {}, set()
            self._rechecked[rule.name] = now
        targets, unknown = self._targets(rule)
        pairs: list[tuple[float, _G]] = []
        for g in targets:
            if c.window is None:
                s = g.sample
                v = s.fields.get(c.field) if s is not None else None
                if v is None:
                    unknown.add(g.index)
                    continue
            else:
                h = g.data.hist.get(c.field)
                if h is None:
                    continue
                v = h.increase(now - c.window, now)
            pairs.append((v, g))
        hits: Hits = {}
        if len(pairs) < c.min_peers + 1:
            return hits, unknown
        values = sorted(v for v, _ in pairs)
        lo, hi = values[0], values[-1]
        if hi - lo < c.min_delta:
            return hits, unknown
        if c.direction == "below" and lo >= c.ratio * hi:
            return hits, unknown
        if c.direction == "above" and hi <= c.ratio * lo:
            return hits, unknown
        for v, g in pairs:
            others = list(values)
            others.remove(v)
            m = _median(others)
            if c.direction == "below":
                bad = v < c.ratio * m and m - v >= c.min_delta
            else:
                bad = v > c.ratio * m and v - m >= c.min_delta
            if bad:
                hits[(g.index, -1, -1)] = (v, {"peers_median": m})
        return hits, unknown

    def _c_throttle(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, Throttle)
        targets, unknown = self._targets(rule)
        hits: Hits = {}
        for g in targets:
            s = g.sample
            mask = s.fields.get("clock_event_reasons") if s is not None else None
            if mask is None:
                unknown.add(g.index)
                continue
            m = int(mask) & c.mask
            if (m == c.mask) if c.match == "all" else m:
                hits[(g.index, -1, -1)] = (
                    mask,
                    {"reasons": ", ".join(decode_clock_event_reasons(m))},
                )
        return hits, unknown

    def _c_gpu_status(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, GpuStatusIs)
        if (
            not self._status_moved
            and not self._active[rule.name]
            and (rule.name not in self._full_pass)
        ):
            return _NO_HITS, set()
        gpus = self._cur
        if rule.select is not None:
            sel = rule.select
            gpus = [g for g in gpus if _selected(sel, g.info)]
        hits: Hits = {}
        for g in gpus:
            if g.status in c.statuses:
                hits[(g.index, -1, -1)] = (1.0, {"status": g.status.value})
        return hits, set()

    def _c_gpu_count(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, GpuCount)
        view = self._view
        hits: Hits = {}
        if view is None or view.expected_gpus is None:
            return hits, set()
        expected = view.expected_gpus
        seen = len(view.gpus)
        pci = view.pci_gpus if c.pci else None
        low = seen < expected or (pci is not None and pci < expected)
        if low:
            value = float(seen if pci is None else min(seen, pci))
            hits[NODE_KEY] = (value, {"expected": expected, "seen": seen, "pci_seen": pci})
        return hits, set()

    def _c_pcie_downtrained(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, PcieDowntrained)
        targets, unknown = self._targets(rule)
        hits: Hits = {}
        for g in targets:
            s = g.sample
            if s is None:
                unknown.add(g.index)
                continue
            f = s.fields
            gen, gen_max = f.get("pcie_link_generation"), f.get("pcie_link_generation_max")
            width, width_max = f.get("pcie_link_width"), f.get("pcie_link_width_max")
            down = False
            known = False
            if c.generation and gen is not None and gen_max is not None:
                known = True
                down = gen < gen_max
            if c.width and width is not None and width_max is not None:
                known = True
                down = down or width < width_max
            if not known:
                unknown.add(g.index)
            elif down:
                hits[(g.index, -1, -1)] = (
                    gen if gen is not None else math.nan,
                    {
                        "generation": gen,
                        "generation_max": gen_max,
                        "width": width,
                        "width_max": width_max,
                    },
                )
        return hits, unknown

    def _c_stuck_workload(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, StuckWorkload)
        targets, unknown = self._targets(rule)
        hits: Hits = {}
        for g in targets:
            s = g.sample
            if s is None:
                unknown.add(g.index)
                continue
            util = s.fields.get("utilization_gpu")
            procs = s.fields.get("compute_processes")
            if procs is None and s.processes:
                procs = float(len(s.processes))
            if util is None or procs is None:
                unknown.add(g.index)
                continue
            if procs >= c.min_processes and util <= c.max_utilization:
                hits[(g.index, -1, -1)] = (util, {"utilization": util, "processes": procs})
        return hits, unknown

    def _c_xid(self, rule: Rule, now: float) -> tuple[Hits, set[int]]:
        c = rule.condition
        assert isinstance(c, XidMatch)
        cursor = self._xid_cursor.get(rule.name, 0)
        self._xid_cursor[rule.name] = self._xid_seq
        hits: Hits = {}
        if cursor >= self._xid_seq:
            return hits, set()
        allowed: set[int] | None = None
        if rule.select is not None:
            sel = rule.select
            allowed = {g.index for g in self._cur if _selected(sel, g.info)}
        codes = c.codes
        latest: dict[Key, XidEvent] = {}
        for x in reversed(self._xids):
            if x.seq <= cursor:
                break
            ev = x.event
            if ev.xid not in codes:
                continue
            key = (self._gpu_of(ev), -1, ev.xid if c.by_code else -1)
            if allowed is not None and key[0] not in allowed:
                continue
            latest.setdefault(key, ev)
        if not latest:
            return hits, set()
        start = now - c.window
        for key, ev in latest.items():
            count = 0
            for x in self._xids:
                e = x.event
                if (
                    e.timestamp >= start
                    and e.xid in codes
                    and (not c.by_code or e.xid == key[2])
                    and self._gpu_of(e) == key[0]
                ):
                    count += 1
            if count >= c.count:
                hits[key] = (float(count), self._xid_values(ev, count))
        return hits, set()

    def _gpu_of(self, ev: XidEvent) -> int:
        if ev.gpu is not None and ev.gpu in self._by_index:
            return ev.gpu
        if ev.pci_bus_id:
            found = self._pci_index.get(ev.pci_bus_id.upper())
            if found is not None:
                return found
        if ev.uuid:
            found = self._by_uuid_index.get(ev.uuid)
            if found is not None:
                return found
        return -1

    def _xid_values(self, ev: XidEvent, count: int) -> dict[str, Any]:
        entry = self.catalog.lookup(ev.xid)
        verdict = self.catalog.classify(ev.xid, ev.message, ev.kind)
        text = entry.description if entry is not None else "not in NVIDIA's XID catalog"
        if entry is not None and verdict.action == entry.action:
            action = entry.action_text
        else:
            action = f"{verdict.action.value} ({verdict.reason})"
        values: dict[str, Any] = {
            "xid": ev.xid,
            "xid_text": text,
            "action": action,
            "count": count,
        }
        if self._gpu_of(ev) < 0 and ev.pci_bus_id:
            values["pci_bus_id"] = ev.pci_bus_id
        return values

    _conditions: Mapping[str, Callable[[Engine, Rule, float], tuple[Hits, set[int]]]] = (
        MappingProxyType(
            {
                "threshold": _c_threshold,
                "increase": _c_window,
                "rate": _c_window,
                "count": _c_window,
                "trend": _c_trend,
                "peer_outlier": _c_peer_outlier,
                "throttle": _c_throttle,
                "gpu_status": _c_gpu_status,
                "gpu_count": _c_gpu_count,
                "pcie_downtrained": _c_pcie_downtrained,
                "stuck_workload": _c_stuck_workload,
                "xid": _c_xid,
            }
        )
    )

    # -- reading the state ----------------------------------------------------------------
    def evaluations(self, rule: str) -> int:
        """How many times the rule was evaluated (every cycle since it was loaded)."""
        start = self._cycle_of.get(rule)
        return 0 if start is None else self.cycles - start

    def alerts(self, state: AlertState | None = None) -> list[Alert]:
        """Alerts (optionally in one state), sorted by rule and labels."""
        with self._lock:
            found = [
                a
                for table in self._alerts.values()
                for a in table.values()
                if (state is None and a.state is not AlertState.INACTIVE) or a.state is state
            ]
        return sorted(found, key=lambda a: (a.rule, sorted(a.labels.items())))

    # -- metrics ------------------------------------------------------------------------
    def families(self, view: NodeView, fams: Families) -> None:
        with self._lock:
            rules = self._rules
            fams.get(
                "gpuwatchd_rules_loaded", "gauge", "Alert rules loaded and evaluated.", []
            ).add([], float(len(rules)))
            fams.get(
                "gpuwatchd_rules_reload_success",
                "gauge",
                "1 when the last load of the rule files succeeded; 0 while a failed reload "
                "left the previous rules running.",
                [],
            ).add([], 1.0 if self.reload_success else 0.0)
            fams.get(
                "gpuwatchd_rule_evaluation_duration_seconds",
                "gauge",
                "How long the last evaluation of all rules took.",
                [],
            ).add([], self.last_duration)
            evals = fams.get(
                "gpuwatchd_rule_evaluations_total",
                "counter",
                "Evaluations of each rule (one per poll interval).",
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
                for a in self._alerts.get(rule.name, {}).values():
                    if a.state is AlertState.PENDING or a.state is AlertState.FIRING:
                        k = (rule.name, a.severity.value, a.state.value)
                        counts[k] = counts.get(k, 0) + 1
            for rule in rules:
                evals.add([rule.name], float(self.evaluations(rule.name)))
                fails.add([rule.name], float(self.failures.get(rule.name, 0)))
                for st in TRANSITION_STATES:
                    trans.add([rule.name, st], float(self.transitions.get((rule.name, st), 0)))
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
            now = self._last_now
            if now is not None:
                self._flush(now + PERSIST_RESOLUTION)
                for name, fps in self._active.items():
                    for fp in fps:
                        self._dirty[fp] = self._alerts[name][fp]
                self._save_alerts(now)
            self.store.close()
