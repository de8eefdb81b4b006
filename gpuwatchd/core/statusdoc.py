"""The node's status as one typed document.

``gpuwatchd status`` (text and ``--json``), the status socket, ``/api/v1/status`` and the
status page at ``/`` all show this one document. The daemon builds it in one place
(``Node.status_document`` in the composition root, plus the daemon's config part);
``as_json`` gives the wire form (the keys the API has always had), and ``from_json``
reads that form back, so the CLI, which gets the document over a socket or HTTP, renders
the very same type the page does.

Each entry keeps the keys no renderer reads in ``more`` (a GPU's uuid, an alert's value,
the actions stage's queue, ...): they travel unchanged, so the JSON is exactly what the
daemon said. A GPU's health verdict comes from the daemon; from an older daemon that did
not send one, it is judged here with the same ``gpu_health``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatchd.core.health import GpuHealth, firing_by_gpu, gpu_health

ACTIONS_KEYS = ("deliveries", "silences", "drain")
"""The actions stage's parts of the document, in the order the text shows them."""


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _mapping(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


@dataclass(frozen=True)
class GpuEntry:
    """One GPU: what identifies it, its poll status, its health verdict and its readings
    (current ones when it answers, the last ones it gave when it does not)."""

    index: Any
    pci_bus_id: str
    name: str
    status: str
    health: GpuHealth
    readings: Mapping[str, Any] | None = None
    last_readings: Mapping[str, Any] | None = None
    last_readings_at: float | None = None
    clock_event_reasons: tuple[str, ...] | None = None
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset(
        {
            "index",
            "pci_bus_id",
            "name",
            "status",
            "health",
            "health_rules",
            "readings",
            "last_readings",
            "last_readings_at",
            "clock_event_reasons",
        }
    )

    @classmethod
    def from_json(cls, g: Mapping[str, Any], firing: list[tuple[str, str]]) -> GpuEntry:
        status = str(g.get("status", "?"))
        if isinstance(g.get("health"), str):
            rules = g.get("health_rules") or []
            health = GpuHealth(str(g["health"]), tuple(str(r) for r in rules))
        else:  # an older daemon: the same verdict, judged here
            health = gpu_health(status, firing)
        reasons = g.get("clock_event_reasons")
        return cls(
            index=g.get("index", "?"),
            pci_bus_id=str(g.get("pci_bus_id", "")),
            name=str(g.get("name", "")),
            status=status,
            health=health,
            readings=_mapping(g.get("readings")),
            last_readings=_mapping(g.get("last_readings")),
            last_readings_at=_num(g.get("last_readings_at")),
            clock_event_reasons=None if reasons is None else tuple(str(r) for r in reasons),
            more={k: v for k, v in g.items() if k not in cls._TYPED},
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "pci_bus_id": self.pci_bus_id,
            "name": self.name,
            **self.more,
            "status": self.status,
            **self.health.as_dict(),
        }
        if self.readings is not None:
            out["readings"] = dict(self.readings)
        if self.clock_event_reasons is not None:
            out["clock_event_reasons"] = list(self.clock_event_reasons)
        if self.last_readings is not None:
            out["last_readings"] = dict(self.last_readings)
        if self.last_readings_at is not None:
            out["last_readings_at"] = self.last_readings_at
        return out


@dataclass(frozen=True)
class FiringAlert:
    """One firing alert: its rule, severity, labels, texts and (for the trend rules) the
    history it judged."""

    rule: str
    severity: str
    labels: Mapping[str, str]
    since: float | None = None
    summary: str | None = None
    fingerprint: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, Any] | None = None
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset(
        {
            "rule",
            "severity",
            "labels",
            "since",
            "summary",
            "fingerprint",
            "annotations",
            "history",
        }
    )

    @property
    def gpu(self) -> str | None:
        gpu = self.labels.get("gpu")
        return None if gpu in (None, "") else str(gpu)

    @classmethod
    def from_json(cls, a: Mapping[str, Any]) -> FiringAlert:
        summary = a.get("summary")
        fingerprint = a.get("fingerprint")
        return cls(
            rule=str(a.get("rule", "?")),
            severity=str(a.get("severity", "?")),
            labels={str(k): str(v) for k, v in (a.get("labels") or {}).items()},
            since=_num(a.get("since")),
            summary=None if summary is None else str(summary),
            fingerprint=None if fingerprint is None else str(fingerprint),
            annotations={str(k): str(v) for k, v in (a.get("annotations") or {}).items()},
            history=_mapping(a.get("history")),
            more={k: v for k, v in a.items() if k not in cls._TYPED},
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rule": self.rule,
            "severity": self.severity,
            "labels": dict(self.labels),
            "since": self.since,
            **self.more,
            "summary": self.summary,
            "fingerprint": self.fingerprint,
            "annotations": dict(self.annotations),
        }
        if self.history is not None:
            out["history"] = dict(self.history)
        return out


@dataclass(frozen=True)
class SourceEntry:
    """One input (nvml, the kernel log, ...): up or down, and why."""

    up: bool
    detail: str
    more: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, s: Mapping[str, Any]) -> SourceEntry:
        return cls(
            up=bool(s.get("up")),
            detail=str(s.get("detail", "")),
            more={k: v for k, v in s.items() if k not in ("up", "detail")},
        )

    def as_json(self) -> dict[str, Any]:
        return {"up": self.up, "detail": self.detail, **self.more}


@dataclass(frozen=True)
class ConfigState:
    """The config file, the last reload and the keys that wait for a restart."""

    file: Any
    last_reload: Mapping[str, Any] | None
    restart_required: Mapping[str, str]

    @classmethod
    def from_json(cls, c: Mapping[str, Any]) -> ConfigState:
        return cls(
            file=c.get("file"),
            last_reload=_mapping(c.get("last_reload")),
            restart_required={str(k): str(v) for k, v in (c.get("restart_required") or {}).items()},
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "last_reload": None if self.last_reload is None else dict(self.last_reload),
            "restart_required": dict(self.restart_required),
        }


def _split(d: Mapping[str, Any], typed: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in typed}


@dataclass(frozen=True)
class ReceiverState:
    """One receiver's deliveries: how many wait, the oldest's age, the last error."""

    name: str
    type: str
    pending: int
    oldest_pending_seconds: float | None
    last_error: str | None
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset({"name", "type", "pending", "oldest_pending_seconds", "last_error"})

    @classmethod
    def from_json(cls, r: Mapping[str, Any]) -> ReceiverState:
        error = r.get("last_error")
        return cls(
            name=str(r.get("name", "?")),
            type=str(r.get("type", "?")),
            pending=int(r.get("pending") or 0),
            oldest_pending_seconds=_num(r.get("oldest_pending_seconds")),
            last_error=None if error is None else str(error),
            more=_split(r, cls._TYPED),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "type": self.type,
            "pending": self.pending,
            "oldest_pending_seconds": self.oldest_pending_seconds,
            "last_error": self.last_error,
            **self.more,
        }


@dataclass(frozen=True)
class DeliveryFiring:
    """A firing alert as the outbox knows it, and the silence that mutes it, if any."""

    rule: str
    severity: str
    labels: Mapping[str, str]
    since: float | None
    silenced_by: str | None
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset({"rule", "severity", "labels", "since", "silenced_by"})

    @classmethod
    def from_json(cls, a: Mapping[str, Any]) -> DeliveryFiring:
        by = a.get("silenced_by")
        return cls(
            rule=str(a.get("rule", "?")),
            severity=str(a.get("severity", "?")),
            labels={str(k): str(v) for k, v in (a.get("labels") or {}).items()},
            since=_num(a.get("since")),
            silenced_by=None if by is None else str(by),
            more=_split(a, cls._TYPED),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "severity": self.severity,
            "labels": dict(self.labels),
            "since": self.since,
            "silenced_by": self.silenced_by,
            **self.more,
        }


@dataclass(frozen=True)
class Deliveries:
    """The outbox: pending deliveries by receiver, and the alerts it holds as firing."""

    pending: int
    state_problem: str | None
    receivers: tuple[ReceiverState, ...]
    firing: tuple[DeliveryFiring, ...]
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset({"pending", "state_problem", "receivers", "firing"})

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Deliveries:
        problem = d.get("state_problem")
        return cls(
            pending=int(d.get("pending") or 0),
            state_problem=None if problem is None else str(problem),
            receivers=tuple(ReceiverState.from_json(r) for r in d.get("receivers") or ()),
            firing=tuple(DeliveryFiring.from_json(a) for a in d.get("firing") or ()),
            more=_split(d, cls._TYPED),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "pending": self.pending,
            "state_problem": self.state_problem,
            "receivers": [r.as_json() for r in self.receivers],
            "firing": [a.as_json() for a in self.firing],
            **self.more,
        }


@dataclass(frozen=True)
class SilenceState:
    """One silence: what it mutes, until when, why and who said so."""

    id: str
    gpu: str | None
    ends_at: float | None
    reason: str
    author: str
    active: bool
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset({"id", "gpu", "ends_at", "reason", "author", "active"})

    @classmethod
    def from_json(cls, s: Mapping[str, Any]) -> SilenceState:
        gpu = s.get("gpu")
        return cls(
            id=str(s.get("id", "?")),
            gpu=None if gpu is None else str(gpu),
            ends_at=_num(s.get("ends_at")),
            reason=str(s.get("reason", "")),
            author=str(s.get("author", "")),
            active=bool(s.get("active")),
            more=_split(s, cls._TYPED),
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "gpu": self.gpu,
            "ends_at": self.ends_at,
            "reason": self.reason,
            "author": self.author,
            "active": self.active,
            **self.more,
        }


@dataclass(frozen=True)
class DrainState:
    """The drain's summary: its mode and, when a drain is configured, the node's drain
    state, the pending drain's time and reason, and the drains spent in the window."""

    mode: str
    dry_run: bool = False
    state: str = ""
    drain_at: float | None = None
    reason: str | None = None
    drains_in_window: int = 0
    max_drains: int = 0
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset(
        {"mode", "dry_run", "state", "drain_at", "reason", "drains_in_window", "max_drains"}
    )

    @property
    def configured(self) -> bool:
        return self.mode != "none"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DrainState:
        mode = str(d.get("mode", "none"))
        if mode == "none":
            return cls(mode, more=_split(d, frozenset({"mode"})))
        reason = d.get("reason")
        return cls(
            mode=mode,
            dry_run=bool(d.get("dry_run")),
            state=str(d.get("state", "?")),
            drain_at=_num(d.get("drain_at")),
            reason=None if reason is None else str(reason),
            drains_in_window=int(d.get("drains_in_window") or 0),
            max_drains=int(d.get("max_drains") or 0),
            more=_split(d, cls._TYPED),
        )

    def as_json(self) -> dict[str, Any]:
        if not self.configured:
            return {"mode": self.mode, **self.more}
        return {
            "mode": self.mode,
            "dry_run": self.dry_run,
            "state": self.state,
            "drain_at": self.drain_at,
            "reason": self.reason,
            "drains_in_window": self.drains_in_window,
            "max_drains": self.max_drains,
            **self.more,
        }


@dataclass(frozen=True)
class ActionsState:
    """The actions stage's part of the status (absent when nothing is configured to
    receive): deliveries, silences, the drain."""

    deliveries: Deliveries | None = None
    silences: tuple[SilenceState, ...] | None = None
    drain: DrainState | None = None

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ActionsState:
        deliveries, silences, drain = (doc.get(k) for k in ACTIONS_KEYS)
        return cls(
            deliveries=Deliveries.from_json(deliveries)
            if isinstance(deliveries, Mapping)
            else None,
            silences=(
                tuple(SilenceState.from_json(s) for s in silences if isinstance(s, Mapping))
                if isinstance(silences, list)
                else None
            ),
            drain=DrainState.from_json(drain) if isinstance(drain, Mapping) else None,
        )

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.deliveries is not None:
            out["deliveries"] = self.deliveries.as_json()
        if self.silences is not None:
            out["silences"] = [s.as_json() for s in self.silences]
        if self.drain is not None:
            out["drain"] = self.drain.as_json()
        return out


@dataclass(frozen=True)
class StatusDocument:
    """The whole status of one node."""

    node: str
    version: str
    backend: str
    now: float | None
    gpus: tuple[GpuEntry, ...]
    alerts: tuple[FiringAlert, ...] | None
    sources: Mapping[str, SourceEntry]
    gpus_expected: int | None = None
    started_at: float | None = None
    xid_counts: tuple[Mapping[str, Any], ...] = ()
    nvml_worker: Mapping[str, Any] | None = None
    fields: Any = None
    actions: ActionsState = field(default_factory=ActionsState)
    config: ConfigState | None = None
    more: Mapping[str, Any] = field(default_factory=dict)

    _TYPED = frozenset(
        {
            "node",
            "version",
            "backend",
            "now",
            "gpus",
            "alerts",
            "sources",
            "gpus_expected",
            "started_at",
            "xid_counts",
            "nvml_worker",
            "fields",
            "config",
        }
    )

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StatusDocument:
        """The document from its wire form (the status socket's ``status``, or
        /api/v1/status)."""
        alerts = doc.get("alerts")
        firing = (
            tuple(FiringAlert.from_json(a) for a in alerts if isinstance(a, Mapping))
            if isinstance(alerts, list)
            else None
        )
        by_gpu = firing_by_gpu(a.as_json() for a in firing or ())
        gpus = tuple(
            GpuEntry.from_json(g, by_gpu.get(str(g.get("index", "?")), []))
            for g in doc.get("gpus") or []
            if isinstance(g, Mapping)
        )
        sources = {
            str(k): SourceEntry.from_json(v)
            for k, v in (doc.get("sources") or {}).items()
            if isinstance(v, Mapping)
        }
        expected = doc.get("gpus_expected")
        config = doc.get("config")
        rest = {k: v for k, v in doc.items() if k not in cls._TYPED}
        return cls(
            node=str(doc.get("node", "?")),
            version=str(doc.get("version", "?")),
            backend=str(doc.get("backend", "?")),
            now=_num(doc.get("now")),
            gpus=gpus,
            alerts=firing,
            sources=sources,
            gpus_expected=expected if isinstance(expected, int) else None,
            started_at=_num(doc.get("started_at")),
            xid_counts=tuple(doc.get("xid_counts") or ()),
            nvml_worker=_mapping(doc.get("nvml_worker")),
            fields=doc.get("fields"),
            actions=ActionsState.from_json(rest),
            config=ConfigState.from_json(config) if isinstance(config, Mapping) else None,
            more={k: v for k, v in rest.items() if k not in ACTIONS_KEYS},
        )

    def with_config(self, config: ConfigState) -> StatusDocument:
        return replace(self, config=config)

    def as_json(self) -> dict[str, Any]:
        """The wire form: the keys /api/v1/status, the status socket and
        ``gpuwatchd status --json`` have always had."""
        out: dict[str, Any] = {
            "node": self.node,
            "version": self.version,
            "now": self.now,
            "started_at": self.started_at,
            "backend": self.backend,
            "gpus": [g.as_json() for g in self.gpus],
            "gpus_expected": self.gpus_expected,
            "sources": {k: s.as_json() for k, s in self.sources.items()},
            "xid_counts": [dict(x) for x in self.xid_counts],
        }
        if self.alerts is not None:
            out["alerts"] = [a.as_json() for a in self.alerts]
        if self.nvml_worker is not None:
            out["nvml_worker"] = dict(self.nvml_worker)
        if self.fields is not None:
            out["fields"] = self.fields
        out.update(self.actions.as_json())
        out.update(self.more)
        if self.config is not None:
            out["config"] = self.config.as_json()
        return out
