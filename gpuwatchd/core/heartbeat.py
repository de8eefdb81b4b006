"""Liveness of the daemon's workers, for the systemd watchdog and ``/healthz``.

Every long-running worker proves it is making progress in one of two ways:

- it owns a ``Heartbeat`` and calls ``beat()`` on every turn of its loop, including the
  turns where nothing happened (a reader's ``wait(timeout)`` that timed out)::

      hb = daemon.heartbeats.register("journald", max_silence=30.0)
      while not stop.is_set():
          hb.beat()
          ...
      hb.close()           # a worker that ends on purpose unregisters

- or it already keeps a counter that moves on every turn (``Poller.cycles``,
  ``Daemon.evaluations``): ``watch("poller", lambda: poller.cycles, max_silence)``.

``check()`` names every worker that has not made progress for longer than its
``max_silence``, and at once every worker that reported its own death (``fail``). The
watchdog supervisor calls it before each ``WATCHDOG=1``: one wedged worker stops the pings
and systemd restarts the daemon. Choose ``max_silence`` well above the longest legitimate
pause of the loop (a few loop periods).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatchd.core.clock import Clock

__all__ = ["Heartbeat", "HeartbeatRegistry", "Stall"]


@dataclass(frozen=True)
class Stall:
    name: str
    silent_for: float  # seconds without progress
    max_silence: float
    failure: str | None = None  # why the worker died, when it said so (``Heartbeat.fail``)

    def __str__(self) -> str:
        if self.failure is not None:
            return f"{self.name} failed: {self.failure}"
        return f"{self.name} made no progress for {self.silent_for:.1f}s"


class Heartbeat:
    """One worker's pulse. ``beat()`` is cheap: an integer increment (and a store).

    A worker whose loop died of an unexpected error calls ``fail(reason)`` instead of
    ``close()``: ``check()`` reports it at once, not only after ``max_silence``, and
    until its next ``beat()`` (a restarted worker beats again)."""

    def __init__(self, registry: HeartbeatRegistry, name: str) -> None:
        self._registry = registry
        self.name = name
        self.beats = 0
        self.failure: str | None = None

    def beat(self) -> None:
        self.beats += 1
        self.failure = None

    def fail(self, reason: str) -> None:
        self.failure = reason

    def close(self) -> None:
        self._registry.unregister(self.name)


@dataclass
class _Entry:
    read: Callable[[], int]
    max_silence: float
    last_value: int
    last_change: float
    failure: Callable[[], str | None] = lambda: None


class HeartbeatRegistry:
    """Thread-safe: workers register from their own threads; the main loop checks."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    def register(self, name: str, max_silence: float) -> Heartbeat:
        """A new ``Heartbeat`` called ``name`` (replacing one of the same name)."""
        hb = Heartbeat(self, name)
        self.watch(name, lambda: hb.beats, max_silence)
        with self._lock:
            self._entries[name].failure = lambda: hb.failure
        return hb

    def watch(self, name: str, read: Callable[[], int], max_silence: float) -> None:
        """Watch a counter that increases on every turn of a worker's loop."""
        if max_silence <= 0:
            raise ValueError("max_silence must be positive")
        with self._lock:
            self._entries[name] = _Entry(read, max_silence, read(), self._clock.monotonic())

    def unregister(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def check(self) -> list[Stall]:
        """Workers silent for longer than their ``max_silence`` (empty: all alive)."""
        now = self._clock.monotonic()
        stalls: list[Stall] = []
        with self._lock:
            for name, e in sorted(self._entries.items()):
                value = e.read()
                if value != e.last_value:
                    e.last_value = value
                    e.last_change = now
                silent = now - e.last_change
                failure = e.failure()
                if failure is not None or silent > e.max_silence:
                    stalls.append(Stall(name, silent, e.max_silence, failure))
        return stalls
