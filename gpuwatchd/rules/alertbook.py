"""Every alert the rules have raised, and the state machine each one steps through.

    inactive --condition--> pending --held for `for`--> firing --condition gone for
    `keep_firing_for` (xid: `quiet`)--> resolved (inactive again)

One alert exists per rule and series (a GPU, an NVLink link, an XID code on a GPU, or the
node); each transition carries a per-alert sequence number. Alerts are saved in the
``StateStore`` so that a restart neither re-pages a firing alert nor forgets one, and an
alert that fires again after a reboot can escalate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition, fingerprint
from gpuwatchd.rules.conditions.base import Hits, Key
from gpuwatchd.rules.ledger import kind_of
from gpuwatchd.rules.model import Rule
from gpuwatchd.rules.snapshot import Snapshot
from gpuwatchd.rules.store import AlertRecord, LedgerEntry, StateStore

log = logging.getLogger(__name__)

TRANSITION_STATES = ("pending", "firing", "resolved")


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
    # what the annotations were last re-rendered from (``AlertBook._rerender``), so a poll
    # that found the same values keeps them instead of rendering every template again
    rendered_from: tuple[Any, ...] | None = field(default=None, compare=False, repr=False)

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


class AlertBook:
    """The alerts by rule, which of them are active, and what is not yet saved."""

    __slots__ = (
        "_dirty",
        "_idents",
        "_ledger",
        "_store",
        "active",
        "alerts",
        "queued",
        "transitions",
    )

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self.alerts: dict[str, dict[str, Alert]] = {}  # rule -> fingerprint -> alert
        self.active: dict[str, dict[str, None]] = {}  # pending or firing (insertion-ordered)
        self.queued: list[AlertTransition] = []  # made outside an evaluation (reloads)
        self.transitions: dict[tuple[str, str], int] = {}  # (rule, state) -> count
        self._dirty: dict[str, Alert] = {}
        self._ledger: list[LedgerEntry] = []  # memory-relevant firings not yet saved
        self._idents: dict[tuple[str, Key, str], tuple[str, Mapping[str, str]]] = {}
        self._restore()

    def _restore(self) -> None:
        for rec in self._store.load_alerts():
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
            self.alerts.setdefault(rec.rule, {})[rec.fingerprint] = alert
        restored = sum(
            1 for a in self.alerts.values() for x in a.values() if x.state is AlertState.FIRING
        )
        if restored:
            log.info("restored %d firing alert(s) from %s", restored, self._store.path)

    # -- rule set changes ---------------------------------------------------------------
    def retire(self, name: str, rule: Rule | None, now: float) -> None:
        """The rule is gone: resolve its firing alerts (sent with the next evaluation)."""
        for alert in self.alerts.pop(name).values():
            if alert.state is AlertState.FIRING:
                self.queued.append(
                    self._transition(
                        rule, alert, AlertState.RESOLVED, now, "the rule was removed or disabled"
                    )
                )
            alert.state = AlertState.INACTIVE
            self._dirty[alert.fingerprint] = alert
        self.active.pop(name, None)
        for key in [k for k in self.transitions if k[0] == name]:
            del self.transitions[key]

    def adopt(self, rules: tuple[Rule, ...]) -> None:
        """Make room for the rules of a new set and re-attach restored active alerts."""
        for rule in rules:
            for state in TRANSITION_STATES:
                self.transitions.setdefault((rule.name, state), 0)
            self.alerts.setdefault(rule.name, {})
            self.active.setdefault(rule.name, {})
        self._idents.clear()
        for alerts in self.alerts.values():
            for alert in alerts.values():
                if alert.state is not AlertState.INACTIVE:
                    self.active.setdefault(alert.rule, {})[alert.fingerprint] = None

    # -- saving -------------------------------------------------------------------------
    def touch_active(self) -> None:
        """Mark active alerts whose ``last_true`` moved since they were saved."""
        for name, fps in self.active.items():
            alerts = self.alerts[name]
            for fp in fps:
                a = alerts[fp]
                if a.last_true != a.saved_last_true:
                    self._dirty[fp] = a

    def touch_all_active(self) -> None:
        for name, fps in self.active.items():
            for fp in fps:
                self._dirty[fp] = self.alerts[name][fp]

    def save(self, now: float) -> None:
        if self._dirty:
            records = [a.record() for a in self._dirty.values()]
            if not self._store.save_alerts(records, now, self._ledger):
                return  # the disk failed: they stay dirty and go with the next save
            for a in self._dirty.values():
                a.saved_last_true = a.last_true
            self._dirty.clear()
            self._ledger.clear()

    # -- the state machine ----------------------------------------------------------------
    def step(
        self,
        rule: Rule,
        values: Mapping[str, Any],
        snap: Snapshot,
        hits: Hits,
        unknown: set[int],
        now: float,
        out: list[AlertTransition],
    ) -> None:
        """Apply one evaluation's answer to the rule's alerts (``values``: the template
        values the condition fixes)."""
        alerts = self.alerts[rule.name]
        active = self.active[rule.name]
        touched: set[str] = set()
        for key, (value, extra) in hits.items():
            fp, labels = self._identity(rule, key, snap)
            alert = alerts.get(fp)
            if alert is None:
                alert = alerts[fp] = Alert(rule.name, fp, labels, key, severity=rule.severity)
            alert.key = key
            touched.add(fp)
            alert.value = value
            alert.extra = extra
            alert.last_true = now
            self._on_true(rule, values, snap.node, alert, now, out)
        if len(active) > len(touched) or not touched.issuperset(active):
            for fp in [f for f in active if f not in touched]:
                alert = alerts[fp]
                if alert.key is None:
                    alert.key = self._resolve_key(alert, snap)
                    if alert.key is None:
                        if self._replaced(alert, snap):
                            self._retire_replaced(rule, alert, now, out)
                        continue
                index = alert.key[0]
                if index in unknown or (index >= 0 and index not in snap.by_index):
                    continue  # cannot tell: hold
                self._on_false(rule, alert, now, out)

    def _identity(self, rule: Rule, key: Key, snap: Snapshot) -> tuple[str, Mapping[str, str]]:
        g = snap.by_index.get(key[0]) if key[0] >= 0 else None
        uuid = g.info.uuid if g is not None else ""
        cache_key = (rule.name, key, uuid)
        found = self._idents.get(cache_key)
        if found is not None:
            return found
        labels: dict[str, str] = {"node": snap.node}
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

    @staticmethod
    def _resolve_key(alert: Alert, snap: Snapshot) -> Key | None:
        """The series of an alert restored from the store, in this boot's GPU numbering."""
        labels = alert.labels
        uuid = labels.get("uuid", "")
        index = -1
        if uuid:
            found = snap.by_uuid.get(uuid)
            if found is None:
                return None  # the GPU is not (yet) present: hold
            index = found
        link = int(labels["link"]) if labels.get("link", "").isdigit() else -1
        xid = int(labels["xid"]) if labels.get("xid", "").isdigit() else -1
        return (index, link, xid)

    @staticmethod
    def _replaced(alert: Alert, snap: Snapshot) -> bool:
        """The alert's GPU is gone and another GPU (another UUID) answers at its PCI
        address: the board was replaced."""
        uuid = alert.labels.get("uuid", "")
        index = snap.by_pci.get(alert.labels.get("pci_bus_id", "").upper())
        if not uuid or index is None:
            return False
        now_there = snap.by_index[index].info.uuid
        return now_there.startswith("GPU-") and now_there != uuid

    def _retire_replaced(
        self, rule: Rule, alert: Alert, now: float, out: list[AlertTransition]
    ) -> None:
        """An alert of a replaced GPU ends: its evidence was about a board that left."""
        if alert.state is AlertState.FIRING:
            out.append(
                self._transition(
                    rule,
                    alert,
                    AlertState.RESOLVED,
                    now,
                    "the GPU was replaced (another UUID answers at its PCI address)",
                )
            )
        alert.state = AlertState.INACTIVE
        alert.escalated = False
        self._dirty[alert.fingerprint] = alert
        self.active[rule.name].pop(alert.fingerprint, None)

    def _on_true(
        self,
        rule: Rule,
        values: Mapping[str, Any],
        node: str,
        alert: Alert,
        now: float,
        out: list[AlertTransition],
    ) -> None:
        state = alert.state
        boot_id = self._store.boot_id
        if state is AlertState.FIRING:
            if alert.boot_id != boot_id:
                self._survived_reboot(rule, values, node, alert, now, out)
            self._rerender(rule, values, node, alert)
            return
        if state is AlertState.PENDING:
            self._rerender(rule, values, node, alert)
        if state is AlertState.INACTIVE:
            alert.active_since = now
            self.active[rule.name][alert.fingerprint] = None
            if rule.for_ > 0:
                alert.state = AlertState.PENDING
                alert.severity = rule.severity
                alert.boot_id = boot_id
                alert.annotations = render(rule, values, node, alert)
                alert.rendered_from = None
                out.append(self._transition(rule, alert, AlertState.PENDING, now))
                return
        if now - alert.active_since >= rule.for_:
            self._fire(rule, values, node, alert, now, out)

    @staticmethod
    def _rerender(rule: Rule, values: Mapping[str, Any], node: str, alert: Alert) -> None:
        """Render the annotations again from what this evaluation found, as Prometheus
        does at every evaluation: the text of a firing alert follows its values (the
        count that keeps growing), and every later message (a repeat, the resolve, the
        status API) says what holds now, not what held when it fired."""
        extra = alert.extra
        key = (
            node,
            alert.value,
            alert.severity,
            alert.escalated,
            alert.labels,
            None if extra is None else dict(extra),
        )
        last = alert.rendered_from
        if last is not None and last[0] is rule and last[1] is values and last[2:] == key:
            return  # the same inputs: the same text (render is a pure function of them)
        alert.annotations = render(rule, values, node, alert)  # saved with last_true
        alert.rendered_from = (rule, values, *key)

    def _fire(
        self,
        rule: Rule,
        values: Mapping[str, Any],
        node: str,
        alert: Alert,
        now: float,
        out: list[AlertTransition],
    ) -> None:
        alert.state = AlertState.FIRING
        alert.fired_at = now
        alert.escalated = False
        alert.severity = rule.severity
        esc = rule.escalate
        if esc is not None:
            boots = self._store.fault_boots(alert.fingerprint, now - esc.within)
            boots.discard(self._store.boot_id)
            alert.escalated = bool(boots)
        if alert.escalated and esc is not None:
            alert.severity = esc.severity
        alert.boot_id = self._store.boot_id
        alert.annotations = render(rule, values, node, alert)
        alert.rendered_from = None
        out.append(self._transition(rule, alert, AlertState.FIRING, now))

    def _survived_reboot(
        self,
        rule: Rule,
        values: Mapping[str, Any],
        node: str,
        alert: Alert,
        now: float,
        out: list[AlertTransition],
    ) -> None:
        """A firing alert restored from an earlier boot whose condition still holds."""
        esc = rule.escalate
        previous = alert.boot_id
        alert.boot_id = self._store.boot_id
        self._dirty[alert.fingerprint] = alert
        if esc is None or alert.escalated or (previous and now - alert.active_since > esc.within):
            return
        alert.escalated = True
        alert.severity = esc.severity
        alert.annotations = render(rule, values, node, alert)
        alert.rendered_from = None
        out.append(self._transition(rule, alert, AlertState.FIRING, now))

    def _on_false(self, rule: Rule, alert: Alert, now: float, out: list[AlertTransition]) -> None:
        if alert.state is AlertState.PENDING:
            alert.state = AlertState.INACTIVE
            self.active[rule.name].pop(alert.fingerprint, None)
            self._dirty[alert.fingerprint] = alert
            return
        if alert.state is AlertState.FIRING:
            hold = rule.hold
            if hold > 0 and now - alert.last_true < hold:
                return
            out.append(self._transition(rule, alert, AlertState.RESOLVED, now))
            alert.state = AlertState.INACTIVE
            alert.escalated = False
            self.active[rule.name].pop(alert.fingerprint, None)

    def _note_firing(self, rule: Rule, alert: Alert, drain: bool, now: float) -> None:
        """A memory-relevant firing goes into the ledger with the next save."""
        entry = _ledger_entry(rule, alert, drain, now)
        if entry is not None:
            self._ledger.append(entry)
            if len(self._ledger) > self._store.ledger_rows:  # saves keep failing: its bound
                del self._ledger[0]

    def _transition(
        self, rule: Rule | None, alert: Alert, state: AlertState, now: float, note: str = ""
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
            if state is AlertState.FIRING:
                self._note_firing(rule, alert, drain, now)
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


def _ledger_entry(rule: Rule, alert: Alert, drain: bool, now: float) -> LedgerEntry | None:
    kind = kind_of(rule, alert.labels, alert.annotations, alert.severity, drain)
    if kind is None:
        return None
    labels = alert.labels
    return LedgerEntry(
        now,
        alert.fingerprint,
        rule.name,
        labels.get("gpu", ""),
        labels.get("uuid", ""),
        kind,
        alert.severity.value,
        drain,
    )


def render(rule: Rule, fixed: Mapping[str, Any], node: str, alert: Alert) -> Mapping[str, str]:
    """The alert's annotations: the rule's templates (the escalation's when escalated)
    filled with the condition's fixed values, the labels and what the evaluation found."""
    templates = dict(rule.annotations)
    if alert.escalated and rule.escalate is not None:
        templates.update(rule.escalate.annotations)
    extra = alert.extra or {}
    # An XID alert always says what to do: the catalog's action (the config's overrides
    # applied), also where the rule has no action annotation of its own, so no receiver
    # falls back to NVIDIA's unoverridden words.
    own_action = "action" not in templates and isinstance(extra.get("action"), str)
    if not templates and not own_action:
        return MappingProxyType({})
    values: dict[str, Any] = dict(fixed)
    values.update(alert.labels)
    values.setdefault("link", "")
    values["node"] = node or alert.labels.get("node", "")
    values["severity"] = alert.severity.value
    values["value"] = alert.value
    if alert.extra:
        values.update(alert.extra)
    out = {k: t.render(values) for k, t in templates.items()}
    if own_action:
        out["action"] = str(extra["action"])
    return MappingProxyType(out)
