"""``count``: how many samples in the last ``window`` showed the counter growing."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatchd.rules.conditions.windowed import Windowed, WindowedKind
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.model import Op


@dataclass(frozen=True)
class Count(Windowed):
    """How many samples in the last ``window`` showed the counter growing."""

    op: Op = ">="
    value: float = 1.0

    def measure(self, h: CounterHistory, start: float, end: float) -> float:
        return float(h.changes(start, end))


class CountKind(WindowedKind):
    key = "count"
    default_op = ">="
    default_value = 1.0
    description = "How many samples in the last window showed the counter growing."
    model = Count


KIND = CountKind()
