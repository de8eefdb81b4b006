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
    actions: Mapping[str, Any] = field(default_factory=dict)
    """The actions stage's parts (deliveries, receivers' queue, silences, drain), as it
    gave them; absent when no receiver or drain is configured."""
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
            actions={k: v for k, v in rest.items() if k in ACTIONS_KEYS},
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
        out.update(self.actions)
        out.update(self.more)
        if self.config is not None:
            out["config"] = self.config.as_json()
        return out
