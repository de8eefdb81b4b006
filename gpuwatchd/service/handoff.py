"""The bounded hand-off between sources and the evaluator.

Sources (GPU poll workers, kernel-log readers, NVML event reader) run on their own
threads and must never wait for the rule engine; the engine runs on one evaluator thread
and must never wait for a source. ``Handoff.put`` takes a record without blocking on
evaluation (only a short lock around a deque), and ``Handoff.take`` gives the evaluator
everything that arrived, in order.

Bounded in memory whatever the evaluator does:
- samples coalesce: a GPU's newer sample replaces an older one still waiting (the engine
  reads counters as cumulative values and gauges at evaluation time, so nothing a rule can
  see is lost);
- other records (XIDs, device events) queue up to ``max_events``; beyond that the oldest
  is dropped and counted (``dropped``), which only a wedged evaluator can cause.

Urgent records (an XID, a GPU lost or missing, a drain outcome) set ``wakeup``, the event
the evaluator waits on between ticks (through its clock), so a fault is judged the moment
it arrives, not at the next tick.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable

from gpuwatchd.core.records import (
    DeviceEvent,
    DeviceEventKind,
    DrainOutcome,
    GpuSample,
    XidEvent,
)

SourceRecord = GpuSample | DeviceEvent | XidEvent
# a drain outcome is handed back by the drain stage for the rules to judge
Record = SourceRecord | DrainOutcome

URGENT_DEVICE_EVENTS = frozenset({DeviceEventKind.LOST, DeviceEventKind.MISSING})


def is_urgent(record: Record) -> bool:
    """Whether a record can change an alert that must not wait for the periodic tick."""
    if isinstance(record, XidEvent | DrainOutcome):
        return True
    return isinstance(record, DeviceEvent) and record.kind in URGENT_DEVICE_EVENTS


class Handoff:
    def __init__(self, max_events: int = 65536, urgent: Callable[[Record], bool] = is_urgent):
        self.max_events = max_events
        self._urgent_test = urgent
        self._lock = threading.Lock()
        self.wakeup = threading.Event()
        # key: ("s", gpu) for a GPU's latest sample, ("e", n) for the n-th other record
        self._items: OrderedDict[tuple[str, int], Record] = OrderedDict()
        self._events = 0
        self._seq = 0
        self.dropped = 0
        self.received = 0

    def put(self, record: Record, urgent: bool | None = None) -> None:
        """Queue a record; ``urgent`` (when the caller judged it) or the urgency test
        decides whether the evaluator is woken now."""
        if urgent is None:
            urgent = self._urgent_test(record)
        with self._lock:
            self.received += 1
            if isinstance(record, GpuSample):
                self._items[("s", record.gpu)] = record  # replaces in place, keeps its turn
            else:
                if self._events >= self.max_events:
                    for key in self._items:
                        if key[0] == "e":
                            del self._items[key]
                            self._events -= 1
                            self.dropped += 1
                            break
                self._seq += 1
                self._items[("e", self._seq)] = record
                self._events += 1
        if urgent:
            self.wakeup.set()

    def wake(self) -> None:
        """Ask the evaluator to run now (the PCI bus changed, a reload, a stop)."""
        self.wakeup.set()

    def take(self) -> list[Record]:
        """Everything waiting, oldest first; clears ``wakeup``."""
        with self._lock:
            self.wakeup.clear()
            items = list(self._items.values())
            self._items.clear()
            self._events = 0
        return items

    def pending(self) -> int:
        with self._lock:
            return len(self._items)
