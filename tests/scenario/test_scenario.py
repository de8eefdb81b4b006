"""The scenario format, its loader's validation, and the scenario backend."""

from __future__ import annotations

import glob
import os
import textwrap
import threading
import time

import pytest

from gpuwatchd.core.clock import ScaledClock, VirtualClock
from gpuwatchd.core.errors import CallTimeout, ConfigError, GpuLost
from gpuwatchd.core.fields import CLOCK_EVENT_REASON_BITS, GPU_FIELDS, LINK_FIELDS
from gpuwatchd.scenario.backend import ScenarioBackend
from gpuwatchd.scenario.model import (
    Scenario,
    bundled_scenario_path,
    bundled_scenarios,
    format_duration,
    load_scenario,
    parse_scenario,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml")))

HEAD = """\
name: t
duration: 1d
gpus: {count: 8}
"""


def scenario(body: str, head: str = HEAD) -> Scenario:
    return parse_scenario(head + textwrap.dedent(body), "s.yaml")


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_scenario(textwrap.dedent(text), "s.yaml")
    return info.value.lines()


# -- shipped scenarios -------------------------------------------------------------------


def test_the_shipped_scenarios_are_all_there() -> None:
    names = {os.path.basename(p) for p in SHIPPED}
    assert {
        "healthy-8xh100.yaml",
        "ecc-leak.yaml",
        "thermal-slowdown.yaml",
        "fallen-off-bus.yaml",
        "nvlink-crc-storm.yaml",
        "gpu-stall.yaml",
    } <= names


@pytest.mark.parametrize("path", SHIPPED, ids=os.path.basename)
def test_shipped_scenario_loads_and_tells_a_story(path: str) -> None:
    s = load_scenario(path)
    assert s.name == os.path.basename(path).removesuffix(".yaml")
    assert s.description
    assert s.notes
    assert all(0 <= n.t <= s.duration for n in s.notes)
    for gpu in range(len(s.gpus)):
        fields, links, _ = s.values_at(gpu, s.duration)
        assert set(fields) <= set(GPU_FIELDS)
        assert all(set(ls.fields) <= set(LINK_FIELDS) for ls in links)


def test_every_shipped_scenario_is_bundled_and_found_by_name() -> None:
    # issue 23 item 6: `gpuwatchd simulate fallen-off-bus` (the package carries scenarios/)
    names = {os.path.basename(p).removesuffix(".yaml") for p in SHIPPED}
    assert set(bundled_scenarios()) == names
    path = bundled_scenario_path("fallen-off-bus")
    with (
        open(path, "rb") as f,
        open(os.path.join(ROOT, "scenarios", "fallen-off-bus.yaml"), "rb") as g,
    ):
        assert f.read() == g.read()
    with pytest.raises(FileNotFoundError, match="fallen-off-bus"):
        bundled_scenario_path("no-such-scenario")


def test_bundled_demo_is_an_8_gpu_week_with_an_accelerating_leak() -> None:
    assert "demo" in bundled_scenarios()
    s = load_scenario(bundled_scenario_path("demo"))
    assert len(s.gpus) == 8
    assert 6 * 86400 <= s.duration <= 8 * 86400
    assert len(s.notes) >= 8
    assert sorted(x for _, _, x in s.nvml_xids()) == [48, 63, 79]  # 63: GPU 5's row remap
    assert any("Xid" in line and ": 79," in line for _, _, line in s.kernel_lines())
    assert any("Xid" in line and ": 48," in line for _, _, line in s.kernel_lines())
    lost_gpu = next(gpu for _, gpu, x in s.nvml_xids() if x == 79)
    assert s.state_at(lost_gpu, s.duration).status == "lost"
    # GPU 5's corrected errors accelerate: about one a day, then about one an hour, and
    # a double-bit error comes days into the fast phase.
    day = 86400
    ecc = [s.values_at(5, d * day)[0]["ecc_corrected_volatile"] for d in (0, 4, 5, 6)]
    assert ecc[1] - ecc[0] <= 4  # four days: a few
    assert ecc[3] - ecc[2] >= 18 * (ecc[1] - ecc[0]) / 4  # a day: many times the daily rate
    dbe = next(t for t, gpu, x in s.nvml_xids() if x == 48 and gpu == 5)
    assert 5 * day < dbe < s.duration
    assert s.values_at(5, dbe)[0]["ecc_uncorrected_volatile"] == 1
    # On the way GPU 5 remaps a row; a reset applies it hours later, and errors go on.
    remap = next(t for t, gpu, x in s.nvml_xids() if x == 63 and gpu == 5)
    assert 4 * day < remap < dbe - day
    assert s.values_at(5, remap + 60)[0]["remapped_rows_pending"] == 1
    assert s.values_at(5, remap + 7 * 3600)[0]["remapped_rows_pending"] == 0
    # Another GPU throttles hot for hours (several polls, even missed ones).
    for hours in (26.75, 29, 30.5):
        hot = s.values_at(2, hours * 3600)[0]
        assert hot["temperature_gpu"] > 85
        assert int(hot["clock_event_reasons"]) & CLOCK_EVENT_REASON_BITS["hw_thermal_slowdown"]


def test_unknown_bundled_scenario() -> None:
    with pytest.raises(FileNotFoundError, match="demo"):
        bundled_scenario_path("nope")


# -- validation: one test per kind of mistake --------------------------------------------


def test_unknown_top_level_key_with_did_you_mean() -> None:
    assert errors(
        """\
        name: t
        duraton: 1h
        duration: 1h
        gpus: {count: 1}
        """
    ) == ["s.yaml:2:1: scenario: unknown key 'duraton' (did you mean 'duration'?)"]


def test_missing_required_keys() -> None:
    assert errors("name: t\n") == [
        "s.yaml:1:1: scenario: missing required key 'duration'",
        "s.yaml:1:1: scenario: missing required key 'gpus'",
    ]


def test_empty_file() -> None:
    assert errors("") == ["s.yaml:1:1: scenario: the file is empty"]


def test_yaml_syntax_error_has_a_location() -> None:
    (line,) = errors("name: t\ngpus: [1,\n")
    assert line.startswith("s.yaml:3:1: YAML syntax error")


def test_bad_duration() -> None:
    assert errors(
        """\
        name: t
        duration: 5 mins
        gpus: {count: 1}
        """
    ) == [
        "s.yaml:2:11: duration: '5 mins' is not a duration (use a number and a unit with no "
        "space: 250ms, 30s, 5m, 2h, 1d, 1w; combined like 1h30m)"
    ]


def test_unknown_event_key() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    gpus: 3
    note: x
"""
    ) == ["s.yaml:6:5: timeline[0]: unknown key 'gpus' (did you mean 'gpu'?)"]


def test_unknown_field_name_with_did_you_mean() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    set: {temprature_gpu: 50}
"""
    ) == [
        "s.yaml:6:11: timeline[0].set: unknown field 'temprature_gpu' "
        "(did you mean 'temperature_gpu'?)"
    ]


def test_unknown_field_in_baseline() -> None:
    assert errors(HEAD + "baseline: {pwer: 80}\n") == [
        "s.yaml:4:12: baseline: unknown field 'pwer' (did you mean 'power'?)"
    ]


def test_gpu_index_out_of_range() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    gpu: [1, 8]
    lose: true
"""
    ) == ["s.yaml:6:14: timeline[0].gpu: GPU 8 is out of range (this scenario has 8 GPUs: 0-7)"]


def test_link_out_of_range() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    gpu: 2
    link: 18
    ramp: {field: nvlink_crc_errors, rate: 1}
"""
    ) == [
        "s.yaml:7:11: timeline[0].link: link 18 is out of range (GPU 2 has 18 NVLink links: 0-17)"
    ]


def test_per_link_field_without_link() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    add: {nvlink_crc_errors: 5}
"""
    ) == ["s.yaml:6:11: timeline[0].add: 'nvlink_crc_errors' is a per-link field and needs `link:`"]


def test_gpu_field_with_link() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    link: 0
    set: {power: 100}
"""
    ) == [
        "s.yaml:7:11: timeline[0]: 'power' is a GPU field; an entry with `link:` sets only "
        "per-link fields"
    ]


def test_unknown_throttle_reason() -> None:
    (line,) = errors(
        HEAD
        + """\
timeline:
  - at: 1m
    throttle: [hw_thermal]
"""
    )
    assert line.startswith(
        "s.yaml:6:16: timeline[0].throttle: unknown clock-event reason 'hw_thermal' "
        "(did you mean 'hw_thermal_slowdown'?)"
    )


def test_ramp_on_a_gauge() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    ramp: {field: temperature_gpu, rate: 1}
"""
    ) == [
        "s.yaml:6:19: timeline[0].ramp.field: 'temperature_gpu' is a gauge; only counters "
        "ramp (use `set` for gauges)"
    ]


def test_event_after_duration() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1d1m
    note: too late
"""
    ) == ["s.yaml:5:9: timeline[0].at: '1d1m' is after the end of the scenario (duration 1d)"]


def test_stall_past_the_end() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 23h59m30s
    gpu: 0
    stall: 1m
"""
    ) == ["s.yaml:7:12: timeline[0].stall: the stall runs past the end of the scenario"]


def test_fraction_for_an_integer_field() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    add: {ecc_uncorrected_volatile: 1.5}
"""
    ) == [
        "s.yaml:6:37: timeline[0].add.ecc_uncorrected_volatile: ecc_uncorrected_volatile "
        "counts whole numbers, got 1.5"
    ]


def test_percent_where_a_ratio_is_expected() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    set: {utilization_gpu: 97}
"""
    ) == ["s.yaml:6:28: timeline[0].set.utilization_gpu: ratios are 0-1 (write 0.97, not 97)"]


def test_wrong_unit() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    set: {sm_clock: 72GiB}
"""
    ) == [
        "s.yaml:6:21: timeline[0].set.sm_clock: unknown unit 'GiB' (units for sm_clock: hz, "
        "khz, mhz, ghz; or a plain number in base units)"
    ]


def test_bad_transport() -> None:
    assert errors(
        HEAD
        + """\
timeline:
  - at: 1m
    kernel_log: "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus."
    transport: sysog
"""
    ) == [
        "s.yaml:7:16: timeline[0].transport: 'sysog' is not one of kernel, syslog, kmsg-user "
        "(did you mean 'syslog'?)"
    ]


def test_event_that_does_nothing() -> None:
    (line,) = errors(HEAD + "timeline:\n  - at: 1m\n    gpu: 1\n")
    assert line.startswith("s.yaml:5:5: timeline[0]: nothing happens here")


def test_unknown_model_without_baseline() -> None:
    (line,) = errors(
        """\
        name: t
        duration: 1h
        gpus: {count: 2, model: NVIDIA H100}
        """
    )
    assert line.startswith(
        "s.yaml:3:25: gpus.model: 'NVIDIA H100' is not a known model (did you mean "
        "'NVIDIA H100 80GB HBM3'?)"
    )
    assert "baseline` with at least memory_total, power, sm_clock, temperature_gpu" in line


def test_unknown_model_with_baseline_loads() -> None:
    s = parse_scenario(
        textwrap.dedent(
            """\
            name: t
            duration: 1h
            gpus: {count: 2, model: NVIDIA A100-SXM4-80GB, nvlink_links: 12}
            baseline: {memory_total: 80GiB, power: 60, sm_clock: 210MHz, temperature_gpu: 30}
            """
        ),
        "s.yaml",
    )
    fields, links, _ = s.values_at(1, 0)
    assert fields["memory_total"] == 80 * 1024**3
    assert fields["sm_clock"] == 210e6
    assert len(links) == 12
    assert s.gpus[1].model == "NVIDIA A100-SXM4-80GB"


def test_bad_gpu_list_entries() -> None:
    assert errors(
        """\
        name: t
        duration: 1h
        gpus:
          - {uuid: GPU-1234, pci_bus_id: 00000000:3B:00.0}
          - {pci_bus_id: 0000:3b:00.0, modle: NVIDIA H200}
        """
    ) == [
        "s.yaml:4:12: gpus[0].uuid: 'GPU-1234' is not a GPU UUID "
        "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
        "s.yaml:5:18: gpus[1].pci_bus_id: same as gpus[0]",
        "s.yaml:5:32: gpus[1]: unknown key 'modle' (did you mean 'model'?)",
    ]


def test_jitter_on_a_counter() -> None:
    assert errors(HEAD + "jitter: {ecc_corrected_volatile: 1}\n") == [
        "s.yaml:4:10: jitter: 'ecc_corrected_volatile' is a counter; jitter applies to "
        "measured gauges (temperatures, power, clocks, ...)"
    ]


def test_all_problems_are_reported_at_once() -> None:
    lines = errors(
        HEAD
        + """\
timeline:
  - at: 1m
    gpu: 9
    set: {powr: 1}
  - at: 2x
    note: x
"""
    )
    assert [line.split(": ")[0] for line in lines] == ["s.yaml:6:10", "s.yaml:7:11", "s.yaml:8:9"]


# -- semantics ---------------------------------------------------------------------------


def test_identity_defaults() -> None:
    s = scenario("")
    infos = s.gpu_infos()
    assert [i.pci_bus_id for i in infos] == [
        f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
    ]
    assert len({i.uuid for i in infos}) == 8
    assert all(len(i.uuid) == 40 and i.uuid.startswith("GPU-") for i in infos)
    assert all(i.nvlink_count == 18 for i in infos)
    assert infos[0].name == "NVIDIA H100 80GB HBM3"
    # Same name, same identities: a scenario describes the same node on every run.
    assert scenario("").gpu_infos() == infos


def test_explicit_gpu_list() -> None:
    s = parse_scenario(
        textwrap.dedent(
            """\
            name: t
            duration: 1h
            gpus:
              - {uuid: GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee, pci_bus_id: 0000:3b:00.0,
                 model: NVIDIA H200, serial: "1234"}
              - {model: NVIDIA H100 80GB HBM3, nvlink_links: 0}
            """
        ),
        "s.yaml",
    )
    a, b = s.gpu_infos()
    assert (a.uuid, a.pci_bus_id, a.name, a.serial) == (
        "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
        "00000000:3B:00.0",
        "NVIDIA H200",
        "1234",
    )
    assert a.nvlink_count == 18 and b.nvlink_count == 0
    assert s.values_at(1, 0)[1] == ()


def test_ramp_add_set_closed_form() -> None:
    s = scenario(
        """\
        timeline:
          - at: 1h
            gpu: 3
            ramp: {field: ecc_corrected_volatile, rate: 1, per: 10m}
          - at: 2h
            gpu: 3
            add: {ecc_corrected_volatile: 100}
          - at: 3h
            gpu: 3
            ramp: {field: ecc_corrected_volatile, rate: 1, per: 1m}
          - at: 4h
            gpu: 3
            set: {ecc_corrected_volatile: 0}
        """
    )

    def ecc(t: float) -> float:
        return s.values_at(3, t)[0]["ecc_corrected_volatile"]

    assert ecc(3600) == 0
    assert ecc(3600 + 599) == 0  # floored: integer fields never show fractions
    assert ecc(3600 + 600) == 1
    assert ecc(7200) == 106  # 6 from the ramp, +100
    assert ecc(7200 + 1800) == 109  # add keeps the ramp running
    assert ecc(3 * 3600 + 60) == 113  # the later ramp replaced the earlier one
    assert ecc(4 * 3600) == 0  # set stops the ramp (a driver reload)
    assert ecc(5 * 3600) == 0
    assert s.values_at(2, 5 * 3600)[0]["ecc_corrected_volatile"] == 0  # other GPUs untouched
    # The lifetime counter follows the volatile one's ramps and adds, not its reset.
    assert s.values_at(3, 5 * 3600)[0]["ecc_corrected_aggregate"] == 172


def test_values_do_not_depend_on_how_often_they_are_sampled() -> None:
    s = load_scenario(os.path.join(ROOT, "scenarios", "ecc-leak.yaml"))
    end = 20 * 86400.0
    counters = [n for n, f in GPU_FIELDS.items() if f.kind == "counter"]

    def walk(step: float) -> dict[float, dict[str, float]]:
        seen = {}
        t = 0.0
        while t <= end:
            if t % 86400 == 0:
                fields = s.values_at(4, t)[0]
                seen[t] = {c: fields[c] for c in counters if c in fields}
            t += step
        return seen

    coarse, fine = walk(86400.0), walk(3600.0)
    assert coarse == fine
    assert coarse == walk(86400.0)  # and twice gives the same
    assert coarse[end]["ecc_corrected_volatile"] == 368


def test_backend_counters_match_across_step_sizes() -> None:
    s = load_scenario(os.path.join(ROOT, "scenarios", "nvlink-crc-storm.yaml"))

    def run(step: float) -> float:
        clock = VirtualClock()
        backend = ScenarioBackend(s, clock, real_stalls=False)
        backend.open()
        value = 0.0
        elapsed = 0.0
        while elapsed < 3600:
            clock.advance(step)
            elapsed += step
            value = backend.sample(1).links[7].fields["nvlink_crc_errors"]
        return value

    assert run(1.0) == run(60.0) == run(600.0) == 20 * 3 + 10 * 60 * 200


def test_set_gauges_and_derived_series() -> None:
    s = scenario(
        """\
        timeline:
          - at: 1h
            set: {power: 600W, memory_used: 10GiB, utilization_gpu: 50%}
        """
    )
    before, _, _ = s.values_at(0, 1800)
    after, _, procs = s.values_at(0, 7200)
    assert before["power"] == 70 and after["power"] == 600
    assert after["utilization_gpu"] == 0.5
    assert after["memory_free"] == after["memory_total"] - 10 * 1024**3
    assert after["energy"] == 70 * 3600 + 600 * 3600  # energy integrates power
    assert procs == ()


def test_processes_follow_compute_processes() -> None:
    s = scenario("timeline:\n  - at: 0s\n    set: {compute_processes: 2, memory_used: 4GiB}\n")
    _, _, procs = s.values_at(1, 10)
    assert len(procs) == 2
    assert len({p.pid for p in procs}) == 2
    assert all(p.used_memory_bytes == 2 * 1024**3 for p in procs)


def test_throttle_sets_bits_and_runs_the_violation_counter() -> None:
    s = scenario(
        """\
        timeline:
          - at: 1h
            gpu: 6
            throttle: [hw_thermal_slowdown, sw_thermal_slowdown]
          - at: 2h
            gpu: 6
            throttle: []
        """
    )
    during = s.values_at(6, 5400)[0]
    assert int(during["clock_event_reasons"]) == 0x40 | 0x20
    assert during["violation_thermal"] == 1800
    after = s.values_at(6, 3 * 3600)[0]
    assert after["clock_event_reasons"] == 0
    assert after["violation_thermal"] == 3600
    assert after["violation_power"] == 0


def test_lose_and_recover() -> None:
    s = scenario(
        """\
        timeline:
          - {at: 4h, gpu: 2, lose: true}
          - {at: 5h, gpu: 2, recover: true}
          - {at: 6h, gpu: [0, 1], lose: true}
        """
    )
    assert s.state_at(2, 4 * 3600 - 1).status == "ok"
    assert s.state_at(2, 4 * 3600).status == "lost"
    assert s.state_at(2, 5 * 3600).status == "ok"
    assert s.state_at(0, 86400).status == "lost"
    assert s.state_at(1, 86400).status == "lost"
    assert s.state_at(3, 86400).status == "ok"


def test_stall_state() -> None:
    s = scenario("timeline:\n  - {at: 1h, gpu: 1, stall: 60s}\n")
    assert s.state_at(1, 3600).status == "stall"
    assert s.state_at(1, 3630).until == 3660
    assert s.state_at(1, 3660).status == "ok"


def test_jitter_is_deterministic_and_bounded() -> None:
    s = scenario("jitter: {temperature_gpu: 2, power: 10}\n")
    again = scenario("jitter: {temperature_gpu: 2, power: 10}\n")
    temps = [s.values_at(0, t)[0]["temperature_gpu"] for t in range(0, 3600, 7)]
    assert temps == [again.values_at(0, t)[0]["temperature_gpu"] for t in range(0, 3600, 7)]
    assert len(set(temps)) > 1
    assert all(31 <= v <= 35 for v in temps)
    powers = [s.values_at(0, t)[0]["power"] for t in range(0, 3600, 7)]
    assert all(60 <= v <= 80 for v in powers)


def test_kernel_lines_and_notes_are_in_time_order() -> None:
    s = scenario(
        """\
        timeline:
          - at: 2h
            kernel_log: "NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, GPU has fallen off the bus."
            note: second
          - at: 1h
            kernel_log: "NVRM: Xid (PCI:0000:5d:00): 79, forged"
            transport: syslog
            note: first
        """
    )
    assert [(t, tr) for t, tr, _ in s.kernel_lines()] == [(3600, "syslog"), (7200, "kernel")]
    assert [n.text for n in s.notes] == ["first", "second"]


def test_format_duration() -> None:
    assert [format_duration(x) for x in (0, 0.25, 90, 3600, 5400, 4 * 86400, 604800)] == [
        "0s",
        "250ms",
        "1m30s",
        "1h",
        "1h30m",
        "4d",
        "1w",
    ]


# -- backend -----------------------------------------------------------------------------


def _backend(body: str, clock: VirtualClock | ScaledClock, real_stalls: bool) -> ScenarioBackend:
    backend = ScenarioBackend(scenario(body), clock, real_stalls=real_stalls)
    backend.open()
    return backend


def test_backend_samples_at_scenario_time_and_holds_the_end() -> None:
    clock = VirtualClock()
    backend = _backend(
        "timeline:\n  - {at: 1h, gpu: 0, ramp: {field: pcie_replay, rate: 1}}\n", clock, False
    )
    clock.advance(3600 + 10)
    sample = backend.sample(0)
    assert sample.fields["pcie_replay"] == 10
    assert sample.timestamp == clock.now()
    assert sample.uuid == backend.open()[0].uuid
    clock.advance(10 * 86400)
    assert backend.sample(0).fields["pcie_replay"] == 86400 - 3600  # clamped to duration


def test_backend_lost_gpu_raises_gpu_lost() -> None:
    clock = VirtualClock()
    backend = _backend("timeline:\n  - {at: 1m, gpu: 2, lose: true}\n", clock, False)
    backend.sample(2)
    clock.advance(60)
    with pytest.raises(GpuLost) as info:
        backend.sample(2)
    assert info.value.code == 15
    backend.sample(1)


def test_backend_stall_in_virtual_mode_raises_at_once() -> None:
    clock = VirtualClock()
    backend = _backend("timeline:\n  - {at: 1m, gpu: 1, stall: 60s}\n", clock, False)
    clock.advance(90)
    with pytest.raises(CallTimeout):
        backend.sample(1)
    backend.sample(0)
    clock.advance(30)
    backend.sample(1)


def test_backend_stall_in_real_mode_blocks_until_it_ends() -> None:
    clock = ScaledClock(600.0)  # 60 s of stall is 0.1 s of wall time
    backend = _backend("timeline:\n  - {at: 0s, gpu: 1, stall: 60s}\n", clock, True)
    began = time.monotonic()
    sample = backend.sample(1)
    waited = time.monotonic() - began
    assert 0.05 <= waited < 2.0
    assert sample.duration_seconds >= 30
    assert backend.sample(0).duration_seconds < 30


def test_backend_close_wakes_a_stalled_call() -> None:
    clock = ScaledClock(1.0)
    backend = _backend("timeline:\n  - {at: 0s, gpu: 1, stall: 1h}\n", clock, True)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            backend.sample(1)
        except CallTimeout as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(0.05)
    assert thread.is_alive()
    began = time.monotonic()
    backend.close()
    thread.join(10.0)
    assert not thread.is_alive()
    assert time.monotonic() - began < 5.0  # the call would block for ever otherwise
    assert len(outcome) == 1


def test_backend_concurrent_samples_from_8_threads() -> None:
    clock = VirtualClock()
    s = load_scenario(os.path.join(ROOT, "scenarios", "healthy-8xh100.yaml"))
    backend = ScenarioBackend(s, clock, real_stalls=False)
    infos = backend.open()
    clock.advance(3600)
    expected = {i.index: backend.sample(i.index) for i in infos}
    results: dict[int, list[object]] = {i.index: [] for i in infos}
    barrier = threading.Barrier(len(infos))

    def poll(index: int) -> None:
        barrier.wait()
        for _ in range(200):
            results[index].append(backend.sample(index))

    threads = [threading.Thread(target=poll, args=(i.index,)) for i in infos]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index, samples in results.items():
        assert len(samples) == 200
        assert all(x == expected[index] for x in samples)


def test_backend_delivers_nvml_xids_once() -> None:
    clock = VirtualClock()
    backend = _backend(
        """\
        timeline:
          - {at: 10m, gpu: 3, nvml_xid: 79}
          - {at: 20m, gpu: [1, 2], nvml_xid: 31}
        """,
        clock,
        False,
    )
    assert backend.wait_xid_events(1.0) == []
    clock.advance(600)
    (event,) = backend.wait_xid_events(1.0)
    info = backend.open()[3]
    assert (event.xid, event.gpu, event.uuid, event.pci_bus_id, event.source) == (
        79,
        3,
        info.uuid,
        info.pci_bus_id,
        "nvml",
    )
    assert event.timestamp == backend.t0 + 600
    assert backend.wait_xid_events(1.0) == []
    clock.advance(3600)
    assert [(e.gpu, e.xid) for e in backend.wait_xid_events(1.0)] == [(1, 31), (2, 31)]


def test_backend_xid_wait_blocks_until_the_next_event() -> None:
    clock = ScaledClock(600.0)
    backend = _backend("timeline:\n  - {at: 1m, gpu: 0, nvml_xid: 79}\n", clock, True)
    began = time.monotonic()
    events = backend.wait_xid_events(3600.0)
    assert [e.xid for e in events] == [79]
    assert time.monotonic() - began < 10.0  # 0.1 s of wall time; the wait asked for 3600 s


def test_backend_kernel_lines_until() -> None:
    clock = VirtualClock()
    backend = _backend(
        """\
        timeline:
          - at: 1m
            kernel_log: "NVRM: Xid (PCI:0000:5d:00): 79, forged"
            transport: kmsg-user
          - at: 2m
            kernel_log: "NVRM: Xid (PCI:0000:5d:00): 79, pid=1, name=x, GPU has fallen off the bus."
        """,
        clock,
        False,
    )
    t0 = backend.t0
    assert backend.kernel_log_lines_until(t0 + 59) == []
    assert [tr for _, tr, _ in backend.kernel_log_lines_until(t0 + 90)] == ["kmsg-user"]
    assert [(t - t0, tr) for t, tr, _ in backend.kernel_log_lines_until(t0 + 3600)] == [
        (120, "kernel")
    ]
    assert backend.kernel_log_lines_until(t0 + 7200) == []


def test_test_gpus_come_from_the_one_h100_table() -> None:
    """Issue 24 item 7: the scenario backend, the test backend and the rule kit had three
    H100 tables with the same keys and different values; now both test GPUs are the
    scenario's H100 baseline with named changes, and the same identity facts."""
    from rulekit import BASE

    from gpuwatchd.scenario.gpumodels import DRIVER_VERSION, H100, at_work
    from gpuwatchd.testing.fake_backend import DEFAULT_FIELDS, make_infos

    assert set(DEFAULT_FIELDS) == set(BASE) == set(H100.baseline)
    for name in ("pcie_link_generation_max", "memory_total", "ecc_uncorrected_volatile"):
        assert DEFAULT_FIELDS[name] == BASE[name] == H100.baseline[name]
    info = make_infos(4)[2]
    assert (info.name, info.vbios, info.driver) == (H100.name, H100.vbios, DRIVER_VERSION)
    assert info.slowdown_temperature == H100.slowdown_temperature
    assert info.shutdown_temperature == H100.shutdown_temperature
    played = load_scenario(os.path.join(ROOT, "scenarios", "healthy-8xh100.yaml"))
    assert info.pci_bus_id == played.gpus[2].info().pci_bus_id
    with pytest.raises(KeyError, match="temperature_gpuu"):
        at_work(H100, temperature_gpuu=50.0)
