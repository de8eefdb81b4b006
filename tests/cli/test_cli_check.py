"""`gpuwatchd check` (one-shot health: 0 healthy, 1 unhealthy, 2 cannot tell) and `status`
against a daemon with TLS and basic auth on."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT
from fault_support import Daemon, wait_until
from pki_support import bcrypt_hash, https_get, make_pki

from gpuwatchd.cli.check import Firing, Gpu, Report, from_metrics, from_status, judge

STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"
UNHEALTHY = ROOT / "tests" / "data" / "check-unhealthy.yaml"
PASSWORD = "s3cret-for-the-check"


def gw(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, *args], capture_output=True, text=True, cwd=ROOT, timeout=60, env=env
    )


# -- the verdict -----------------------------------------------------------------------------
def test_zero_gpus_is_not_healthy() -> None:
    report = judge(Report("local", "nvml"))
    assert report.code == 1 and report.problems == ["no GPU found"]


def test_tickets_warn_unless_asked_to_fail() -> None:
    def report() -> Report:
        return Report(
            "daemon", "x", [Gpu("0", "00000000:18:00.0", "ok")], None,
            [Firing("GpuEccCorrectedRising", "ticket", "0"), Firing("GpuXidApplication", "info")],
        )  # fmt: skip

    lenient = judge(report())
    assert lenient.code == 0
    assert lenient.warnings == [
        "GPU 0 (00000000:18:00.0) degraded (GpuEccCorrectedRising)",
        "alert GpuXidApplication (info)",
    ]
    assert [(g.health, g.rules) for g in lenient.gpus] == [("degraded", ("GpuEccCorrectedRising",))]
    strict = judge(report(), fail_on="ticket")
    assert strict.code == 1
    assert strict.problems == ["GPU 0 (00000000:18:00.0) degraded (GpuEccCorrectedRising)"]


def test_daemon_answers_are_read_from_status_or_metrics() -> None:
    status = {
        "gpus": [{"index": 0, "pci_bus_id": "00000000:18:00.0", "status": "lost"}],
        "gpus_expected": 2,
        "alerts": [{"rule": "GpuLost", "severity": "page", "labels": {"gpu": "0"}}],
    }
    gpus, expected, firing = from_status(status)
    assert gpus == [Gpu("0", "00000000:18:00.0", "lost")] and expected == 2
    assert firing == [Firing("GpuLost", "page", "0")]
    assert from_status({"gpus": []})[2] is None  # an older daemon: no alerts in its status
    metrics = (
        "# TYPE gpuwatchd_alerts gauge\n"
        'gpuwatchd_alerts{rule="GpuLost",severity="page",state="firing"} 1.0\n'
        'gpuwatchd_alerts{rule="GpuLost",severity="page",state="pending"} 0.0\n'
        'gpuwatchd_alerts{rule="GpuStale",severity="ticket",state="firing"} 0.0\n'
    )
    assert from_metrics(metrics)[2] == [Firing("GpuLost", "page", None, 1)]


# -- one poll of its own -----------------------------------------------------------------------
def test_local_poll_healthy_node_exits_0() -> None:
    res = gw("check", "--local", "--backend", f"scenario:{STEADY}")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("gpuwatchd check: HEALTHY (one local poll")
    assert "GPUs: 4 (0=ok, 1=ok, 2=ok, 3=ok)" in res.stdout
    assert res.stderr == ""


def test_local_poll_unhealthy_node_exits_1_in_every_format() -> None:
    backend = f"scenario:{UNHEALTHY}"
    nhc = gw("check", "--local", "--backend", backend, "--format", "nhc")
    assert nhc.returncode == 1
    (line,) = nhc.stdout.splitlines()
    assert line.startswith("gpuwatchd: GPU 1 (00000000:2A:00.0) lost (GpuLost); ")
    assert "GPU 2 (00000000:3A:00.0) failing (GpuRecoveryActionRequired)" in line
    data = json.loads(gw("check", "--local", "--backend", backend, "--format", "json").stdout)
    assert data["verdict"] == "unhealthy" and data["exit_code"] == 1 and data["source"] == "local"
    assert {(f["rule"], f["gpu"]) for f in data["firing"]} == {
        ("GpuLost", "1"),
        ("GpuRecoveryActionRequired", "2"),
    }  # GPU 3 at 80 C is fine; GpuTemperatureHigh needs > 85 C for 5 minutes anyway


def test_fewer_gpus_than_expected_is_unhealthy(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("gpus:\n  expected: 8\n")
    res = gw("check", "-c", str(config), "--local", "--backend", f"scenario:{STEADY}")
    assert res.returncode == 1
    assert "problem: 4 GPU(s), expected 8" in res.stdout


def test_no_daemon_listening_means_a_local_poll(tmp_path: Path) -> None:
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        config = tmp_path / "gpuwatchd.yaml"
        config.write_text(f"listen: 127.0.0.1:{port}\n")
        res = gw("check", "-c", str(config), "--backend", f"scenario:{UNHEALTHY}")
        assert res.returncode == 1 and "(one local poll" in res.stdout, res.stdout
        only_daemon = gw("check", "-c", str(config), "--daemon", "--format", "nhc")
    assert only_daemon.returncode == 2
    assert only_daemon.stdout.startswith("gpuwatchd: cannot tell: cannot reach the daemon")


def test_bad_config_cannot_tell(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("poll:\n  interval: soon\n")
    res = gw("check", "-c", str(config), "--local")
    assert res.returncode == 2
    assert f"{config}:2:" in res.stdout


# -- asking a daemon that has TLS and basic auth on ------------------------------------------
@pytest.fixture
def secured_daemon(tmp_path: Path) -> Iterator[tuple[Daemon, Path, Path]]:
    pki = make_pki(tmp_path / "pki")
    (tmp_path / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {pki.server_crt}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  checker: {bcrypt_hash(PASSWORD)}\n"
    )
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    # its status socket where the commands below do not look (a client in another
    # container, say): they ask over HTTP, as web.ask_over_http allows
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    d = Daemon(tmp_path, "", UNHEALTHY, env={"RUNTIME_DIRECTORY": str(run)})
    d.cfg.write_text(
        f"listen: 127.0.0.1:{d.port}\nstate_dir: {tmp_path / 'state'}\n"
        "sources: {kernel_log: none}\nweb:\n  config_file: web.yml\n  ask_over_http: true\n"
    )
    d.url = d.url.replace("http://", "https://")
    d.start(wait=False)

    def up() -> bool:
        assert d.proc is not None and d.proc.poll() is None, d.output()
        try:
            status, _, body = https_get(d.url + "/metrics", pki, ("checker", PASSWORD))
        except OSError:
            return False
        # GpuLost fires on the GPU's event, the recovery action at the next evaluation
        return status == 200 and all(
            f'gpuwatchd_alerts{{rule="{rule}",severity="page",state="firing"}} 1'.encode() in body
            for rule in ("GpuLost", "GpuRecoveryActionRequired")
        )

    try:
        wait_until(up, 30, "TLS daemon with both page alerts firing")
        yield d, d.cfg, password
    finally:
        d.stop()


def test_check_and_status_reach_a_daemon_with_tls_and_basic_auth(
    secured_daemon: tuple[Daemon, Path, Path],
) -> None:
    d, config, password = secured_daemon
    auth = ("--user", "checker", "--password-file", str(password))
    # https and the pinned server certificate come from the config's web.config_file
    res = gw("check", "-c", str(config), *auth, "--format", "json")
    data = json.loads(res.stdout)
    assert res.returncode == 1, res.stdout + res.stderr
    assert data["source"] == "daemon" and data["where"] == d.url
    assert {(f["rule"], f["gpu"]) for f in data["firing"]} >= {
        ("GpuLost", "1"),
        ("GpuRecoveryActionRequired", "2"),
    }
    assert [g["status"] for g in data["gpus"]] == ["ok", "lost", "ok", "ok"]
    # no credentials: the daemon answers 401, and that is "cannot tell", not a local poll
    res = gw("check", "-c", str(config), "--format", "nhc")
    assert res.returncode == 2 and "HTTP 401" in res.stdout, res.stdout
    # the same through the environment, as a prolog would set it
    import os

    env = dict(os.environ, GPUWATCHD_USER="checker", GPUWATCHD_PASSWORD_FILE=str(password))
    assert gw("check", "-c", str(config), env=env).returncode == 1
    # status: the JSON, and --healthz as a probe command
    status = gw("status", "-c", str(config), *auth, "--json")
    assert status.returncode == 1, status.stderr  # the verdict, as check's
    assert json.loads(status.stdout)["gpus"][1]["status"] == "lost"
    table = gw("status", "-c", str(config), *auth)
    assert table.returncode == 1 and "GPU 1" in table.stdout  # a GPU not ok: as check
    probe = gw("status", "-c", str(config), *auth, "--healthz")
    assert probe.returncode == 0 and probe.stdout.startswith("ok"), probe.stdout
    denied = gw("status", "-c", str(config), "--healthz")
    assert denied.returncode == 2 and "401" in denied.stdout  # cannot tell
    wrong_ca = gw("check", "-c", str(config), *auth, "--ca-file", str(password))
    assert wrong_ca.returncode == 2 and "TLS" in wrong_ca.stdout, wrong_ca.stdout
    # where the status socket is found, it comes first: no credentials needed
    env = dict(os.environ, RUNTIME_DIRECTORY=str(config.parent / "run"))
    res = gw("check", "-c", str(config), "--format", "json", env=env)
    assert res.returncode == 1 and json.loads(res.stdout)["where"].endswith("run/status.sock")
