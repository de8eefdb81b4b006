"""The config's ``fields`` section (extra NVML field ids) from the file to /metrics, and the
row-remapper histogram as evidence for rules."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import GPUWATCHD, ROOT, need_binary
from rulekit import Node

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.rules.loader import parse_rules
from gpuwatchd.scenario.model import parse_scenario


def config_errors(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(ConfigError) as err:
        load_config(str(path), must_exist=True)
    prefix = str(path) + ":"
    return [line.removeprefix(prefix) for line in err.value.lines()]


# -- the section ----------------------------------------------------------------------------
def test_a_valid_section_loads_and_prints_back_to_itself(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "fields:\n"
        "  - {id: 32, name: crc_l0, kind: counter, help: 'CRC lane 0.'}\n"
        "  - {id: 200, name: limit_watts, scale: 0.001, slow: true}\n"
    )
    config = load_config(str(path), must_exist=True)
    assert config.fields == (
        ExtraField(32, "crc_l0", "counter", "CRC lane 0."),
        ExtraField(200, "limit_watts", "gauge", "", 0.001, True),
    )
    again = tmp_path / "again.yaml"
    again.write_text(yaml.safe_dump(config.as_dict()))
    assert load_config(str(again), must_exist=True).fields == config.fields


@pytest.mark.parametrize(
    ("entries", "expected"),
    [
        (
            "  - {id: 32, name: a}\n  - {id: 32, name: b}\n",
            "3:10: fields[1].id: field id 32 is already fields[0]",
        ),
        (
            "  - {id: 32, name: a}\n  - {id: 33, name: a}\n",
            "3:20: fields[1].name: 'a' is already the name of fields[0]",
        ),
        (
            "  - {id: 94, name: pcie_replay}\n",
            "2:20: fields[0].name: 'pcie_replay' is a built-in field; choose another name",
        ),
        (
            "  - {id: 161, name: nvlink_replay_errors}\n",
            "2:21: fields[0].name: 'nvlink_replay_errors' is a built-in field; choose another name",
        ),
        ("  - {id: 0, name: a}\n", "2:10: fields[0].id: 0 is not an NVML field id (1 to 1023)"),
        (
            "  - {id: 1024, name: a}\n",
            "2:10: fields[0].id: 1024 is not an NVML field id (1 to 1023)",
        ),
        (
            "  - {id: 5, name: a, kind: histogram}\n",
            "2:28: fields[0].kind: 'histogram' is not one of gauge, counter",
        ),
        (
            "  - {id: 5, name: Crc-L0}\n",
            "2:19: fields[0].name: 'Crc-L0' is not a field name (a lowercase letter, then up "
            "to 63 lowercase letters, digits or underscores)",
        ),
        (
            "  - {id: 5, name: crc_total, kind: counter}\n",
            "2:19: fields[0].name: 'crc_total' ends in _total; leave it out (a counter's "
            "metric gets it)",
        ),
        # issue 26: each passed check-config on main and broke `promtool check metrics`
        # (or, for _created, duplicated the series OpenMetrics gives a counter)
        (
            "  - {id: 5, name: crc_count}\n",
            "2:19: fields[0].name: 'crc_count' ends in _count, which the exposition formats "
            "reserve for a histogram's or summary's count; choose another name",
        ),
        (
            "  - {id: 5, name: crc_sum}\n",
            "2:19: fields[0].name: 'crc_sum' ends in _sum, which the exposition formats "
            "reserve for a histogram's or summary's sum; choose another name",
        ),
        (
            "  - {id: 5, name: crc_bucket, kind: counter}\n",
            "2:19: fields[0].name: 'crc_bucket' ends in _bucket, which the exposition formats "
            "reserve for a histogram's buckets; choose another name",
        ),
        (
            "  - {id: 5, name: crc_created}\n",
            "2:19: fields[0].name: 'crc_created' ends in _created, which the exposition formats "
            "reserve for the creation time OpenMetrics gives every counter; choose another name",
        ),
        ("  - {id: 5, name: a, scale: 0}\n", "2:29: fields[0].scale: must not be 0"),
        ("  - {name: a}\n", "2:5: fields[0]: missing required key 'id'"),
        (
            "  - {id: 5, name: a, every: 10s}\n",
            "2:22: fields[0]: unknown key 'every'",
        ),
    ],
)
def test_bad_entries_are_located(tmp_path: Path, entries: str, expected: str) -> None:
    assert config_errors(tmp_path, "fields:\n" + entries) == [expected]


def test_more_than_64_fields_is_an_error(tmp_path: Path) -> None:
    entries = "".join(f"  - {{id: {i}, name: f{i}}}\n" for i in range(1, 66))
    assert config_errors(tmp_path, "fields:\n" + entries) == [
        "2:3: fields: at most 64 extra fields, got 65 (each one is read from every GPU "
        "on every poll)"
    ]


def test_a_help_text_on_several_lines_is_refused(tmp_path: Path) -> None:
    (line,) = config_errors(tmp_path, 'fields:\n  - {id: 5, name: a, help: "one\\ntwo"}\n')
    assert line.startswith("2:28: fields[0].help: one line of printable text")


# -- rules ------------------------------------------------------------------------------------
RULE = """\
rules:
- name: CrcRising
  severity: ticket
  condition:
    increase: {field: crc_l0, window: 10m}
"""
CRC = ExtraField(32, "crc_l0", "counter")


def test_a_rule_on_an_undeclared_field_is_a_located_error() -> None:
    with pytest.raises(ConfigError) as err:
        parse_rules(RULE, "site.yaml")
    assert err.value.lines() == [
        "site.yaml:5:23: rule 'CrcRising'.condition.increase.field: unknown field 'crc_l0' "
        "(another NVML field id needs an entry in the config's `fields` section)"
    ]
    (rule,) = parse_rules(RULE, "site.yaml", (CRC,))
    assert rule.name == "CrcRising"


def test_a_gauge_extra_field_is_no_counter_for_increase() -> None:
    with pytest.raises(ConfigError) as err:
        parse_rules(RULE, "site.yaml", (ExtraField(32, "crc_l0", "gauge"),))
    assert "'crc_l0' is a gauge; this condition needs a counter" in err.value.lines()[0]


def test_check_config_accepts_a_rule_on_a_declared_field(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(RULE)
    config = tmp_path / "c.yaml"
    config.write_text("rules: {files: [site.yaml]}\n")
    bad = subprocess.run(
        [*GPUWATCHD, "check-config", "-c", str(config)], capture_output=True, text=True
    )
    assert bad.returncode == 1
    assert f"{tmp_path / 'site.yaml'}:5:23:" in bad.stdout + bad.stderr
    config.write_text(
        "rules: {files: [site.yaml]}\nfields:\n  - {id: 32, name: crc_l0, kind: counter}\n"
    )
    good = subprocess.run(
        [*GPUWATCHD, "check-config", "-c", str(config)], capture_output=True, text=True
    )
    assert good.returncode == 0, good.stdout + good.stderr


# -- scenarios --------------------------------------------------------------------------------
SCENARIO = """\
name: extra-fields
duration: 1h
step: 1m
gpus: {count: 2}
timeline:
  - at: 10m
    gpu: 1
    set: {crc_l0: 5}
"""


def test_a_scenario_sets_a_declared_field_and_names_an_undeclared_one() -> None:
    with pytest.raises(ConfigError) as err:
        parse_scenario(SCENARIO, "s.yaml")
    assert err.value.lines() == [
        "s.yaml:8:11: timeline[0].set: unknown field 'crc_l0' (another NVML field id needs "
        "an entry in the config's `fields` section)"
    ]
    s = parse_scenario(SCENARIO, "s.yaml", (CRC,))
    assert "crc_l0" not in s.values_at(1, 300.0)[0]  # absent until the timeline sets it
    assert s.values_at(1, 900.0)[0]["crc_l0"] == 5
    assert "crc_l0" not in s.values_at(0, 900.0)[0]


def test_derived_fields_follow_their_sources_and_cannot_be_set() -> None:
    s = parse_scenario(
        "name: d\nduration: 1h\ngpus: {count: 1}\ntimeline:\n"
        "  - {at: 1m, set: {temperature_memory: 80, temperature_gpu: 70}}\n"
        "  - {at: 2m, add: {ecc_corrected_volatile: 10, ecc_corrected_volatile_dev: 4}}\n",
        "d.yaml",
    )
    f = s.values_at(0, 180.0)[0]
    assert f["temperature_memory_margin"] == 95 - 80  # the H100's memory max is 95 C
    assert f["temperature_gpu_margin"] == 89 - 70  # its slowdown is 89 C
    assert f["ecc_corrected_volatile_sram"] == 6
    with pytest.raises(ConfigError) as err:
        parse_scenario(
            "name: d\nduration: 1h\ngpus: {count: 1}\ntimeline:\n"
            "  - {at: 1m, set: {ecc_corrected_volatile_sram: 3}}\n",
            "d.yaml",
        )
    assert err.value.lines() == [
        "d.yaml:5:20: timeline[0].set: 'ecc_corrected_volatile_sram' is derived "
        "(ecc_corrected_volatile minus ecc_corrected_volatile_dev); set those instead"
    ]


# -- end to end: config -> scenario -> rule -> /metrics ----------------------------------------
E2E_SCENARIO = """\
name: extra-fields-e2e
duration: 30m
step: 1m
gpus: {count: 2}
timeline:
  - at: 5m
    gpu: 1
    note: "GPU 1: NVLink lane 0 starts to corrupt flits"
    ramp: {field: crc_l0, rate: 2, per: 1m}
  - at: 8m
    gpu: 0
    note: "GPU 0: a bank runs out of spare rows"
    set: {row_remap_banks_max: 3070, row_remap_banks_low: 1, row_remap_banks_none: 1}
"""
E2E_RULES = """\
rules:
- name: SiteCrcLane0Rising
  severity: ticket
  condition:
    increase: {field: crc_l0, window: 5m, op: '>', value: 4}
  annotations:
    summary: 'GPU {gpu}: {value:.0f} flit CRC errors on lane 0 in {window}'
"""


def test_config_to_scenario_to_rule_to_metrics(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(E2E_SCENARIO)
    (tmp_path / "site.yaml").write_text(E2E_RULES)
    config = tmp_path / "c.yaml"
    config.write_text(
        "node_name: n1\nrules: {files: [site.yaml]}\nmetrics: {dcgm_compat: true}\n"
        "fields:\n  - {id: 32, name: crc_l0, kind: counter, help: 'Flit CRC errors, lane 0.'}\n"
    )
    out = tmp_path / "metrics.txt"
    run = subprocess.run(
        [
            *GPUWATCHD,
            "simulate",
            str(tmp_path / "s.yaml"),
            "-c",
            str(config),
            "--metrics-out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    records = [json.loads(line) for line in run.stdout.splitlines()]
    firing = {
        (r.get("rule"), r.get("gpu"))
        for r in records
        if r.get("state") == "firing" and r.get("rule") is not None
    }
    assert ("SiteCrcLane0Rising", 1) in firing or ("SiteCrcLane0Rising", "1") in firing
    assert ("GpuRowRemapBankExhausted", 0) in firing or ("GpuRowRemapBankExhausted", "0") in (
        firing
    )
    assert not any(r == "SiteCrcLane0Rising" and str(g) == "0" for r, g in firing)
    text = out.read_text()
    assert "# HELP gpuwatchd_field_crc_l0_total Flit CRC errors, lane 0.\n" in text
    assert "# TYPE gpuwatchd_field_crc_l0_total counter\n" in text
    crc = [line for line in text.splitlines() if line.startswith("gpuwatchd_field_crc_l0_total{")]
    assert len(crc) == 1 and 'gpu="1"' in crc[0] and crc[0].endswith(" 50.0")  # 25m x 2/min
    banks = {
        line.split('availability="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in text.splitlines()
        if line.startswith("gpuwatchd_row_remap_banks{") and 'gpu="0"' in line
    }
    assert banks == {"max": "3070.0", "low": "1.0", "none": "1.0"}
    assert any(
        line.startswith("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE{") and line.endswith(" 1.0")
        for line in text.splitlines()
    ), [line for line in text.splitlines() if "BANKS_REMAP" in line]
    lint = subprocess.run(
        [need_binary("promtool"), "check", "metrics"], input=text, capture_output=True, text=True
    )
    problems = [
        line
        for line in (lint.stdout + lint.stderr).splitlines()
        if line.startswith("gpuwatchd_field") or line.startswith("gpuwatchd_row_remap")
    ]
    assert not problems, problems


# -- memory_trend corroborated by the histogram -------------------------------------------------
CORROBORATED = """
rules:
- name: Corroborated
  severity: page
  condition:
    memory_trend: {signal: corroborated, window: 1d, min_active: 1, min_episodes: 1}
  annotations: {summary: '{evidence}'}
"""


def test_a_bank_low_on_spare_rows_corroborates_hbm_activity() -> None:
    n = Node(CORROBORATED, gpus=2)
    for f in n.fields:
        f["ecc_corrected_volatile_dev"] = 0.0
        f["row_remap_banks_low"] = 0.0
        f["row_remap_banks_none"] = 0.0
    n.poll()
    n.step(600)
    n.add(0, ecc_corrected_volatile_dev=2)
    n.add(1, ecc_corrected_volatile_dev=2)
    n.run(3600, step=600)
    assert not n.firing("Corroborated")  # activity alone
    n.set(1, row_remap_banks_low=1)
    n.step(60)
    assert n.firing("Corroborated") == {("Corroborated", "1")}
    tr = next(tr for _, tr in n.transitions if tr.rule == "Corroborated")
    assert tr.annotations["summary"] == "a bank with low or no spare rows left"


def test_a_reload_keeps_the_running_fields(tmp_path: Path) -> None:
    """The backend builds its poll batches at start-up: a rule on a field that only the
    reloaded config declares would never see a value, so the reload refuses it."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.core.clock import VirtualClock
    from gpuwatchd.rules.stage import rules_stage

    (tmp_path / "site.yaml").write_text("rules: []\n")
    path = tmp_path / "c.yaml"
    path.write_text(f"state_dir: {tmp_path}\nrules: {{files: [site.yaml]}}\n")
    config = load_config(str(path), must_exist=True)
    stage = rules_stage(for_rules(config), VirtualClock(), durable=False)
    try:
        (tmp_path / "site.yaml").write_text(RULE)
        path.write_text(
            f"state_dir: {tmp_path}\nrules: {{files: [site.yaml]}}\n"
            "fields:\n  - {id: 32, name: crc_l0, kind: counter}\n"
        )
        assert not stage.reload(for_rules(load_config(str(path), must_exist=True)))
        assert "CrcRising" not in {r.name for r in stage.engine.rules}
    finally:
        stage.close()


def test_rule_unit_tests_declare_extra_fields(tmp_path: Path) -> None:
    (tmp_path / "site.yaml").write_text(RULE)
    tests = tmp_path / "site-tests.yaml"
    body = (
        "tests:\n- name: lane 0 CRC errors open a ticket\n  input:\n    gpus: 2\n"
        "    step: 1m\n    series:\n    - {gpu: 1, field: crc_l0, values: '0 0 3 9 9'}\n"
        "  transitions:\n  - {at: 2m, rule: CrcRising, state: firing, gpu: 1}\n"
    )
    tests.write_text(
        "rule_files: [site.yaml]\nfields:\n  - {id: 32, name: crc_l0, kind: counter}\n" + body
    )
    ok = subprocess.run([*GPUWATCHD, "rules", "test", str(tests)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "1 passed, 0 failed" in ok.stdout
    tests.write_text("rule_files: [site.yaml]\n" + body)
    bad = subprocess.run([*GPUWATCHD, "rules", "test", str(tests)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert f"{tmp_path / 'site.yaml'}:5:23:" in bad.stdout + bad.stderr
