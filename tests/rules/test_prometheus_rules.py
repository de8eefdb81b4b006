"""packaging/prometheus: the central alerting rules mirror the node rules.

`promtool check rules` lints them; `promtool test rules` evaluates them on series taken from
`gpuwatchd simulate --metrics-out` snapshots of the shipped fault scenarios, and the alerts
Prometheus fires must be exactly those the node itself fires at the same moment.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import ROOT, need_binary
from promseries import INSTANCE, input_series, node_firing, simulate_snapshots

from gpuwatchd.config.receivers import DEFAULT_SEVERITY_LABELS
from gpuwatchd.configfile.loader import default_config
from gpuwatchd.configfile.stages import for_rules
from gpuwatchd.core.units import parse_duration
from gpuwatchd.rules import rules_from_settings

RULES = ROOT / "packaging" / "prometheus" / "gpuwatchd-rules.yaml"
# Alerts only a central Prometheus can raise: about the daemon, not about a GPU.
PROMETHEUS_ONLY = {"GpuwatchdDown", "GpuwatchdSourceDown", "GpuwatchdStateNotDurable"}


def prometheus_alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_promtool_check_rules() -> None:
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 56 rules found" in result.stdout


def test_every_node_rule_has_its_prometheus_twin_with_the_mapped_severity() -> None:
    alerts = prometheus_alerts()
    node_rules = rules_from_settings(for_rules(default_config()), []).rules
    assert len(node_rules) >= 25
    for rule in node_rules:
        assert rule.name in alerts, f"{rule.name} has no alert in {RULES.name}"
        severity = alerts[rule.name]["labels"]["severity"]
        assert severity == DEFAULT_SEVERITY_LABELS[rule.severity.value], rule.name
    assert set(alerts) - {r.name for r in node_rules} == PROMETHEUS_ONLY


def test_memory_twins_hold_as_long_as_the_node_rules() -> None:
    # A twin that judges for itself (not forwarding the node's verdict, which already holds)
    # keeps firing as long as its node rule: GpuEccCorrectedRising is one ticket per regime
    # on both paths (it resolved after a day in Prometheus before).
    alerts = prometheus_alerts()
    checked = 0
    for rule in rules_from_settings(for_rules(default_config()), []).rules:
        if not rule.name.startswith(("GpuEcc", "GpuMemory", "GpuRowRemap")):
            continue
        twin = alerts[rule.name]
        if "gpuwatchd_alerts" in twin["expr"]:
            continue
        hold = twin.get("keep_firing_for")
        seconds = parse_duration(str(hold)) if hold is not None else 0.0
        assert seconds == rule.keep_firing_for, rule.name
        checked += 1
    assert checked >= 3


def test_xid_code_lists_match_the_catalog_buckets_of_the_node_rules() -> None:
    alerts = prometheus_alerts()
    for rule in rules_from_settings(for_rules(default_config()), []).rules:
        codes = getattr(rule.condition, "codes", None)
        if codes is None or not rule.name.startswith("GpuXid"):
            continue
        found = re.findall(r'xid=~"([0-9|]+)"', alerts[rule.name]["expr"])
        assert found, rule.name
        # A rule may select some codes by their counter and the NVLink5 ones (judged per
        # report) by their decoded verdict: together they are the node rule's codes.
        seen = {int(c) for regex in found for c in regex.split("|")}
        assert seen == set(codes), rule.name
        judged = getattr(rule.condition, "judged", frozenset())
        if judged:
            assert "xid_nvlink5_decoded" in alerts[rule.name]["expr"], rule.name


# (scenario, snapshot minutes, evaluation minutes): snapshots bracket each node transition
# so that a `for:` starts at most a minute or two after the node's; evaluations sit clear
# of the transitions.
CASES = [
    ("fallen-off-bus", [30, 61, 65, 70], [50, 68]),
    ("thermal-slowdown", [25, 31, 41, 45, 50, 55, 60], [35, 58]),
    ("stuck-workload", [30, 61, 65, 75], [40, 74]),
    ("nvlink-crc-storm", [20, 28, 32, 36, 40, 44, 48, 52, 56, 60], [25, 40, 58]),
]
USED = (
    "gpuwatchd_",
    "process_",
)


@pytest.mark.parametrize(("scenario", "snapshots", "evals"), CASES, ids=[c[0] for c in CASES])
def test_promtool_fires_what_the_node_fires(
    tmp_path: Path, scenario: str, snapshots: list[int], evals: list[int]
) -> None:
    promtool = need_binary("promtool")
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("node_name: sim-node\n")
    snaps, records = simulate_snapshots(
        ROOT / "scenarios" / f"{scenario}.yaml", snapshots, tmp_path, config
    )
    end = max(evals) + 1
    tests: list[dict[str, Any]] = []
    seen_any = False
    for minute in evals:
        firing = sorted(node_firing(records, minute * 60))
        seen_any = seen_any or bool(firing)
        tests.append(
            {
                "expr": 'group by (alertname, gpu) (ALERTS{alertstate="firing"})',
                "eval_time": f"{minute}m",
                "exp_samples": [
                    {
                        "labels": "{"
                        + ",".join([f'alertname="{rule}"'] + ([f'gpu="{gpu}"'] if gpu else []))
                        + "}",
                        "value": 1,
                    }
                    for rule, gpu in firing
                ],
            }
        )
    assert seen_any, f"{scenario}: the node fired nothing at {evals}: a vacuous test"
    groups = [g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]]
    assert groups[0] == "gpuwatchd-recording"
    unit = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "group_eval_order": groups,  # recording rules first, not promtool's random order
        "tests": [
            {
                "name": scenario,
                "interval": "1m",
                "input_series": input_series(snaps, end, USED),
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / f"{scenario}.test.yaml"
    path.write_text(yaml.safe_dump(unit, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, (
        f"Prometheus and the node disagree on {scenario} (test file {path}):\n"
        + (result.stdout + result.stderr)[-6000:]
    )
    assert INSTANCE["job"] == "gpuwatchd"


def test_shipped_unit_tests_of_the_ecc_trend_pass() -> None:
    """packaging/prometheus/gpuwatchd-rules.test.yaml: weeks of ECC history (accelerating,
    one burst, a steady rate), which the simulated scenarios in CI are too short for."""
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "test", "rules", "gpuwatchd-rules.test.yaml"],
        capture_output=True,
        text=True,
        cwd=RULES.parent,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
