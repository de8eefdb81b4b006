"""Issue 21: the rules are judged once per evaluation period (``rules.evaluation_interval``,
10 s by default, never more often than the polls), and at once when a sample brings what
a rule must judge now. On a busy GPU the gauges move at every poll; waking the evaluator
for each of them cost most of the daemon's CPU at 1 s polls."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import MappingProxyType

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.configfile.stages import for_rules
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.records import GpuSample, GpuStatus
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.rules.stage import rules_stage
from gpuwatchd.scenario.model import parse_scenario
from gpuwatchd.service.pipeline import Pipeline
from gpuwatchd.testing.fake_backend import DEFAULT_FIELDS

UUID = "GPU-00000000-0000-4000-8000-000000000000"


def pipeline(tmp_path: Path, extra: str = "") -> Pipeline:
    path = tmp_path / "c.yaml"
    path.write_text(f"state_dir: {tmp_path}\n{extra}")
    config = load_config(str(path), must_exist=True, environ={})
    return Pipeline([rules_stage(for_rules(config), VirtualClock(), durable=False)])


def sample(t: float, status: GpuStatus = GpuStatus.OK, **changes: float) -> GpuSample:
    return GpuSample(
        gpu=0,
        uuid=UUID,
        timestamp=t,
        status=status,
        fields=MappingProxyType({**DEFAULT_FIELDS, **changes}),
    )


def woke(p: Pipeline, s: GpuSample) -> bool:
    p.handoff.take()  # clears the wakeup
    p.observe(s)
    return p.handoff.wakeup.is_set()


def test_gauges_wait_for_the_period_and_what_a_rule_must_judge_now_wakes(
    tmp_path: Path,
) -> None:
    p = pipeline(tmp_path)
    assert p.period(1.0) == 10.0 and p.period(30.0) == 30.0
    assert not woke(p, sample(0.0))  # a GPU's first sample: the next tick judges it
    # a busy GPU: temperature (for: 5m), power, clocks, utilization move at every poll
    busy = {"temperature_gpu": 71.0, "power": 480.0, "sm_clock": 1.98e9, "utilization_gpu": 1.0}
    assert not woke(p, sample(1.0, **busy))
    # an error counter a rule keeps history of (GpuEccCorrectedRising)
    assert woke(
        p,
        sample(
            2.0,
            **busy,
            ecc_corrected_volatile=DEFAULT_FIELDS.get("ecc_corrected_volatile", 0.0) + 1,
        ),
    )
    # a field read by a rule with no "for" (GpuRowRemapFailure)
    assert woke(p, sample(3.0, **busy, remap_failure=1.0))
    # the GPU stops answering
    assert woke(p, sample(4.0, GpuStatus.ERROR))
    assert woke(p, sample(5.0, **busy))  # and answers again


def test_zero_judges_every_poll_and_a_short_for_makes_its_field_urgent(tmp_path: Path) -> None:
    assert pipeline(tmp_path, "rules: {evaluation_interval: 0s}\n").period(1.0) == 1.0
    site = tmp_path / "site.yaml"
    site.write_text(
        "rules:\n- name: SitePowerSpike\n  severity: page\n  for: 5s\n"
        "  condition: {threshold: {field: power, op: '>', value: 690}}\n"
        "  annotations: {summary: power}\n"
    )
    p = pipeline(tmp_path, f"rules: {{files: [{site}]}}\n")
    p.observe(sample(0.0))
    assert woke(p, sample(1.0, power=700.0))  # for: 5s is shorter than the 10 s period
    assert not woke(p, sample(2.0, power=700.0, temperature_gpu=80.0))


SCENARIO = """name: busy
duration: 2m
step: 1s
gpus: {count: 2, model: NVIDIA H100 80GB HBM3}
timeline:
  - {at: 0s, set: {utilization_gpu: 0.95}}
  - {at: 0s, gpu: 0, ramp: {field: energy, rate: 450}}
  - {at: 15s, gpu: 0, set: {temperature_gpu: 70}}
  - {at: 45s, gpu: 0, set: {temperature_gpu: 75}}
  - {at: 61s, gpu: 1, add: {ecc_corrected_volatile: 5}}
"""


def test_simulate_judges_as_the_daemon_does(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"state_dir: {tmp_path}\n")
    config = load_config(str(path), must_exist=True, environ={})
    sc = parse_scenario(SCENARIO, "busy.yaml")
    sim = Simulation(sc, config)
    sim.run()
    polls = sim.poller.cycles
    assert polls >= 120
    # a tick every 10 s of the polls at 1 s, plus the one urgent ECC sample
    assert sim.pipeline.urgent_evaluations == 1
    assert sim.pipeline.evaluations == -(-polls // 10) + 1, (polls, sim.pipeline.evaluations)
    every = dataclasses.replace(
        config, rules=dataclasses.replace(config.rules, evaluation_interval=0.0)
    )
    sim = Simulation(sc, every)
    sim.run()
    assert sim.pipeline.evaluations == sim.poller.cycles


XIDS = """name: xid-every-8s
duration: 90s
step: 5s
gpus: {count: 2, model: NVIDIA H100 80GB HBM3}
timeline:
""" + "".join(f"  - {{at: {8 * i + 3}s, gpu: 1, nvml_xid: 31}}\n" for i in range(10))

QUIET_1S = """rules:
- name: EveryXid31
  severity: page
  condition: {xid: {codes: [31], quiet: 1s}}
  annotations: {summary: 'XID {xid} on GPU {gpu}'}
"""


def test_an_xid_alert_ends_on_time_so_the_next_xid_pages_again(tmp_path: Path) -> None:
    """Found on 4 x H200 (issue 21): with 5 s polls and the 10 s period, an XID alert that
    ends after a 1 s quiet window was resolved only at the next period, so an XID every
    8 s found it still firing and 4 of 118 faults never paged. While an XID alert is
    active the evaluator keeps the poll's pace."""
    (tmp_path / "site.yaml").write_text(QUIET_1S)
    path = tmp_path / "c.yaml"
    path.write_text(f"state_dir: {tmp_path}\nrules: {{files: [site.yaml]}}\n")
    config = load_config(str(path), must_exist=True, environ={})
    sim = Simulation(parse_scenario(XIDS, "xids.yaml"), config)
    fired: list[float] = []
    sim.pipeline.on_transition = lambda t: (
        fired.append(sim.clock.now())
        if t.rule == "EveryXid31" and t.state.value == "firing"
        else None
    )
    sim.run()
    assert len(fired) == 10, fired
