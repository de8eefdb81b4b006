"""The stages between sources and the outside world, behind one small interface.

Sources publish records (``GpuSample``, ``DeviceEvent``, ``XidEvent``). After every poll
cycle the pipeline asks each ``Stage`` (the rule engine) to evaluate at ``now`` and hands
the resulting ``AlertTransition``s to every ``Sink`` (the durable outbox, simulate's
printer). Daemon, demo and simulate build the same pipeline; only the clock differs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.sources.gpu.poller import Record

log = logging.getLogger(__name__)


class Stage(Protocol):
    def observe(self, record: Record) -> None: ...

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]: ...

    def families(self, view: NodeView, fams: Families) -> None: ...

    def close(self) -> None: ...


class Sink(Protocol):
    def deliver(self, transitions: list[AlertTransition], now: float) -> None: ...

    def families(self, view: NodeView, fams: Families) -> None: ...

    def close(self) -> None: ...


class Pipeline:
    def __init__(
        self,
        stages: list[Stage] | None = None,
        sinks: list[Sink] | None = None,
        on_transition: Callable[[AlertTransition], None] | None = None,
    ) -> None:
        self.stages: list[Stage] = stages or []
        self.sinks: list[Sink] = sinks or []
        self.on_transition = on_transition
        self._lock = threading.Lock()  # records come from several source threads
        self.evaluations = 0
        self.evaluation_seconds = 0.0

    def observe(self, record: Record) -> None:
        with self._lock:
            for stage in self.stages:
                stage.observe(record)

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        with self._lock:
            transitions: list[AlertTransition] = []
            for stage in self.stages:
                transitions.extend(stage.evaluate(now, view))
        if transitions:
            for sink in self.sinks:
                try:
                    sink.deliver(transitions, now)
                except Exception:  # a broken sink must not stop evaluation
                    log.exception("sink %r failed", sink)
            if self.on_transition is not None:
                for t in transitions:
                    self.on_transition(t)
        return transitions

    def families(self, view: NodeView, fams: Families) -> None:
        for stage in self.stages:
            stage.families(view, fams)
        for sink in self.sinks:
            sink.families(view, fams)

    def close(self) -> None:
        parts: list[Stage | Sink] = [*self.stages, *self.sinks]
        for part in parts:
            try:
                part.close()
            except Exception:
                log.exception("closing %r", part)
