"""The daemon's HTTP endpoints and the command line, as a user meets them."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT, Proc

STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"


_STATE = tempfile.mkdtemp(prefix="gpuwatchd-test-state-")


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it, with its state kept out of the real /var/lib."""
    env = dict(os.environ, STATE_DIRECTORY=_STATE)
    return subprocess.run(
        [*GPUWATCHD, *args],
        env=env,
        capture_output=True,
        text=True,
        input=stdin,
        cwd=ROOT,
        check=False,
        timeout=120,
    )


def test_endpoints(daemon_factory: Callable[..., tuple[Proc, str]]) -> None:
    _, url = daemon_factory("--backend", f"scenario:{STEADY}")
    with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
        assert resp.status == 200
        assert resp.read().decode().startswith("ok")
    with urllib.request.urlopen(url + "/api/v1/status", timeout=5) as resp:
        status = json.load(resp)
    assert [g["index"] for g in status["gpus"]] == [0, 1, 2, 3]
    assert status["gpus"][2]["readings"]["temperature_gpu"] == 71.0
    assert status["gpus"][2]["clock_event_reasons"] == ["sw_power_cap"]
    assert status["sources"]["nvml"]["up"] is True
    req = urllib.request.Request(
        url + "/metrics", headers={"Accept": "application/openmetrics-text"}
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        body = resp.read().decode()
    assert body.rstrip().endswith("# EOF")
    assert "gpuwatchd_gpu_temperature_celsius{" in body
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(url + "/nope", timeout=5)
    assert err.value.code == 404
    err.value.close()
    # `gpuwatchd status` reads the same API
    result = cli("status", "--url", url)
    assert result.returncode == 0, result.stderr
    assert "GPU 2 00000000:" in result.stdout and "reasons=sw_power_cap" in result.stdout


def test_version_and_help() -> None:
    result = cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("gpuwatchd ")
    result = cli("--help")
    for command in ("run", "simulate", "demo", "check-config", "status", "xid"):
        assert command in result.stdout


def test_check_config_reports_location_and_exit_code(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("poll:\n  interval: 5 mins\n")
    result = cli("check-config", "-c", str(bad))
    assert result.returncode == 1
    assert result.stderr.startswith(f"{bad}:2:13: ")
    assert "5 mins" in result.stderr
    good = tmp_path / "good.yaml"
    good.write_text("poll:\n  interval: 10s\n")
    result = cli("check-config", "-c", str(good))
    assert result.returncode == 0, result.stderr


def test_run_refuses_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("listen: nowhere\n")
    result = cli("run", "-c", str(bad), "--backend", f"scenario:{STEADY}")
    assert result.returncode == 1
    assert result.stderr.startswith(f"{bad}:1:9: ")


def test_run_with_a_missing_scenario_names_the_file() -> None:
    result = cli("run", "--backend", "scenario:/nonexistent.yaml")
    assert result.returncode == 1
    assert "/nonexistent.yaml" in result.stderr


def test_simulate_is_deterministic() -> None:
    first = cli("simulate", str(ROOT / "scenarios" / "fallen-off-bus.yaml"))
    second = cli("simulate", str(ROOT / "scenarios" / "fallen-off-bus.yaml"))
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    records = [json.loads(line) for line in first.stdout.splitlines()]
    assert any(r["record"] == "device" and r["event"] == "gpu_lost" for r in records)


def test_demo_runs_the_story_quickly() -> None:
    result = subprocess.run(
        [*GPUWATCHD, "demo", "--seconds", "4", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Metrics: http://127.0.0.1:" in out
    assert "fell off the bus" in out
    assert "XID 79" in out
    assert "ALERT [page]   GpuLost" in out  # the rule engine decided
    assert "-> DRAIN node demo-node (dry run)" in out  # the drain hook was asked, dry run
    assert "-> notified oncall (webhook)" in out  # the page went to the (recorded) receiver
    assert "Summary" in out
