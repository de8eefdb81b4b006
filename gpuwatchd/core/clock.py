"""Time as a seam. Everything that needs 'now' or a sleep asks a ``Clock``.

``SystemClock`` is wall time. ``VirtualClock`` moves only when told to (``simulate`` and
tests). ``ScaledClock`` runs faster than wall time by a constant factor (``demo``).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the Unix epoch, as this clock sees them."""
        ...

    def monotonic(self) -> float:
        """A monotonic reading in this clock's seconds."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait up to ``seconds`` of this clock's time for ``event``; True if it was set."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


class ScaledClock:
    """Wall time sped up ``factor`` times from ``start`` (epoch seconds)."""

    def __init__(self, factor: float, start: float | None = None) -> None:
        if factor <= 0:
            raise ValueError("factor must be positive")
        self.factor = factor
        self._t0_wall = time.monotonic()
        self._t0 = time.time() if start is None else start

    def now(self) -> float:
        return self._t0 + (time.monotonic() - self._t0_wall) * self.factor

    def monotonic(self) -> float:
        return (time.monotonic() - self._t0_wall) * self.factor

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds) / self.factor)


class VirtualClock:
    """A clock that only moves through ``advance``/``set``. Waits return immediately."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._start = start
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now  # one attribute read: atomic; writers hold the lock

    def monotonic(self) -> float:
        return self._now - self._start

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a virtual clock never goes back")
        with self._lock:
            self._now += seconds

    def set(self, when: float) -> None:
        with self._lock:
            if when < self._now:
                raise ValueError("a virtual clock never goes back")
            self._now = when

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.is_set()
