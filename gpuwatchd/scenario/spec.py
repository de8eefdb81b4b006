"""A scenario as parsed, before it is compiled: its GPU entries and its timeline events,
with the vocabulary of the file (transports, limits).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatchd.core.errors import Location
from gpuwatchd.scenario.gpumodels import KNOWN_MODELS

TRANSPORTS: tuple[str, ...] = ("kernel", "syslog", "kmsg-user")
"""How a kernel-log line reaches the log: from the kernel (trusted), forged through syslog
by a user process, or written into /dev/kmsg by a user process (facility != 0)."""


MAX_GPUS = 64
MAX_XID = 1023


@dataclass
class GpuEntry:
    loc: Location
    uuid: str | None
    pci_bus_id: str | None
    model: str
    model_loc: Location
    model_what: str
    nvlink_links: int | None
    serial: str | None
    vbios: str | None


@dataclass
class Event:
    order: int
    at: float
    what: str
    gpus: tuple[int, ...]
    links: tuple[int, ...] | None
    gpu_named: bool = False
    note: str | None = None
    sets: list[tuple[str, float]] = field(default_factory=list)
    adds: list[tuple[str, float]] = field(default_factory=list)
    ramps: list[tuple[str, float]] = field(default_factory=list)
    throttle: int | None = None
    lose: bool = False
    recover: bool = False
    stall: float | None = None
    kernel_log: str | None = None
    transport: str = "kernel"
    nvml_xid: int | None = None


def links_of(gpu: GpuEntry) -> int:
    if gpu.nvlink_links is not None:
        return gpu.nvlink_links
    model = KNOWN_MODELS.get(gpu.model)
    return model.nvlink_links if model is not None else 0
