"""The in-memory picture of the node that scrapes, status and the demo read.

Writers (the poller, log sources) update it under a lock; readers take an immutable
``NodeView`` in O(GPUs) without touching NVML. A version number changes on every write so
that renderers can cache their output between polls.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.records import GpuInfo, GpuSample, GpuStatus

XID_CODES_APART = 1024  # codes below this (NVIDIA's are under 200) are always counted apart
MAX_XID_KEYS = 4096  # distinct (GPU, code) pairs counted apart before larger codes fold
XID_OVERFLOW = -1  # the code a larger one is counted under beyond MAX_XID_KEYS


@dataclass(frozen=True)
class SourceHealth:
    """How one input (nvml, journald, kmsg, nvml-events, ...) is doing."""

    name: str
    up: bool
    last_success: float | None = None
    last_duration: float | None = None
    errors: int = 0
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "up": self.up,
            "last_success": self.last_success,
            "last_duration_seconds": self.last_duration,
            "errors": self.errors,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class GpuState:
    info: GpuInfo
    status: GpuStatus
    sample: GpuSample | None  # the last sample that answered (status OK), if any
    last_success: float | None
    status_since: float
    polls: int = 0
    failures: int = 0


@dataclass(frozen=True)
class NodeView:
    node_name: str
    version: int
    started_at: float
    gpus: tuple[GpuState, ...]
    sources: Mapping[str, SourceHealth]
    xid_counts: Mapping[tuple[int | None, int], int]  # (gpu index or None, xid) -> count
    last_xid: Mapping[int | None, int] = field(default_factory=lambda: MappingProxyType({}))
    expected_gpus: int | None = None
    extra: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    pci_gpus: int | None = None  # NVIDIA GPUs on the PCI bus (udev/sysfs); None: not watched
    # Reports the driver attributed to a MIG instance, apart from xid_counts' totals:
    # (gpu index or None, xid, GPU instance, compute instance or None) -> count.
    mig_xid_counts: Mapping[tuple[int | None, int, int, int | None], int] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # NVSwitch SXids: (switch PCI bus id, fatal|nonfatal|detail) -> count.
    sxid_counts: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    # NVLink5 XIDs 144-150 by decoded verdict: (gpu, xid, fatal|nonfatal|undecoded) -> count.
    xid_verdict_counts: Mapping[tuple[int | None, int, str], int] = field(
        default_factory=lambda: MappingProxyType({})
    )


class NodeState:
    """Thread-safe store behind ``NodeView``."""

    def __init__(self, node_name: str, started_at: float, expected_gpus: int | None = None):
        self._lock = threading.Lock()
        self._node_name = node_name
        self._started_at = started_at
        self._expected = expected_gpus
        self._version = 0
        self._gpus: dict[int, GpuState] = {}
        self._sources: dict[str, SourceHealth] = {}
        self._xids: dict[tuple[int | None, int], int] = {}
        self._last_xid: dict[int | None, int] = {}
        self._mig_xids: dict[tuple[int | None, int, int, int | None], int] = {}
        self._verdicts: dict[tuple[int | None, int, str], int] = {}
        self._sxids: dict[tuple[str, str], int] = {}
        self._pci_gpus: int | None = None
        self._view: NodeView | None = None

    # -- writers ---------------------------------------------------------------------
    def _touch(self) -> None:
        self._version += 1
        self._view = None

    def set_gpus(self, infos: list[GpuInfo], now: float) -> None:
        with self._lock:
            self._gpus = {i.index: GpuState(i, GpuStatus.OK, None, None, now) for i in infos}
            self._touch()

    def record_sample(self, sample: GpuSample) -> GpuStatus | None:
        """Store a poll result; returns the previous status when it changed, else None."""
        with self._lock:
            old = self._gpus.get(sample.gpu)
            if old is None:
                return None
            changed = old.status is not sample.status
            ok = sample.status is GpuStatus.OK
            self._gpus[sample.gpu] = GpuState(
                info=old.info,
                status=sample.status,
                sample=sample if ok else old.sample,
                last_success=sample.timestamp if ok else old.last_success,
                status_since=sample.timestamp if changed else old.status_since,
                polls=old.polls + 1,
                failures=old.failures + (0 if ok else 1),
            )
            self._touch()
            return old.status if changed else None

    def set_status(self, gpu: int, status: GpuStatus, now: float) -> GpuStatus | None:
        """Change a GPU's status without a sample (e.g. stale); previous status if changed."""
        with self._lock:
            old = self._gpus.get(gpu)
            if old is None or old.status is status:
                return None
            self._gpus[gpu] = GpuState(
                old.info, status, old.sample, old.last_success, now, old.polls, old.failures
            )
            self._touch()
            return old.status

    def source(
        self,
        name: str,
        *,
        up: bool,
        now: float,
        duration: float | None = None,
        detail: str = "",
    ) -> None:
        with self._lock:
            old = self._sources.get(name)
            errors = (old.errors if old else 0) + (0 if up else 1)
            last_success = now if up else (old.last_success if old else None)
            self._sources[name] = SourceHealth(
                name,
                up,
                last_success,
                duration if duration is not None else (old.last_duration if old else None),
                errors,
                detail,
            )
            self._touch()

    def source_up(self, name: str) -> bool:
        """Whether the source last reported itself up (never reported: not up)."""
        with self._lock:
            health = self._sources.get(name)
        return health is not None and health.up

    def count_xid(
        self,
        gpu: int | None,
        xid: int,
        n: int = 1,
        *,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        verdict: str | None = None,
    ) -> None:
        """Count ``n`` reports; a MIG-attributed one is also counted per instance, a
        decoded one (XIDs 144-150) by its ``verdict``. A code below ``XID_CODES_APART``
        always has its own count; a larger one only while fewer than ``MAX_XID_KEYS``
        (GPU, code) pairs are counted, else it is counted under ``XID_OVERFLOW`` of its GPU,
        so distinct codes cannot grow memory and the status API without bound (issue 26)."""
        with self._lock:
            key = (gpu, xid)
            if (
                not 0 <= xid < XID_CODES_APART
                and key not in self._xids
                and len(self._xids) >= MAX_XID_KEYS
            ):
                key = (gpu, XID_OVERFLOW)
            self._xids[key] = self._xids.get(key, 0) + n
            if gpu_instance is not None:
                mig = (gpu, xid, gpu_instance, compute_instance)
                self._mig_xids[mig] = self._mig_xids.get(mig, 0) + n
            if verdict is not None:
                judged = (gpu, xid, verdict)
                self._verdicts[judged] = self._verdicts.get(judged, 0) + n
            self._last_xid[gpu] = xid
            self._touch()

    def count_sxid(self, pci_bus_id: str, verdict: str, n: int = 1) -> None:
        """Count ``n`` NVSwitch SXid lines of one switch by what they say (``sxid_verdict``)."""
        with self._lock:
            key = (pci_bus_id, verdict)
            self._sxids[key] = self._sxids.get(key, 0) + n
            self._touch()

    def set_pci_gpus(self, count: int | None) -> None:
        """How many NVIDIA GPUs the PCI bus shows (``gpuwatchd.sources.gpu.pci``); None: unknown."""
        with self._lock:
            if count != self._pci_gpus:
                self._pci_gpus = count
                self._touch()

    def touch(self) -> None:
        """Mark the view changed (e.g. rule counters moved) so cached renders refresh."""
        with self._lock:
            self._touch()

    # -- readers ---------------------------------------------------------------------
    @property
    def version(self) -> int:
        return self._version

    def view(self) -> NodeView:
        with self._lock:
            if self._view is None:
                self._view = NodeView(
                    node_name=self._node_name,
                    version=self._version,
                    started_at=self._started_at,
                    gpus=tuple(self._gpus[k] for k in sorted(self._gpus)),
                    sources=MappingProxyType(dict(self._sources)),
                    xid_counts=MappingProxyType(dict(self._xids)),
                    last_xid=MappingProxyType(dict(self._last_xid)),
                    expected_gpus=self._expected,
                    pci_gpus=self._pci_gpus,
                    mig_xid_counts=MappingProxyType(dict(self._mig_xids)),
                    xid_verdict_counts=MappingProxyType(dict(self._verdicts)),
                    sxid_counts=MappingProxyType(dict(self._sxids)),
                )
            return self._view
