"""The issue's NVML stall at full length: one GPU's NVML calls hang for 60 s in the real
daemon (scenario backend, 8 GPUs, wall time), with a real sd_notify socket and
WATCHDOG_USEC. tests/faults/test_fault_gpu.py plays the same with a 6 s stall in CI.

Measures: when the GPU was marked stale (from the stall's start), /metrics latency during
the stall (p50, p99, max over a scrape every 50 ms), the longest gap between fresh samples
of the other seven GPUs, the longest gap between WATCHDOG=1 pings, whether the status ever
said STALLED, and when the GPU was fresh again.

Usage: .venv/bin/python bench/nvml_stall.py [--stall 60] [--interval 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """name: bench-nvml-stall
description: GPU 6's NVML calls hang for {stall} s, {start} s in.
duration: 1h
gpus: {{count: 8, model: NVIDIA H100 80GB HBM3}}
timeline:
  - at: 0s
    set: {{utilization_gpu: 0.97, power: 640W, temperature_gpu: 62}}
  - at: {start}s
    gpu: 6
    stall: {stall}s
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return bytes(resp.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stall", type=float, default=60.0, help="seconds GPU 6 hangs")
    ap.add_argument("--interval", type=float, default=1.0, help="poll interval (s)")
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()
    start_at = 5.0
    work = Path(tempfile.mkdtemp(prefix="nvml-stall-"))
    scenario = work / "scenario.yaml"
    scenario.write_text(SCENARIO.format(stall=int(args.stall), start=int(start_at)))
    cfg = work / "gpuwatchd.yaml"
    cfg.write_text(
        f"state_dir: {work / 'state'}\npoll: {{interval: {args.interval}s, call_timeout: "
        f"{args.interval * 0.8:.2f}s}}\nsources: {{kernel_log: none}}\nweb: {{rate_limit: 0}}\n"
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(work / "notify"))
    notify.settimeout(0.2)
    messages: list[tuple[float, list[str]]] = []
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            try:
                data = notify.recv(65536)
            except TimeoutError:
                continue
            messages.append((time.monotonic(), data.decode().split("\n")))

    threading.Thread(target=listen, daemon=True).start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, NOTIFY_SOCKET=str(work / "notify"), WATCHDOG_USEC="2000000")
    log = (work / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatchd", "run", "-c", str(cfg), "--listen", f"127.0.0.1:{port}",
         "--backend", f"scenario:{scenario}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
    )  # fmt: skip
    latencies: list[float] = []
    samples: dict[int, list[tuple[float, float]]] = {g: [] for g in range(8)}
    stale_since = fresh_since = None
    try:
        while not any("READY=1" in m for _, m in messages):
            if proc.poll() is not None:
                raise SystemExit("the daemon exited")
            time.sleep(0.05)
        status: dict[str, Any] = json.loads(get(url + "/api/v1/status"))
        stall_wall = status["started_at"] + start_at
        end = time.time() + start_at + args.stall + 5 * args.interval
        while time.time() < end:
            t0 = time.perf_counter()
            text = get(url + "/metrics").decode()
            latencies.append(time.perf_counter() - t0)
            now = time.time()
            for line in text.splitlines():
                if line.startswith("gpuwatchd_gpu_last_sample_timestamp_seconds{"):
                    gpu = int(line.split('gpu="', 1)[1].split('"', 1)[0])
                    samples[gpu].append((now, float(line.rsplit(" ", 1)[1])))
            g6 = json.loads(get(url + "/api/v1/status"))["gpus"][6]
            if g6["status"] == "stale" and stale_since is None:
                stale_since = g6["status_since"]
            if stale_since is not None and g6["status"] == "ok" and fresh_since is None:
                fresh_since = g6["status_since"]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        stop.set()
        log.close()

    def worst_gap(points: list[tuple[float, float]]) -> float:
        points = [p for p in points if p[0] >= stall_wall - 1]
        changes = [w for (w, v), (_, p) in itertools.pairwise(points) if v != p]
        changes = [points[0][0], *changes, points[-1][0]]
        return max(b - a for a, b in itertools.pairwise(changes))

    pings = [t for t, m in messages if "WATCHDOG=1" in m]
    ordered = sorted(latencies)
    out = {
        "machine": f"{platform.node()} ({os.cpu_count()} CPUs), Python {platform.python_version()}",
        "poll_interval_s": args.interval,
        "stall_s": args.stall,
        "stale_after_s": None if stale_since is None else round(stale_since - stall_wall, 2),
        "fresh_after_stall_end_s": None
        if fresh_since is None
        else round(fresh_since - stall_wall - args.stall, 2),
        "scrapes": len(latencies),
        "scrape_p50_ms": round(ordered[len(ordered) // 2] * 1000, 1),
        "scrape_p99_ms": round(ordered[int(len(ordered) * 0.99)] * 1000, 1),
        "scrape_max_ms": round(ordered[-1] * 1000, 1),
        "other_gpus_worst_gap_s": round(max(worst_gap(samples[g]) for g in range(8) if g != 6), 2),
        "watchdog_pings": len(pings),
        "watchdog_max_gap_s": round(max(b - a for a, b in itertools.pairwise(pings)), 2),
        "status_stalled": any(a.startswith("STATUS=STALLED") for _, m in messages for a in m),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
