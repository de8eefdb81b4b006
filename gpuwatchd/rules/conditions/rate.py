"""``rate``: a counter's average growth per second over the last ``window``."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatchd.rules.conditions.windowed import Windowed, WindowedKind
from gpuwatchd.rules.history import CounterHistory


@dataclass(frozen=True)
class Rate(Windowed):
    """A counter's average growth per second over the last ``window``."""

    def measure(self, h: CounterHistory, start: float, end: float) -> float:
        return h.increase(start, end) / self.window


class RateKind(WindowedKind):
    key = "rate"
    description = "A counter's average growth per second over the last window."
    model = Rate


KIND = RateKind()
