"""The shipped rules end to end: their rule tests, the ECC trend lead time, simulate's
alert lines, check-config, `rules test`/`fmt`, and a SIGHUP reload of a running daemon."""

from __future__ import annotations

import functools
import glob
import io
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT, Proc

from gpuwatchd.configfile.loader import default_config
from gpuwatchd.harness.ruletest import run_file
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import format_duration, load_scenario

RULE_TESTS = sorted(glob.glob(str(ROOT / "rules" / "tests" / "*.yaml")))
SCENARIOS = ROOT / "scenarios"
STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, *args], capture_output=True, text=True, cwd=ROOT, check=False, timeout=300
    )


@pytest.mark.parametrize("path", RULE_TESTS, ids=os.path.basename)
def test_shipped_rule_tests_pass(path: str) -> None:
    out = io.StringIO()
    total, failed = run_file(path, out)
    assert total > 0
    assert failed == 0, out.getvalue()


@functools.cache
def alerts(scenario: str) -> list[dict[str, object]]:
    """The alert records of simulating a shipped scenario with the shipped rules."""
    records: list[dict[str, object]] = []
    sim = Simulation(
        load_scenario(str(SCENARIOS / scenario)), default_config({}), on_record=records.append
    )
    sim.run()
    return [r for r in records if r.get("record") == "alert"]


def test_ecc_trend_drains_at_least_a_day_before_the_double_bit_error() -> None:
    found = alerts("ecc-leak.yaml")
    page = next(
        a for a in found if a["rule"] == "GpuMemoryErrorsAccelerating" and a["state"] == "firing"
    )
    dbe = next(a for a in found if a["rule"] == "GpuXidFatal" and a["state"] == "firing")
    assert page["gpu"] == dbe["gpu"] == "4"
    assert page["severity"] == "ticket" and page["drain"] is True  # the rate never pages
    lead = float(dbe["timestamp"]) - float(page["timestamp"])  # type: ignore[arg-type]
    print(
        f"\nECC trend: page at {page['t']}, double-bit error (XID 48) at {dbe['t']}: "
        f"lead time {format_duration(lead)} ({lead / 3600:.1f} h)"
    )
    assert lead >= 24 * 3600
    # the page says what it saw
    ann = page["annotations"]
    assert isinstance(ann, dict) and "HBM corrected errors accelerating" in ann["summary"]
    assert "p = " in ann["summary"] and "/day against" in ann["summary"]


@pytest.mark.parametrize(
    ("scenario", "rule", "severity"),
    [
        ("ecc-leak.yaml", "GpuMemoryErrorsAccelerating", "ticket"),
        ("ecc-leak.yaml", "GpuMemoryErrorsCorroborated", "page"),
        ("thermal-slowdown.yaml", "GpuTemperatureHigh", "page"),
        ("fallen-off-bus.yaml", "GpuLost", "page"),
        ("fallen-off-bus.yaml", "GpuXidFatal", "page"),
        ("stuck-workload.yaml", "GpuStuckWorkload", "page"),
        ("nvlink-crc-storm.yaml", "NvlinkCrcErrorsRising", "ticket"),
    ],
)
def test_bad_scenarios_alert(scenario: str, rule: str, severity: str) -> None:
    fired = [a for a in alerts(scenario) if a["state"] == "firing" and a["rule"] == rule]
    assert fired and all(a["severity"] == severity for a in fired)


def test_simulate_prints_alert_transitions_and_stays_quiet_when_healthy(tmp_path: Path) -> None:
    result = cli("simulate", "fallen-off-bus")  # a shipped scenario, by its name
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    got = [(r["t"], r["rule"], r["state"], r["gpu"]) for r in lines if r["record"] == "alert"]
    assert ("1h", "GpuLost", "firing", "3") in got
    assert ("1h", "GpuXidFatal", "firing", "3") in got
    lost = next(r for r in lines if r["record"] == "alert" and r["rule"] == "GpuLost")
    assert lost["drain"] is True and lost["labels"]["pci_bus_id"] == "00000000:5D:00.0"
    assert lost["annotations"]["summary"].startswith("GPU 3 (00000000:5D:00.0) of ")
    quiet = cli("simulate", str(SCENARIOS / "healthy-8xh100.yaml"))
    assert quiet.returncode == 0, quiet.stderr
    assert '"record": "alert"' not in quiet.stdout


# -- check-config, rules test, rules fmt ---------------------------------------------------------
BAD_RULE = """\
rules:
- name: SiteHot
  severity: pager
  condition:
    threshold: {field: temperature_gpu, op: '>', value: 80}
"""


def test_check_config_validates_rule_files(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(BAD_RULE.replace("pager", "page"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_RULE)
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"rules:\n  files: [{good}]\n")
    ok = cli("check-config", "-c", str(cfg))
    assert ok.returncode == 0, ok.stderr
    assert "rules: 47 rule(s) from 5 file(s): OK" in ok.stdout
    result = cli("check-config", "-c", str(cfg), str(bad))
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"{bad}:2:9: rules[0].name: rule 'SiteHot' is already defined at {good}:2:9",
        f"{bad}:3:13: rule 'SiteHot'.severity: 'pager' is not one of page, ticket, info "
        "(did you mean 'page'?)",
    ]
    cfg.write_text("rules:\n  files: [nope.yaml]\n")
    missing = cli("check-config", "-c", str(cfg))
    assert missing.returncode == 1
    assert (
        missing.stderr.strip() == f"{cfg}:2:11: rules.files: '{tmp_path}/nope.yaml' does not exist"
    )


def test_rules_test_reports_a_readable_diff_and_exit_1(tmp_path: Path) -> None:
    tests = tmp_path / "t.yaml"
    tests.write_text(
        f"""\
tests:
- name: expects the wrong time
  scenario: {SCENARIOS / "thermal-slowdown.yaml"}
  alerts:
  - at: 44m
    rule: GpuTemperatureHigh
    firing:
    - {{gpu: 6}}
  transitions:
  - {{at: 40m, rule: GpuTemperatureHigh, state: firing, gpu: 6}}
- name: inline series
  input:
    gpus: 2
    step: 1m
    series:
    - {{gpu: 1, field: temperature_gpu, values: '60 90x7 60'}}
  transitions:
  - {{at: 6m, rule: GpuTemperatureHigh, state: firing, gpu: 1}}
  - {{at: 9m, rule: GpuTemperatureHigh, state: resolved, gpu: 1}}
"""
    )
    result = cli("rules", "test", str(tests))
    assert result.returncode == 1
    out = result.stdout
    assert f"{tests}: FAIL expects the wrong time" in out
    assert (
        f"{tests}:5:5: at 44m (evaluated at 44m): firing alerts of GpuTemperatureHigh differ" in out
    )
    assert "expected, not firing: GpuTemperatureHigh{gpu=6}" in out
    assert f"{tests}:10:5: transitions differ:" in out
    assert "-40m GpuTemperatureHigh firing gpu=6" in out
    assert "+45m GpuTemperatureHigh firing gpu=6" in out
    assert f"{tests}: PASS inline series" in out
    assert out.strip().endswith("1 passed, 1 failed")


def test_rules_test_file_errors_have_locations(tmp_path: Path) -> None:
    tests = tmp_path / "t.yaml"
    tests.write_text(
        "tests:\n- name: x\n  scenario: nope.yaml\n  alerts:\n  - at: 1m\n"
        "    rule: NoSuchRule\n    firing: []\n"
    )
    result = cli("rules", "test", str(tests))
    assert result.returncode == 1
    assert f"{tests}:6:11: test 'x'.alerts[0].rule: no rule named 'NoSuchRule' is loaded" in (
        result.stdout
    )
    assert f"{tmp_path}/nope.yaml:1:1: cannot read file" in result.stdout


def test_rules_fmt(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(
        "# site rules\nrules:\n- severity: page\n  name: SiteHot\n  condition:\n"
        "    threshold: {value: 80, op: '>', field: temperature_gpu}\n"
    )
    check = cli("rules", "fmt", "--check", str(path))
    assert check.returncode == 1
    assert "-- severity: page" in check.stdout and "+- name: SiteHot" in check.stdout
    write = cli("rules", "fmt", "--write", str(path))
    assert write.returncode == 0, write.stderr
    assert path.read_text() == (
        "# site rules\nrules:\n- name: SiteHot\n  severity: page\n  condition:\n"
        "    threshold:\n      field: temperature_gpu\n      op: '>'\n      value: 80\n"
    )
    assert cli("rules", "fmt", "--check", str(path)).returncode == 0
    listing = cli("rules", "list")
    assert listing.returncode == 0 and "GpuMemoryErrorsAccelerating" in listing.stdout


def test_run_refuses_bad_rules(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_RULE)
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"rules:\n  files: [{bad}]\nstate_dir: {tmp_path}/state\n")
    result = cli("run", "-c", str(cfg), "--backend", f"scenario:{STEADY}")
    assert result.returncode == 1
    assert f"{bad}:3:13: rule 'SiteHot'.severity:" in result.stderr


# -- reload on SIGHUP ------------------------------------------------------------------------------
def scrape(url: str) -> str:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        body: str = resp.read().decode()
    return body


def wait_for(url: str, text: str, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    body = ""
    while time.monotonic() < deadline:
        body = scrape(url)
        if text in body:
            return body
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in /metrics:\n{body[-3000:]}")


def test_sighup_reload_keeps_old_rules_on_error(
    tmp_path: Path, daemon_factory: Callable[..., tuple[Proc, str]]
) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(BAD_RULE.replace("pager", "page"))
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"rules:\n  files: [{site}]\n  defaults: false\n")
    proc, url = daemon_factory("-c", str(cfg), "--backend", f"scenario:{STEADY}")
    body = wait_for(url, "gpuwatchd_rules_loaded 1.0")
    assert "gpuwatchd_rules_reload_success 1.0" in body
    assert 'gpuwatchd_rule_evaluations_total{rule="SiteHot"}' in body
    site.write_text(BAD_RULE)  # a typo
    proc.popen.send_signal(signal.SIGHUP)
    body = wait_for(url, "gpuwatchd_rules_reload_success 0.0")
    assert "gpuwatchd_rules_loaded 1.0" in body  # the old rule still runs
    deadline = time.monotonic() + 10
    while f"{site}:3:13:" not in proc.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"{site}:3:13: rule 'SiteHot'.severity: 'pager' is not one of" in proc.output()
    site.write_text(
        BAD_RULE.replace("pager", "page") + "- name: SiteWarm\n  severity: ticket\n  condition:\n"
        "    threshold: {field: temperature_gpu, op: '>', value: 70}\n"
    )
    proc.popen.send_signal(signal.SIGHUP)
    body = wait_for(url, "gpuwatchd_rules_loaded 2.0")
    assert "gpuwatchd_rules_reload_success 1.0" in body
    assert 'gpuwatchd_alerts{rule="SiteWarm",severity="ticket",state="firing"}' in body
