"""Typed, frozen records that sources emit and everything downstream consumes.

Sources only observe: they never decide severity. A ``GpuSample`` is one poll of one GPU,
in Prometheus base units (celsius, watts, hertz, bytes, seconds, ratios 0-1). Field names
are the keys of ``gpuwatchd.core.fields.GPU_FIELDS`` and ``LINK_FIELDS``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

_EMPTY: Mapping[str, float] = MappingProxyType({})
_EMPTY_TEXT: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class GpuInfo:
    """What is read once per GPU when the backend opens."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str  # NVML form: 00000000:3B:00.0
    serial: str = ""
    vbios: str = ""
    driver: str = ""
    ecc_enabled: bool | None = None
    ecc_pending: bool | None = None
    slowdown_temperature: float | None = None
    shutdown_temperature: float | None = None
    memory_max_temperature: float | None = None
    nvlink_count: int = 0
    # The PCI bus ids (NVML form) at the far end of the GPU's NVLinks: the NVSwitches (or
    # peer GPUs) it is wired to, read once at open; empty where NVML does not say.
    nvlink_peers: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "pci_bus_id": self.pci_bus_id,
            "serial": self.serial,
            "vbios": self.vbios,
            "driver": self.driver,
            "ecc_enabled": self.ecc_enabled,
            "ecc_pending": self.ecc_pending,
            "slowdown_temperature_celsius": self.slowdown_temperature,
            "shutdown_temperature_celsius": self.shutdown_temperature,
            "memory_max_temperature_celsius": self.memory_max_temperature,
            "nvlink_count": self.nvlink_count,
        }
        if self.nvlink_peers:
            out["nvlink_peers"] = list(self.nvlink_peers)
        return out


class GpuStatus(enum.Enum):
    OK = "ok"
    LOST = "lost"  # GPU_IS_LOST: fell off the bus
    STALE = "stale"  # a call has not returned within its budget
    ERROR = "error"  # the whole poll failed for another reason (reset required, ...)


@dataclass(frozen=True)
class LinkSample:
    link: int
    fields: Mapping[str, float] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True)
class GpuSample:
    """One poll of one GPU. ``fields`` holds only what the GPU answered."""

    gpu: int
    uuid: str
    timestamp: float
    status: GpuStatus = GpuStatus.OK
    fields: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    links: tuple[LinkSample, ...] = ()
    processes: tuple[ProcessInfo, ...] = ()
    duration_seconds: float = 0.0
    error: str | None = None
    errors: Mapping[str, str] = field(default_factory=lambda: _EMPTY_TEXT)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "timestamp": round(self.timestamp, 6),
            "status": self.status.value,
            "fields": {k: self.fields[k] for k in sorted(self.fields)},
        }
        if self.links:
            out["links"] = {
                str(ls.link): {k: ls.fields[k] for k in sorted(ls.fields)} for ls in self.links
            }
        if self.processes:
            out["processes"] = [p.pid for p in self.processes]
        if self.error:
            out["error"] = self.error
        return out


class DeviceEventKind(enum.Enum):
    LOST = "gpu_lost"
    RECOVERED = "gpu_recovered"
    STALE = "gpu_stale"
    FRESH = "gpu_fresh"
    ERROR = "gpu_error"
    MISSING = "gpu_missing"  # fewer GPUs than expected


@dataclass(frozen=True)
class DeviceEvent:
    """A change in a GPU's reachability, emitted by the poller."""

    kind: DeviceEventKind
    gpu: int
    uuid: str
    pci_bus_id: str
    timestamp: float
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "record": "device",
            "event": self.kind.value,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "timestamp": round(self.timestamp, 6),
            "detail": self.detail,
        }


@dataclass(frozen=True)
class XidEvent:
    """One XID (or NVSwitch SXid) seen by a source; ``trusted`` is the source's verdict."""

    timestamp: float
    source: str  # journald | kmsg | nvml | scenario
    xid: int
    kind: str = "xid"  # xid | sxid
    pci_bus_id: str | None = None
    gpu: int | None = None
    uuid: str | None = None
    pid: int | None = None
    process: str | None = None
    message: str = ""
    trusted: bool = True
    # The partner report (the other path) of an incident already emitted: it brings the
    # details the first report lacked (text, pid, process, both provenances) and is
    # never a new incident of its own.
    enriches: bool = False
    # MIG attribution from the driver's line (``GPU-I:02 GPU-CI:00``); None on a whole GPU
    # or when the report came from NVML, which does not say.
    gpu_instance: int | None = None
    compute_instance: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "record": "xid",
            "source": self.source,
            "kind": self.kind,
            "xid": self.xid,
            "gpu": self.gpu,
            "uuid": self.uuid,
            "pci_bus_id": self.pci_bus_id,
            "pid": self.pid,
            "process": self.process,
            "message": self.message,
            "trusted": self.trusted,
            "timestamp": round(self.timestamp, 6),
        }
        if self.enriches:
            out["enriches"] = True
        if self.gpu_instance is not None:
            out["gpu_instance"] = self.gpu_instance
        if self.compute_instance is not None:
            out["compute_instance"] = self.compute_instance
        return out


class DrainOutcomeKind(enum.Enum):
    """What a drain came to that someone must hear about (the rule stage decides who)."""

    FAILED = "failed"  # the scheduler refused the drain ``attempts`` times
    LIMIT_REACHED = "limit_reached"  # the node's ``max_drains`` per ``window`` is spent
    OVER_BUDGET = "over_budget"  # the fleet's drain budget is spent: not draining
    BREAKER_OPEN = "breaker_open"  # too many nodes want to drain at once: the fleet stops


DRAIN_OUTCOME_KINDS = tuple(k.value for k in DrainOutcomeKind)


@dataclass(frozen=True)
class DrainOutcome:
    """One drain outcome, or its end (``holds=False``), as the drain stage reports it.

    ``key`` tells outcomes of one kind apart (the incident's key for a failed drain; empty
    where there is one per node). ``summary`` is the drain's own account, with its final
    counts; ``counts`` the numbers and names behind it (``xids``, ``drained_nodes``,
    ``likely_cause``, ...). ``gpu``, ``uuid`` and ``pci_bus_id`` name the GPU whose fault
    asked for the drain, where one did.
    """

    timestamp: float
    kind: DrainOutcomeKind
    node: str
    holds: bool = True
    key: str = ""
    reason: str = ""
    summary: str = ""
    counts: Mapping[str, str] = field(default_factory=lambda: _EMPTY_TEXT)
    gpu: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "record": "drain_outcome",
            "kind": self.kind.value,
            "node": self.node,
            "holds": self.holds,
            "key": self.key,
            "reason": self.reason,
            "summary": self.summary,
            "timestamp": round(self.timestamp, 6),
        }
        if self.counts:
            out["counts"] = dict(self.counts)
        for name in ("gpu", "uuid", "pci_bus_id"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out
