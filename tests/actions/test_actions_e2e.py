"""End to end with the rule engine: a GPU falls off the bus in the real daemon (scenario
backend), the page reaches a webhook, the node is drained once, and status, metrics and the
silence CLI show it; ``simulate`` records deliveries and drains instead of doing them."""

from __future__ import annotations

import json
import stat
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from actions_support import HttpReceiver
from conftest import GPUWATCHD, ROOT, free_port

SCENARIO = """\
name: e2e-xid79
description: GPU 1 falls off the bus two seconds in.
duration: 1h
step: 1s
gpus:
  count: 2
  model: NVIDIA H200
timeline:
  - at: 0s
    set: {temperature_gpu: 40, power: 300, utilization_gpu: 0.5}
  - at: 2s
    gpu: 1
    nvml_xid: 79
    lose: true
"""

HOOK = """#!/bin/sh
env | grep '^GPUWATCHD_' | sort >> {log}
echo --- >> {log}
"""


def setup(tmp_path: Path, url: str) -> tuple[Path, Path, Path]:
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(SCENARIO)
    log = tmp_path / "hook.log"
    hook = tmp_path / "drain-hook"
    hook.write_text(HOOK.format(log=log))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(
        f"""node_name: e2e-node
state_dir: {tmp_path / "state"}
poll: {{interval: 1s, call_timeout: 500ms}}
sources: {{kernel_log: none}}
receivers:
  - {{name: ops, type: webhook, url: "{url}/hook"}}
routing:
  group_wait: 1s
drain:
  mode: exec
  exec: {{command: ["{hook}"]}}
  state_file: {tmp_path / "health.json"}
"""
    )
    return cfg, scenario, log


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)


def wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_daemon_pages_drains_once_and_shows_it(tmp_path: Path, daemon_factory: Any) -> None:
    rx = HttpReceiver(free_port()).start()
    try:
        cfg, scenario, log = setup(tmp_path, rx.url)
        proc, base = daemon_factory("-c", str(cfg), "--backend", f"scenario:{scenario}")

        def firing() -> set[str]:
            return {
                a["labels"]["alertname"]
                for r in rx.requests
                for a in r.json()["alerts"]
                if a["status"] == "firing"
            }

        wait(lambda: {"GpuXidFatal", "GpuLost"} <= firing(), 20, f"no page: {proc.output()}")
        page = next(r.json() for r in rx.requests if "GpuXidFatal" in str(r.json()))
        assert page["version"] == "4" and page["groupLabels"] == {"node": "e2e-node"}
        xid = next(a for a in page["alerts"] if a["labels"]["alertname"] == "GpuXidFatal")
        assert xid["labels"]["gpu"] == "1" and xid["labels"]["severity"] == "critical"
        assert "XID 79" in xid["annotations"]["summary"]
        wait(lambda: log.exists() and "GPUWATCHD_ACTION=drain" in log.read_text(), 10, "no drain")
        time.sleep(1.5)  # the second drain alert (GPU lost) must not run the hook again
        calls = [c for c in log.read_text().split("---\n") if c.strip()]
        assert len(calls) == 1, calls
        assert "GPUWATCHD_NODE=e2e-node" in calls[0] and "GPUWATCHD_GPU=1" in calls[0]
        health = json.loads((tmp_path / "health.json").read_text())
        assert health["state"] == "drained"

        status = get_json(base + "/api/v1/status")
        assert status["drain"]["state"] == "drained" and status["drain"]["mode"] == "exec"
        assert {i["rule"] for i in status["drain"]["incidents"]} == {"GpuXidFatal", "GpuLost"}
        assert status["deliveries"]["receivers"][0]["name"] == "ops"
        assert status["silences"] == []

        out = subprocess.run(
            [
                *GPUWATCHD,
                "silence",
                "add",
                "-c",
                str(cfg),
                "--gpu",
                "0",
                "--for",
                "2h",
                "--reason",
                "swap heatsink",
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=True,
        ).stdout
        silence_id = out.split()[0]
        wait(
            lambda: (
                [s["id"] for s in get_json(base + "/api/v1/status")["silences"]] == [silence_id]
            ),
            10,
            "the daemon did not pick up the silence",
        )
        text = subprocess.run(
            [*GPUWATCHD, "status", "--url", base], capture_output=True, text=True, cwd=ROOT
        ).stdout
        assert "drain (exec): drained - gpuwatchd: XID 79 GPU 1" in text
        assert f"{silence_id} GPU 0 until" in text and "swap heatsink" in text
        assert "firing GpuXidFatal [page] gpu=1" in text
        with urllib.request.urlopen(base + "/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        assert 'gpuwatchd_notifications_sent_total{receiver="ops"}' in metrics
        assert "gpuwatchd_drain_actions_total" in metrics
        assert proc.stop() == 0
    finally:
        rx.stop()


def test_simulate_records_and_does_not_send(tmp_path: Path) -> None:
    rx = HttpReceiver(free_port()).start()
    try:
        cfg = tmp_path / "gpuwatchd.yaml"
        cfg.write_text(
            f"""node_name: sim-node
state_dir: {tmp_path / "state"}
receivers:
  - {{name: ops, type: webhook, url: "{rx.url}/hook"}}
  - {{name: pd, type: pagerduty, routing_key_file: not-available-in-simulate}}
drain:
  mode: slurm
  grace: 30s
"""
        )

        def run(*extra: str) -> list[dict[str, Any]]:
            out = subprocess.run(
                [*GPUWATCHD, "simulate", "demo", "-c", str(cfg), *extra],
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=True,
            ).stdout
            return [json.loads(line) for line in out.splitlines()]

        first = run()
        assert first == run()  # deterministic
        notes = [r for r in first if r["record"] == "notification"]
        drains = [r for r in first if r["record"] == "drain"]
        assert {n["receiver"] for n in notes} == {"ops", "pd"}
        assert any(
            a["rule"] == "GpuXidFatal" and a["state"] == "firing"
            for n in notes
            for a in n["alerts"]
        )
        assert drains and drains[0]["mode"] == "slurm" and drains[0]["result"] == "dry_run"
        assert drains[0]["reason"].startswith("gpuwatchd: ")
        # the demo's first drain is the memory rate's (a ticket that drains, issue 25), then
        # the certified page's and GPU 5's XID 48 (the dry run counts the node as drained)
        assert "GpuMemoryErrorsAccelerating" in drains[0]["reason"]
        accelerating = next(
            r
            for r in first
            if r["record"] == "alert"
            and r["rule"] == "GpuMemoryErrorsAccelerating"
            and r["state"] == "firing"
        )
        assert accelerating["severity"] == "ticket"
        assert drains[0]["time"] > accelerating["time"]  # after the 30s grace
        assert rx.requests == []  # recorded, not sent
        assert not (tmp_path / "state").exists()  # and nothing written
    finally:
        rx.stop()
