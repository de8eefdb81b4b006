"""A programmable in-memory backend for tests of the poller, metrics and daemon.

Unlike the scenario backend (a product feature driven by YAML), this one is driven by
the test itself: set fields, lose a GPU, or block its calls until released.
"""

from __future__ import annotations

import threading
from types import MappingProxyType

from gpuwatchd.core.clock import Clock, SystemClock
from gpuwatchd.core.errors import GpuLost
from gpuwatchd.core.records import GpuInfo, GpuSample, LinkSample
from gpuwatchd.scenario.gpumodels import DRIVER_VERSION, H100, HGX_BUS_IDS, KNOWN_MODELS, at_work


def make_infos(count: int, links: int = 18, model: str = H100.name) -> list[GpuInfo]:
    """``count`` GPUs of a known model (``gpuwatchd.scenario.gpumodels``), on the HGX bus
    ids the scenario backend uses."""
    spec = KNOWN_MODELS[model]
    return [
        GpuInfo(
            index=i,
            uuid=f"GPU-00000000-0000-4000-8000-{i:012x}",
            name=model,
            pci_bus_id=f"00000000:{HGX_BUS_IDS[i % 8]}:{i // 8:02X}.0",
            serial=f"165{i:010d}",
            vbios=spec.vbios,
            driver=DRIVER_VERSION,
            ecc_enabled=True,
            ecc_pending=True,
            slowdown_temperature=spec.slowdown_temperature,
            shutdown_temperature=spec.shutdown_temperature,
            memory_max_temperature=spec.memory_max_temperature,
            nvlink_count=links,
        )
        for i in range(count)
    ]


# An H100 at light work: the baseline table with what a small job changes (clocks up,
# some memory and energy used, warmer, the "idle" clock-event reason still set).
DEFAULT_FIELDS = at_work(
    H100,
    temperature_gpu=41.0,
    temperature_memory=38.0,
    power=118.5,
    energy=1.5e6,
    sm_clock=1.98e9,
    memory_used=5.5e8,
    clock_event_reasons=1.0,
)
DEFAULT_LINK_FIELDS = {
    "nvlink_up": 1.0,
    "nvlink_replay_errors": 0.0,
    "nvlink_recovery_errors": 0.0,
    "nvlink_crc_errors": 0.0,
}


class FakeBackend:
    name = "fake"

    def __init__(self, count: int = 8, links: int = 18, clock: Clock | None = None) -> None:
        self.clock = clock or SystemClock()
        self.infos = make_infos(count, links)
        self.fields = [dict(DEFAULT_FIELDS) for _ in range(count)]
        self.link_fields = [[dict(DEFAULT_LINK_FIELDS) for _ in range(links)] for _ in range(count)]
        self.lost: set[int] = set()
        self.blocked: dict[int, threading.Event] = {}
        self.calls = [0] * count
        self._lock = threading.Lock()

    def open(self) -> list[GpuInfo]:
        return list(self.infos)

    def close(self) -> None:
        for event in self.blocked.values():
            event.set()

    def block(self, gpu: int) -> threading.Event:
        """Make the GPU's next calls hang until the returned event is set."""
        event = threading.Event()
        self.blocked[gpu] = event
        return event

    def sample(self, index: int) -> GpuSample:
        with self._lock:
            self.calls[index] += 1
        gate = self.blocked.get(index)
        if gate is not None:
            gate.wait()
        if index in self.lost:
            raise GpuLost("GPU has fallen off the bus (fake)", 15)
        info = self.infos[index]
        links = tuple(
            LinkSample(n, MappingProxyType(dict(f))) for n, f in enumerate(self.link_fields[index])
        )
        return GpuSample(
            gpu=index,
            uuid=info.uuid,
            timestamp=self.clock.now(),
            fields=MappingProxyType(dict(self.fields[index])),
            links=links,
            duration_seconds=0.0002,
        )
