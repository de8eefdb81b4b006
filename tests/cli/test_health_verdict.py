"""Issue 23 item 3: one health verdict everywhere, and one exit-code table.

A GPU's health in ``status``, ``check``, the demo's summary (tests/harness/test_demo.py), the
status API and the metrics comes from ``core.health``: a firing page or ticket on a GPU
shows there as ``failing``/``degraded`` with the rule names, and a GPU that stopped
answering shows no old reading as current. Exit codes: 0 ok, 1 unhealthy, 2 cannot tell,
64 usage, for every command.

Before: ``status`` printed ``GPU 2 ... ok temp=93C`` while GpuTemperatureHigh paged on
GPU 2, a lost GPU's last temperature as current, exited 3 where ``check`` exited 1, and a
usage error exited 2 like "cannot tell"."""

from __future__ import annotations

import contextlib
import io
import subprocess
from pathlib import Path

import pytest
from actions_support import make_config
from conftest import GPUWATCHD, ROOT

from gpuwatchd.cli.check import Report, from_status, judge
from gpuwatchd.cli.main import _print_status
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import parse_scenario

SCENARIO = """
name: hot-and-lost
duration: 20m
step: 10s
gpus: {count: 4, model: NVIDIA H100 80GB HBM3}
timeline:
  - at: 0s
    set: {temperature_gpu: 50, utilization_gpu: 0.9, compute_processes: 1}
  - {at: 1m, gpu: 2, set: {temperature_gpu: 93}}
  - {at: 2m, gpu: 1, set: {temperature_gpu: 77}}
  - {at: 3m, gpu: 1, lose: true}
  - {at: 4m, gpu: 3, ramp: {field: ecc_corrected_volatile, rate: 1, per: 1m}}
"""


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulation:
    config = make_config(tmp_path_factory.mktemp("cfg"), "")
    s = Simulation(parse_scenario(SCENARIO, "hot.yaml"), config)
    s.run()
    return s


def test_the_status_api_carries_the_verdict_and_no_stale_reading(sim: Simulation) -> None:
    gpus = {g["index"]: g for g in sim.node.status()["gpus"]}
    assert (gpus[2]["health"], gpus[2]["health_rules"]) == ("failing", ["GpuTemperatureHigh"])
    assert gpus[2]["readings"]["temperature_gpu"] == 93.0  # current: it answers
    assert (gpus[3]["health"], gpus[3]["health_rules"]) == ("degraded", ["GpuEccCorrectedRising"])
    assert (gpus[0]["health"], gpus[0]["health_rules"]) == ("ok", [])
    lost = gpus[1]
    assert lost["health"] == "lost" and "GpuLost" in lost["health_rules"]
    assert "readings" not in lost, "a lost GPU's last reading is shown as current"
    assert lost["last_readings"]["temperature_gpu"] == 77.0
    assert lost["last_readings_at"] < sim.clock.now() - 15 * 60


def test_metrics_carry_the_same_verdict(sim: Simulation) -> None:
    text = sim.exposition().decode()
    on = {
        (line.split('gpu="')[1].split('"')[0], line.split('health="')[1].split('"')[0])
        for line in text.splitlines()
        if line.startswith("gpuwatchd_gpu_health{") and line.endswith(" 1.0")
    }
    assert on == {("0", "ok"), ("1", "lost"), ("2", "failing"), ("3", "degraded")}
    assert 'gpuwatchd_gpu_temperature_celsius{gpu="1"' not in text


def test_check_and_status_judge_alike(sim: Simulation) -> None:
    status = sim.node.status()
    report = judge(Report("daemon", "x", *_parts(status)))
    assert report.code == 1
    assert "GPU 2 (00000000:3A:00.0) failing (GpuTemperatureHigh)" in report.problems
    assert [g.health for g in report.gpus] == ["ok", "lost", "failing", "degraded"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = _print_status(status, [], False)
    assert code == report.code == 1
    lines = {x.split()[1]: x for x in out.getvalue().splitlines() if x.startswith("  GPU ")}
    assert " failing (GpuTemperatureHigh) " in lines["2"] and "temp=93C" in lines["2"]
    assert " degraded (GpuEccCorrectedRising) " in lines["3"]
    assert "lost (GpuLost" in lines["1"] and "last poll" in lines["1"]
    assert "temp=77C" not in lines["1"].split("(last poll")[0], lines["1"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert _print_status(status, [], True) == 1  # --json: the same verdict
    strict = judge(Report("daemon", "x", *_parts(status)), fail_on="ticket")
    assert "GPU 3 (00000000:5D:00.0) degraded (GpuEccCorrectedRising)" in strict.problems


def _parts(status: dict[str, object]) -> tuple[object, ...]:
    gpus, expected, firing = from_status(status)
    return gpus, expected, firing or []


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )


@pytest.mark.parametrize(
    "args",
    [
        ("check", "--fromat", "json"),
        ("status", "--no-such-option"),
        ("simulate",),
        ("xid", "explain", "not-a-number"),
        ("silence", "add", "--for", "soon", "--reason", "x"),
        ("nonsense",),
    ],
)
def test_usage_errors_exit_64_never_2(args: tuple[str, ...]) -> None:
    res = gw(*args)
    assert res.returncode == 64, (res.returncode, res.stderr)


def test_status_without_a_daemon_cannot_tell(tmp_path: Path) -> None:
    res = gw("status", "--url", "http://127.0.0.1:9", "--timeout", "2")
    assert res.returncode == 2, res.stderr
