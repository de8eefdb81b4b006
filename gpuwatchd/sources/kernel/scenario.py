"""Kernel-log lines scripted in a scenario (the scenario backend), replayed as their time
comes: ``simulate``, ``demo`` and the tests' daemons read them as the real daemon reads
journald or /dev/kmsg. Chosen by ``sources.kernel_log: auto`` whenever the backend scripts
lines."""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable

from gpuwatchd.core.clock import Clock
from gpuwatchd.sources.kernel.kind import KernelLogKind, KernelLogSetup, StatusFn
from gpuwatchd.sources.kernel.linehandler import KernelLineHandler


@runtime_checkable
class ScriptedKernelLog(Protocol):
    """A backend that scripts kernel-log lines (the scenario backend)."""

    def kernel_log_lines_until(self, t: float) -> list[tuple[float, str, str]]: ...

    def next_event_after(self, t: float) -> float | None: ...


class ScenarioKernelSource:
    """Kernel-log lines scripted in a scenario, replayed as their time comes."""

    name = "scenario"

    def __init__(
        self,
        backend: ScriptedKernelLog,
        handler: KernelLineHandler,
        clock: Clock,
        status: StatusFn | None = None,
    ) -> None:
        self.backend = backend
        self.handler = handler
        self.clock = clock
        self.status = status or (lambda up, detail: None)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def pump(self, now: float) -> None:
        for ts, transport, line in self.backend.kernel_log_lines_until(now):
            self.handler.handle(line, ts, transport == "kernel")

    def _run(self) -> None:
        while not self._stop.is_set():
            now = self.clock.now()
            self.pump(now)
            upcoming = self.backend.next_event_after(now)  # sleep until the next line is due
            wait = 1.0 if upcoming is None else min(1.0, max(upcoming - now, 0.0))
            self.clock.wait(self._stop, wait)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scenario-kernel", daemon=True)
        self._thread.start()
        self.status(True, "replaying the scenario's kernel-log lines")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)


def _build(setup: KernelLogSetup) -> ScenarioKernelSource:
    from gpuwatchd.core.errors import BackendUnavailable

    if not isinstance(setup.backend, ScriptedKernelLog):
        raise BackendUnavailable("sources.kernel_log: scenario needs the scenario backend")
    return ScenarioKernelSource(setup.backend, setup.handler, setup.clock, setup.status)


KIND = KernelLogKind(
    "scenario",
    available=lambda sources, backend: isinstance(backend, ScriptedKernelLog),
    build=_build,
    scripted=True,
)
