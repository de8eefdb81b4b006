"""The background threads of the actions stage, started by ``start()`` and stopped by
``stop()`` (never by a constructor).

- one thread per receiver target runs that target's ``TargetDelivery.step``: a slow
  receiver never holds up another;
- a scheduler thread flushes groups when their window ends, repeats still-firing
  notifications, looks at silences again and prunes old rows;
- a drain thread runs the drain controller.

Each sleeps until its next deadline (monotonic) or until ``wake()``; an event never waits
for a timer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gpuwatchd.actions.delivery import TargetDelivery
from gpuwatchd.core.clock import Clock

log = logging.getLogger(__name__)

MAX_IDLE_WAIT = 5.0
# How often the scheduler looks at the silences file when nothing else wakes it: a
# silence is read afresh whenever an alert is routed, so this only bounds how late a
# silence someone expired early lets its held notifications go (timed ends are timers).
SCHEDULER_WAIT = 5.0

Step = Callable[[], "float | None"]  # does due work; returns the next monotonic deadline
TargetKey = tuple[str, int]


class Workers:
    def __init__(self, clock: Clock, schedule: Step, drain: Step | None) -> None:
        self.clock = clock
        self._schedule = schedule
        self._drain = drain
        self._stop = threading.Event()
        self._wake_sched = threading.Event()
        self._wake_drain = threading.Event()
        self._targets: dict[TargetKey, tuple[TargetDelivery, threading.Event]] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.running = False

    def start(self, targets: dict[TargetKey, TargetDelivery]) -> None:
        with self._lock:
            if self.running:
                return
            self.running = True
            self._spawn("actions-sched", self._schedule, self._wake_sched, None, SCHEDULER_WAIT)
            if self._drain is not None:
                self._spawn("actions-drain", self._drain, self._wake_drain, None, MAX_IDLE_WAIT)
        for key, delivery in targets.items():
            self.add_target(key, delivery)

    def add_target(self, key: TargetKey, delivery: TargetDelivery) -> None:
        """A sender thread for a target (at start, or one a reload added)."""
        with self._lock:
            event = threading.Event()
            self._targets[key] = (delivery, event)
            if self.running:
                name = f"send-{key[0]}-{key[1]}"
                self._spawn(name, delivery.step, event, delivery, MAX_IDLE_WAIT)

    def remove_target(self, key: TargetKey) -> None:
        """Its thread ends after the message in hand (a reload removed the receiver)."""
        with self._lock:
            entry = self._targets.pop(key, None)
        if entry is not None:
            entry[0].retired = True
            entry[1].set()

    def _spawn(
        self,
        name: str,
        step: Step,
        event: threading.Event,
        delivery: TargetDelivery | None,
        most: float,
    ) -> None:
        """A thread that runs ``step`` until stopped, sleeping at most ``most`` seconds."""
        th = threading.Thread(
            target=self._loop, args=(step, event, delivery, most), name=name, daemon=True
        )
        self._threads.append(th)
        th.start()

    def _loop(
        self, step: Step, event: threading.Event, delivery: TargetDelivery | None, most: float
    ) -> None:
        while not self._stop.is_set() and not (delivery is not None and delivery.retired):
            try:
                until = step()
            except Exception:
                log.exception("actions worker %s", threading.current_thread().name)
                until = self.clock.monotonic() + 1.0
            left = most if until is None else min(most, until - self.clock.monotonic())
            if left <= 0:
                continue
            self.clock.wait(event, left)
            event.clear()

    def wake(self) -> None:
        self._wake_sched.set()
        self._wake_drain.set()
        with self._lock:
            events = [e for _, e in self._targets.values()]
        for e in events:
            e.set()

    def wake_senders(self) -> None:
        with self._lock:
            events = [e for _, e in self._targets.values()]
        for e in events:
            e.set()

    def stop(self, timeout: float) -> list[str]:
        """Stop every thread; the names of those still busy after ``timeout`` seconds."""
        self._stop.set()
        self.wake()
        deadline = time.monotonic() + timeout
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        busy = [th.name for th in self._threads if th.is_alive()]
        self._threads.clear()
        self.running = False
        return busy
