"""``gpuwatchd simulate``: the real pipeline on a virtual clock, as fast as it can run.

The scenario backend answers from its timeline at virtual time; the poller runs inline
(a stalled GPU shows up as a call that timed out); every health record is printed as one
JSON line. The same scenario and config always give the same output.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from gpuwatchd.configfile.loader import Config
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.records import GpuSample
from gpuwatchd.scenario.backend import ScenarioBackend
from gpuwatchd.scenario.model import Scenario, format_duration
from gpuwatchd.service.assembly import Node, Wiring
from gpuwatchd.service.handoff import Record

SIM_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so output is reproducible


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


PERIOD_SLACK = 1e-6  # steps land on the period within float error


class Simulation:
    """One simulated run: the node the composition root builds, stepped on a virtual clock.

    Each step: kernel-log lines and NVML XID events due by now reach the merger (an urgent
    one is judged at once, at its own time), every GPU is polled inline, the rules are
    evaluated, and the actions stage runs what is due (group windows, retries, drain
    grace). Between steps the clock stops at every scripted kernel line or NVML event, so
    an XID is judged at the time it happened, as the daemon would.
    """

    def __init__(
        self,
        scenario: Scenario,
        config: Config,
        *,
        clock: VirtualClock | None = None,
        on_record: Callable[[dict[str, Any]], None] = lambda record: None,
        include_samples: bool = False,
        wiring: Wiring | None = None,
    ) -> None:
        self.scenario = scenario
        self.config = config
        self.clock = clock or VirtualClock(SIM_EPOCH)
        self.on_record = on_record
        self.include_samples = include_samples
        self.t0 = self.clock.now()
        self.backend = ScenarioBackend(scenario, self.clock, real_stalls=False)
        base = wiring or Wiring()
        self.node = Node(
            config,
            self.clock,
            self.backend,
            dataclasses.replace(
                base, durable=False, threaded=False, record=base.record or self._out
            ),
        )
        self.node.listeners.append(self._listen)
        self.pipeline = self.node.pipeline
        self.state = self.node.state
        self.xids = self.node.xids
        self.renderer = self.node.renderer
        self.node.open_gpus()
        self.poller = self.node.poller(scenario.step, scenario.step)
        self._next_note = 0
        self._next_tick: float | None = None  # clock time of the next periodic evaluation

    def _out(self, record: dict[str, Any]) -> None:
        now = self.clock.now()
        self.on_record({"t": format_duration(now - self.t0), "time": iso(now), **record})

    def _listen(self, record: Record) -> None:
        if isinstance(record, GpuSample):
            if self.include_samples:
                self._out({"record": "sample", **record.as_dict()})
        else:
            self._out(record.as_dict())

    def _notes(self, until: float) -> None:
        notes = self.scenario.notes
        while self._next_note < len(notes) and notes[self._next_note].t <= until:
            note = notes[self._next_note]
            self._out({"record": "note", "text": note.text, "gpus": list(note.gpus)})
            self._next_note += 1

    def _inputs(self) -> None:
        """Kernel lines and NVML events due by now; an urgent one is judged at once."""
        self.xids.pump(self.clock.now(), self.clock.monotonic())
        if self.pipeline.urgent:
            self._evaluate()

    def _evaluate(self) -> None:
        now = self.clock.now()
        for transition in self.pipeline.evaluate(now, self.state.view()):
            self._out(transition.as_dict())
        if self.node.actions is not None:  # group windows, retries, drain grace
            self.node.actions.run_pending(now)

    def step(self) -> None:
        """One poll of every GPU; the rules judge it when it brought something urgent or
        an evaluation period has passed, as the daemon's evaluator does."""
        self._notes(self.clock.now() - self.t0)
        self._inputs()
        self.poller.poll_once_sync()
        now = self.clock.now()
        tick = self._next_tick is None or now >= self._next_tick - PERIOD_SLACK
        if tick:  # keep the phase, as the daemon does, whatever urgent records came
            period = self.pipeline.period(self.scenario.step)
            nxt = now if self._next_tick is None else self._next_tick
            while nxt <= now + PERIOD_SLACK:
                nxt += period
            self._next_tick = nxt
        if tick or self.pipeline.urgent:
            self._evaluate()
            # the period can shrink with what the evaluation found (an XID alert active)
            if self._next_tick is not None:
                soon = now + self.pipeline.period(self.scenario.step)
                self._next_tick = min(self._next_tick, soon)
        elif self.node.actions is not None:
            self.node.actions.run_pending(now)

    def advance_to(self, when: float) -> None:
        """Move the clock to ``when``, stopping at every scripted event on the way."""
        while True:
            upcoming = self.backend.next_event_after(self.clock.now())
            if upcoming is None or upcoming >= when:
                break
            self.clock.set(upcoming)
            self._inputs()
        self.clock.set(when)

    def run(self) -> None:
        duration = self.scenario.duration
        step = self.scenario.step
        n = 0
        while True:
            self.step()
            n += 1
            t = n * step
            if t > duration + 1e-9:
                break
            self.advance_to(self.t0 + t)
        self.finish()

    def finish(self) -> None:
        """Flush XID reports still waiting for a partner."""
        self.xids.flush()

    def exposition(self) -> bytes:
        return self.renderer.families().render()


def run_simulation(
    scenario: Scenario,
    config: Config,
    out: TextIO,
    *,
    include_samples: bool = False,
    metrics_out: str | None = None,
    send: bool = False,
) -> int:
    def write(record: dict[str, Any]) -> None:
        out.write(json.dumps(record, sort_keys=False) + "\n")

    sim = Simulation(
        scenario,
        config,
        on_record=write,
        include_samples=include_samples,
        wiring=Wiring(send_recorded=send),
    )
    sim.run()
    if metrics_out:
        with open(metrics_out, "wb") as fh:
            fh.write(sim.exposition())
    return 0
