"""The stages between sources and the outside world, behind one small interface.

Sources ``observe`` records (``GpuSample``, ``DeviceEvent``, ``XidEvent``) from any thread;
they land in a bounded ``Handoff`` and the call returns at once. The one thread that
evaluates (the daemon's evaluator, or simulate's loop) calls ``evaluate(now, view)``: it
feeds what arrived to every ``Stage`` (the rule engine), asks each for its transitions
and hands them to every ``Sink`` (the actions outbox). Stages are only ever touched by
that thread, so a slow rule can delay other rules but never a GPU poll or a log reader.

``urgent`` says whether a record arrived that must be judged now (an XID, a GPU lost):
the evaluator then runs at once instead of at its next tick.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuSample
from gpuwatchd.service.handoff import Handoff, Record

log = logging.getLogger(__name__)


class Stage(Protocol):
    def observe(self, record: Record) -> None: ...

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]: ...

    def families(self, view: NodeView, fams: Families) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class JudgesSamples(Protocol):
    """A stage that can tell which new samples must be judged before its next periodic
    evaluation (the rule engine), and how far apart those evaluations are."""

    @property
    def period(self) -> float: ...

    def urgent_sample(self, previous: GpuSample, sample: GpuSample) -> bool: ...


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
        handoff: Handoff | None = None,
    ) -> None:
        self.stages: list[Stage] = stages or []
        self.sinks: list[Sink] = sinks or []
        self.on_transition = on_transition
        self.handoff = handoff or Handoff()
        self._judges = [s for s in self.stages if isinstance(s, JudgesSamples)]
        self._last: dict[int, GpuSample] = {}  # each GPU's sample last observed
        self.evaluations = 0
        self.urgent_evaluations = 0
        self.evaluation_seconds = 0.0  # wall time spent evaluating, all evaluations

    def observe(self, record: Record) -> None:
        """Called by sources on their own threads; never waits for an evaluation. A
        sample wakes the evaluator only when a stage says it must be judged now."""
        if not isinstance(record, GpuSample):
            self.handoff.put(record)
            return
        previous = self._last.get(record.gpu)
        self._last[record.gpu] = record  # one source thread per GPU (or one for all)
        urgent = previous is not None and any(
            j.urgent_sample(previous, record) for j in self._judges
        )
        self.handoff.put(record, urgent)

    def period(self, poll_interval: float) -> float:
        """Seconds between periodic evaluations: the poll interval, or the longest period
        a stage asks for."""
        return max([poll_interval, *(j.period for j in self._judges)])

    @property
    def urgent(self) -> bool:
        return self.handoff.wakeup.is_set()

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        """Feed what arrived, evaluate every stage at ``now`` and deliver the transitions.
        Called by one thread only."""
        started = time.perf_counter()
        if self.handoff.wakeup.is_set():
            self.urgent_evaluations += 1
        for record in self.handoff.take():
            for stage in self.stages:
                stage.observe(record)
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
        self.evaluations += 1
        self.evaluation_seconds += time.perf_counter() - started
        return transitions

    def families(self, view: NodeView, fams: Families) -> None:
        for stage in self.stages:
            stage.families(view, fams)
        for sink in self.sinks:
            sink.families(view, fams)
        fams.get(
            "gpuwatchd_pipeline_records_total",
            "counter",
            "Records the sources handed to the rule engine.",
            (),
        ).add((), float(self.handoff.received))
        fams.get(
            "gpuwatchd_pipeline_records_dropped_total",
            "counter",
            "Non-sample records dropped because the evaluator fell too far behind.",
            (),
        ).add((), float(self.handoff.dropped))
        evaluations = fams.get(
            "gpuwatchd_pipeline_evaluations_total",
            "counter",
            "Rule evaluations, by what started them (an urgent record, or the periodic tick).",
            ("trigger",),
        )
        evaluations.add(("event",), float(self.urgent_evaluations))
        evaluations.add(("tick",), float(self.evaluations - self.urgent_evaluations))

    def close(self) -> None:
        parts: list[Stage | Sink] = [*self.stages, *self.sinks]
        for part in parts:
            try:
                part.close()
            except Exception:
                log.exception("closing %r", part)
