"""``increase``: how much a counter grew in the last ``window`` (counter resets handled).

With ``skip_node_wide``, a GPU whose activity of the counter in the window all began
node-wide (the counter starting to move on 3 or more GPUs within minutes after hours of
quiet: ``rules/node_wide.py``) counts as no increase: the node's alert (``memory_trend``,
``signal: node``) stands for it."""

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
    keys = (*WindowedKind.keys, "skip_node_wide")
    node_wide_option = True


KIND = IncreaseKind()
