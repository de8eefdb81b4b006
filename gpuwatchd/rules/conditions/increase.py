"""``increase``: how much a counter grew in the last ``window`` (counter resets handled)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatchd.rules.conditions.windowed import Windowed, WindowedKind
from gpuwatchd.rules.history import CounterHistory


@dataclass(frozen=True)
class Increase(Windowed):
    """How much a counter grew in the last ``window`` (counter resets handled)."""

    def measure(self, h: CounterHistory, start: float, end: float) -> float:
        return h.increase(start, end)


class IncreaseKind(WindowedKind):
    key = "increase"
    description = "How much a counter grew in the last window (counter resets handled)."
    model = Increase


KIND = IncreaseKind()
