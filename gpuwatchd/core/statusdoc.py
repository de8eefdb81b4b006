"""The node's status as one typed document.

``gpuwatchd status`` (text and ``--json``), the status socket, ``/api/v1/status`` and the
status page at ``/`` all show this one document. The daemon builds it in one place
(``Node.status_document`` in the composition root, plus the daemon's config part);
``as_json`` gives the wire form (the keys the API has always had), and ``from_json``
reads that form back, so the CLI, which gets the document over a socket or HTTP, renders
the very same type the page does. Both are one converter driven by the dataclasses'
fields (``core/docfields.py``): the fields are in the order of the wire form's keys.

Each entry keeps the keys no renderer reads in ``more`` (a GPU's uuid, an alert's value,
the actions stage's queue, ...): they travel unchanged, so the JSON is exactly what the
daemon said. A GPU's health verdict comes from the daemon; from an older daemon that did
not send one, it is judged here with the same ``gpu_health``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatchd.core.docfields import Doc, read, spec, write
from gpuwatchd.core.health import GpuHealth, firing_by_gpu, gpu_health

ACTIONS_KEYS = ("deliveries", "silences", "drain")
"""The actions stage's parts of the document, in the order the text shows them."""


def _health(g: Mapping[str, Any]) -> GpuHealth:
    """A GPU's verdict as the daemon sent it; from an older daemon that sent none, judged
    from its status alone (``StatusDocument`` adds its firing alerts)."""
    if isinstance(g.get("health"), str):
        rules = g.get("health_rules") or []
        return GpuHealth(str(g["health"]), tuple(str(r) for r in rules))
    return gpu_health(str(g.get("status", "?")), [])


@dataclass(frozen=True, kw_only=True)
class GpuEntry(Doc):
    """One GPU: what identifies it, its poll status, its health verdict and its readings
    (current ones when it answers, the last ones it gave when it does not)."""

    index: Any = field(metadata=spec(missing="?"))
    pci_bus_id: str
    name: str
    more: Mapping[str, Any] = field(default_factory=dict)
    status: str = field(metadata=spec(missing="?"))
    health: GpuHealth = field(
        metadata=spec(keys=("health", "health_rules"), reader=_health, writer=lambda h: h.as_dict())
    )
    readings: Mapping[str, Any] | None = field(default=None, metadata=spec(omit_none=True))
    clock_event_reasons: tuple[str, ...] | None = field(default=None, metadata=spec(omit_none=True))
    last_readings: Mapping[str, Any] | None = field(default=None, metadata=spec(omit_none=True))
    last_readings_at: float | None = field(default=None, metadata=spec(omit_none=True))


@dataclass(frozen=True, kw_only=True)
class FiringAlert(Doc):
    """One firing alert: its rule, severity, labels, texts and (for the trend rules) the
    history it judged."""

    rule: str = field(metadata=spec(missing="?"))
    severity: str = field(metadata=spec(missing="?"))
    labels: Mapping[str, str]
    since: float | None = None
    more: Mapping[str, Any] = field(default_factory=dict)
    summary: str | None = None
    fingerprint: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)
    history: Mapping[str, Any] | None = field(default=None, metadata=spec(omit_none=True))

    @property
    def gpu(self) -> str | None:
        gpu = self.labels.get("gpu")
        return None if gpu in (None, "") else str(gpu)


@dataclass(frozen=True, kw_only=True)
class SourceEntry(Doc):
    """One input (nvml, the kernel log, ...): up or down, and why."""

    up: bool
    detail: str
    more: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ConfigState(Doc):
    """The config file, the last reload and the keys that wait for a restart."""

    file: Any
    last_reload: Mapping[str, Any] | None
    restart_required: Mapping[str, str]


@dataclass(frozen=True, kw_only=True)
class ReceiverState(Doc):
    """One receiver's deliveries: how many wait, the oldest's age, the last error."""

    name: str = field(metadata=spec(missing="?"))
    type: str = field(metadata=spec(missing="?"))
    pending: int
    oldest_pending_seconds: float | None
    last_error: str | None
    more: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DeliveryFiring(Doc):
    """A firing alert as the outbox knows it, and the silence that mutes it, if any."""

    rule: str = field(metadata=spec(missing="?"))
    severity: str = field(metadata=spec(missing="?"))
    labels: Mapping[str, str]
    since: float | None
    silenced_by: str | None
    more: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Deliveries(Doc):
    """The outbox: pending deliveries by receiver, and the alerts it holds as firing."""

    pending: int
    state_problem: str | None
    receivers: tuple[ReceiverState, ...]
    firing: tuple[DeliveryFiring, ...]
    more: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class SilenceState(Doc):
    """One silence: what it mutes, until when, why and who said so."""

    id: str = field(metadata=spec(missing="?"))
    gpu: str | None
    ends_at: float | None
    reason: str
    author: str
    active: bool
    more: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class DrainState(Doc):
    """The drain's summary: its mode and, when a drain is configured, the node's drain
    state, the pending drain's time and reason, and the drains spent in the window."""

    mode: str = field(default="none", metadata=spec(missing="none"))
    dry_run: bool = False
    state: str = field(default="", metadata=spec(missing="?"))
    drain_at: float | None = None
    reason: str | None = None
    drains_in_window: int = 0
    max_drains: int = 0
    more: Mapping[str, Any] = field(default_factory=dict)

    @property
    def configured(self) -> bool:
        return self.mode != "none"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DrainState:
        """Without a drain (mode ``none``) only the mode is read; the rest is kept."""
        mode = str(data.get("mode", "none"))
        if mode == "none":
            return cls(mode=mode, more={k: v for k, v in data.items() if k != "mode"})
        return read(cls, data)

    def as_json(self) -> dict[str, Any]:
        if not self.configured:
            return {"mode": self.mode, **self.more}
        return write(self)


_ABSENT = spec(omit_none=True)


@dataclass(frozen=True, kw_only=True)
class ActionsState(Doc):
    """The actions stage's part of the status (absent when nothing is configured to
    receive): deliveries, silences, the drain (``ACTIONS_KEYS``)."""

    deliveries: Deliveries | None = field(default=None, metadata=_ABSENT)
    silences: tuple[SilenceState, ...] | None = field(default=None, metadata=_ABSENT)
    drain: DrainState | None = field(default=None, metadata=_ABSENT)


def _gpus(doc: Mapping[str, Any]) -> tuple[GpuEntry, ...]:
    """The GPUs; from an older daemon that sent no verdict, each is judged with its
    firing alerts, as the daemon does."""
    alerts = doc.get("alerts")
    listed = alerts if isinstance(alerts, list) else []
    firing = [FiringAlert.from_json(a) for a in listed if isinstance(a, Mapping)]
    by_gpu = firing_by_gpu(a.as_json() for a in firing)
    out = []
    for g in doc.get("gpus") or ():
        if not isinstance(g, Mapping):
            continue
        entry = GpuEntry.from_json(g)
        if not isinstance(g.get("health"), str):
            verdict = gpu_health(entry.status, by_gpu.get(str(g.get("index", "?")), []))
            entry = replace(entry, health=verdict)
        out.append(entry)
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class StatusDocument(Doc):
    """The whole status of one node (``from_json``: from its wire form, the status
    socket's ``status`` or /api/v1/status; ``as_json``: the keys /api/v1/status, the
    status socket and ``gpuwatchd status --json`` have always had)."""

    node: str = field(metadata=spec(missing="?"))
    version: str = field(metadata=spec(missing="?"))
    now: float | None
    started_at: float | None = None
    backend: str = field(metadata=spec(missing="?"))
    gpus: tuple[GpuEntry, ...] = field(metadata=spec(reader=_gpus, keys=("gpus",)))
    gpus_expected: int | None = None
    sources: Mapping[str, SourceEntry]
    xid_counts: tuple[Mapping[str, Any], ...] = ()
    alerts: tuple[FiringAlert, ...] | None = field(metadata=_ABSENT)
    nvml_worker: Mapping[str, Any] | None = field(default=None, metadata=_ABSENT)
    fields: Any = field(default=None, metadata=_ABSENT)
    actions: ActionsState = field(default_factory=ActionsState, metadata=spec(flat=True))
    more: Mapping[str, Any] = field(default_factory=dict)
    config: ConfigState | None = field(default=None, metadata=_ABSENT)

    def with_config(self, config: ConfigState) -> StatusDocument:
        return replace(self, config=config)
