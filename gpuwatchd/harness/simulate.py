"""``gpuwatchd simulate``: the real pipeline on a virtual clock, as fast as it can run.

The scenario backend answers from its timeline at virtual time; the poller runs inline
(a stalled GPU shows up as a call that timed out); every health record is printed as one
JSON line. The same scenario and config always give the same output.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO

from gpuwatchd.config.loader import Config
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import DeviceEvent, GpuSample, XidEvent
from gpuwatchd.exposition.metrics import MetricsRenderer
from gpuwatchd.scenario.backend import ScenarioBackend
from gpuwatchd.scenario.model import Scenario, format_duration
from gpuwatchd.service.pipeline import Pipeline
from gpuwatchd.sources.gpu.poller import Poller, Record
from gpuwatchd.sources.xid_inputs import XidInputs

SIM_EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z: fixed, so output is reproducible


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Simulation:
    """The pieces of one simulated run, for ``simulate`` and tests."""

    scenario: Scenario
    config: Config
    clock: VirtualClock = field(default_factory=lambda: VirtualClock(SIM_EPOCH))
    on_record: Callable[[dict[str, Any]], None] = lambda record: None
    include_samples: bool = False
    pipeline: Pipeline = field(default_factory=Pipeline)
    rules: bool = True  # put the rule engine (the config's rules, state in memory) first

    def __post_init__(self) -> None:
        if self.rules:
            from gpuwatchd.rules import rules_stage

            self.pipeline.stages.insert(0, rules_stage(self.config, self.clock, durable=False))
        self.backend = ScenarioBackend(self.scenario, self.clock, real_stalls=False)
        self.state = NodeState(self.config.node_name, self.clock.now(), self.config.gpus.expected)
        self.renderer = MetricsRenderer.for_config(
            self.state.view,
            self.config.metrics,
            (self.pipeline.families, lambda v, f: self.xids.families(f)),
        )
        self.xids = XidInputs(
            self.config, self.backend, self.clock, self._xid, self._source_status, durable=False
        )
        self.t0 = self.clock.now()
        infos = self.backend.open()
        self.state.set_gpus(infos, self.t0)
        self.xids.set_gpus(infos)
        self.xids.nvml_events_up = self.config.sources.nvml_events
        self.poller = Poller(
            self.backend,
            infos,
            self.state,
            self.clock,
            self.scenario.step,
            self.scenario.step,
            self._emit,
        )
        self._next_note = 0

    def _out(self, record: dict[str, Any]) -> None:
        now = self.clock.now()
        self.on_record({"t": format_duration(now - self.t0), "time": iso(now), **record})

    def _emit(self, record: Record) -> None:
        self.pipeline.observe(record)
        if isinstance(record, GpuSample):
            if self.include_samples:
                self._out({"record": "sample", **record.as_dict()})
        elif isinstance(record, DeviceEvent):
            self._out(record.as_dict())

    def _xid(self, event: XidEvent) -> None:
        self.pipeline.observe(event)
        if event.trusted:
            self.state.count_xid(event.gpu, event.xid)
        self._out(event.as_dict())

    def _source_status(self, name: str, up: bool, detail: str) -> None:
        self.state.source(name, up=up, now=self.clock.now(), detail=detail)

    def _notes(self, until: float) -> None:
        notes = self.scenario.notes
        while self._next_note < len(notes) and notes[self._next_note].t <= until:
            note = notes[self._next_note]
            self._out({"record": "note", "text": note.text, "gpus": list(note.gpus)})
            self._next_note += 1

    def step(self) -> None:
        elapsed = self.clock.now() - self.t0
        self._notes(elapsed)
        if self.config.sources.nvml_events:
            for event in self.backend.wait_xid_events(0.0):
                self.xids.nvml_event(event)
        self.xids.pump(self.clock.now(), self.clock.monotonic())
        self.poller.poll_once_sync()
        for transition in self.pipeline.evaluate(self.clock.now(), self.state.view()):
            self._out(transition.as_dict())
        for sink in self.pipeline.sinks:  # actions: group windows, retries, drain grace
            run_pending = getattr(sink, "run_pending", None)
            if run_pending is not None:
                run_pending(self.clock.now())

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
            self.clock.set(self.t0 + t)
        self.finish()

    def finish(self) -> None:
        """Flush XID reports still waiting for a partner."""
        self.xids.merger.expire(float("inf"))

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

    sim = Simulation(scenario, config, on_record=write, include_samples=include_samples)
    add_actions(sim, config, send=send)
    sim.run()
    if metrics_out:
        with open(metrics_out, "wb") as fh:
            fh.write(sim.exposition())
    return 0


def add_actions(sim: Simulation, config: Config, *, send: bool = False) -> None:
    """The actions stage on the simulation's clock, when the config has receivers or a
    drain mode. Notifications and drains are printed as ``notification`` and ``drain``
    records, not sent; with ``send`` notifications really go out (drains never do)."""
    import random

    from gpuwatchd.actions import build_recording_actions

    sink = build_recording_actions(config, sim.clock, sim._out, send=send, rng=random.Random(0))
    if sink is None:
        return
    sim.pipeline.sinks.append(sink)
