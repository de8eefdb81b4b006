"""``SteppedClock``: a virtual clock whose wall-clock reading can be stepped.

Real wall clocks jump (NTP corrections, an operator's ``date -s``, a VM resumed) while
the monotonic clock only moves forward. ``step_wall`` moves the wall reading alone;
``advance`` moves both. Waits return at once, as with ``VirtualClock``.
"""

from __future__ import annotations

import threading


class SteppedClock:
    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._wall_offset = start
        self._mono = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._wall_offset + self._mono

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time never goes back on the monotonic clock")
        with self._lock:
            self._mono += seconds

    def step_wall(self, seconds: float) -> None:
        """Step the wall clock by ``seconds`` (either sign); the monotonic one stays."""
        with self._lock:
            self._wall_offset += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.is_set()
