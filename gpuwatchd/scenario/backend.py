"""The scenario backend: a scripted node that answers like NVML would.

Scenario time is ``clock.now() - t0``, where ``t0`` is the clock reading at ``open()``;
past the scenario's duration the final state holds. With a ``SystemClock`` or a
``ScaledClock`` (``run --backend scenario:PATH``, ``demo``), a stalled GPU really blocks
the calling thread until the stall ends or ``close()`` is called. With a ``VirtualClock``
(``simulate``, tests) nothing may block, so pass ``real_stalls=False``: a stalled call
raises ``CallTimeout`` at once, which is what the poller would have concluded.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendError, CallTimeout, GpuLost
from gpuwatchd.core.records import GpuInfo, GpuSample, XidEvent
from gpuwatchd.scenario.model import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_TIMEOUT, Scenario

__all__ = ["ScenarioBackend"]


class ScenarioBackend:
    """``Backend`` and ``XidEventSource`` over a compiled ``Scenario``."""

    name = "scenario"

    def __init__(self, scenario: Scenario, clock: Clock, real_stalls: bool = True) -> None:
        self.scenario = scenario
        self.clock = clock
        self.real_stalls = real_stalls
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0: float | None = None
        self._infos: list[GpuInfo] = scenario.gpu_infos()
        self._xids = scenario.nvml_xids()
        self._xid_next = 0
        self._kernel = scenario.kernel_lines()
        self._kernel_next = 0

    # -- time ------------------------------------------------------------------------
    @property
    def t0(self) -> float:
        """The clock reading that is scenario time 0 (set by ``open``)."""
        if self._t0 is None:
            raise BackendError("scenario backend used before open()")
        return self._t0

    def elapsed(self) -> float:
        """Scenario seconds since ``open``, clamped to the scenario's duration."""
        return min(max(self.clock.now() - self.t0, 0.0), self.scenario.duration)

    def finished(self) -> bool:
        return self.clock.now() - self.t0 >= self.scenario.duration

    # -- Backend ---------------------------------------------------------------------
    def open(self) -> list[GpuInfo]:
        with self._lock:
            if self._t0 is None:
                self._t0 = self.clock.now()
            self._stop.clear()
        return list(self._infos)

    def close(self) -> None:
        self._stop.set()

    def sample(self, index: int) -> GpuSample:
        if not 0 <= index < len(self._infos):
            raise BackendError(f"no GPU {index} in scenario {self.scenario.name!r}")
        info = self._infos[index]
        began = self.clock.monotonic()
        while True:
            t = self.elapsed()
            state = self.scenario.state_at(index, t)
            if state.status == "lost":
                raise GpuLost(
                    f"GPU {index} ({info.pci_bus_id}) is lost (scenario)",
                    code=NVML_ERROR_GPU_IS_LOST,
                )
            if state.status == "ok":
                break
            assert state.until is not None
            if not self.real_stalls:
                raise CallTimeout(
                    f"GPU {index} does not answer (scenario stall until {state.until:g}s)",
                    code=NVML_ERROR_TIMEOUT,
                )
            if self._stop.is_set() or self.clock.wait(self._stop, state.until - t):
                raise CallTimeout(f"GPU {index}: backend closed during a stall")
            if self.elapsed() <= t:
                # A clock that does not move while we wait (a VirtualClock) would spin.
                raise CallTimeout(f"GPU {index} does not answer (clock did not advance)")
        fields, links, processes = self.scenario.values_at(index, t)
        return GpuSample(
            gpu=index,
            uuid=info.uuid,
            timestamp=self.clock.now(),
            fields=MappingProxyType(fields),
            links=links,
            processes=processes,
            duration_seconds=max(self.clock.monotonic() - began, 0.0),
        )

    # -- events ----------------------------------------------------------------------
    def _due_xids(self) -> list[XidEvent]:
        with self._lock:
            now = self.clock.now() - self.t0
            out: list[XidEvent] = []
            while self._xid_next < len(self._xids) and self._xids[self._xid_next][0] <= now:
                at, gpu, xid = self._xids[self._xid_next]
                self._xid_next += 1
                info = self._infos[gpu]
                out.append(
                    XidEvent(
                        timestamp=self.t0 + at,
                        source="nvml",
                        xid=xid,
                        pci_bus_id=info.pci_bus_id,
                        gpu=gpu,
                        uuid=info.uuid,
                    )
                )
            return out

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        """NVML XID events whose time has come since the last call.

        When none is due, waits (on the backend's clock) up to ``timeout_s`` or until the
        next one is due, whichever is sooner, like ``nvmlEventSetWait``.
        """
        due = self._due_xids()
        if due or self._stop.is_set():
            return due
        with self._lock:
            upcoming = self._xids[self._xid_next][0] if self._xid_next < len(self._xids) else None
        wait = timeout_s
        if upcoming is not None:
            wait = min(wait, max(self.t0 + upcoming - self.clock.now(), 0.0))
        if wait > 0:
            self.clock.wait(self._stop, wait)
        return self._due_xids()

    def next_event_after(self, t: float) -> float | None:
        """The clock time of the first scripted kernel-log line or NVML XID event still to
        come after ``t`` (None when there is none): where a stepped run stops its clock."""
        limit = t - self.t0
        with self._lock:
            found = [
                _first_after(self._kernel, self._kernel_next, limit),
                _first_after(self._xids, self._xid_next, limit),
            ]
        times = [self.t0 + at for at in found if at is not None]
        return min(times) if times else None

    def kernel_log_lines_until(self, t: float) -> list[tuple[float, str, str]]:
        """``(timestamp, transport, line)`` of kernel-log lines up to clock time ``t``,
        each line once (lines already returned by an earlier call are not repeated)."""
        with self._lock:
            limit = t - self.t0
            out: list[tuple[float, str, str]] = []
            while (
                self._kernel_next < len(self._kernel)
                and self._kernel[self._kernel_next][0] <= limit
            ):
                at, transport, line = self._kernel[self._kernel_next]
                self._kernel_next += 1
                out.append((self.t0 + at, transport, line))
            return out


def _first_after(timeline: Sequence[tuple[Any, ...]], start: int, limit: float) -> float | None:
    """The time of the first entry from ``start`` on (sorted by time) later than ``limit``."""
    for i in range(start, len(timeline)):
        at = float(timeline[i][0])
        if at > limit:
            return at
    return None
