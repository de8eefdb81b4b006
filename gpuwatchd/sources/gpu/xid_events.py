"""NVML XID events: the XID number within milliseconds of the fault, without log text.

``XidEventReader`` owns one thread that waits in ``nvmlEventSetWait`` (through a backend
that is an ``XidEventSource``) and hands every event to its ``sink`` (the XID intake). It
reports its own health on the node's source board (``nvml_events``): a failing wait
marks the source down and is retried after ``retry_s``. It beats its heartbeat every
turn so the watchdog notices a wedged wait.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendError
from gpuwatchd.core.heartbeat import Heartbeat
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.gpu.backend import XidEventSource

log = logging.getLogger(__name__)

SOURCE = "nvml_events"


class NvmlEventSink(Protocol):
    def nvml_event(self, event: XidEvent) -> None: ...


class SourceBoard(Protocol):
    """Where a source says whether it works (the node state)."""

    def source(self, name: str, *, up: bool, now: float, detail: str = "") -> None: ...

    def source_up(self, name: str) -> bool: ...


# How long one wait on a supervised backend (the NVML worker) lasts when no event comes
SUPERVISED_EVENT_WAIT_S = 10.0


class XidEventReader:
    def __init__(
        self,
        backend: XidEventSource,
        clock: Clock,
        sink: NvmlEventSink,
        board: SourceBoard,
        *,
        wait_s: float,
        retry_s: float,
    ) -> None:
        self.backend = backend
        self.clock = clock
        self.sink = sink
        self.board = board
        self.wait_s = wait_s
        self.retry_s = retry_s
        self.heartbeat: Heartbeat | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self, timeout_s: float) -> None:
        """One wait: deliver what arrived, or mark the source down."""
        try:
            events = self.backend.wait_xid_events(timeout_s)
        except BackendError as exc:
            if self.board.source_up(SOURCE) or self._thread is None:
                log.warning("NVML XID events unavailable: %s", exc)
            self.board.source(SOURCE, up=False, now=self.clock.now(), detail=str(exc))
            self.clock.wait(self._stop, self.retry_s)
            return
        if not self.board.source_up(SOURCE):
            self.board.source(SOURCE, up=True, now=self.clock.now())
        for event in events:
            if self._stop.is_set():
                return
            self.sink.nvml_event(event)

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.heartbeat is not None:
                self.heartbeat.beat()
            self.step(self.wait_s)

    def start(self) -> None:
        # Up from the start, not from the first wait's return (a whole wait later): the
        # merger must expect this path's reports at once, or a fault in the first seconds
        # would count twice (its kernel line first, then its NVML event as a new incident).
        self.board.source(SOURCE, up=True, now=self.clock.now())
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Ask the thread to end; with ``wait``, join it (a wait in progress runs out its
        timeout unless the backend is closed meanwhile, which ends it at once)."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(self.wait_s + 2.0)
