"""What `gpuwatchd run` costs on the 8-GPU healthy scenario, and what a scrape costs.

1. Starts `gpuwatchd run --backend scenario:scenarios/healthy-8xh100.yaml` with a 1 s poll
   interval as a child process, lets it warm up, then reads its CPU time (utime+stime from
   /proc/PID/stat) and RSS over a measurement window, scraping /metrics every 15 s as
   Prometheus would. Goal: < 0.5 % of one core and RSS < 40 MB.
2. Times the /metrics render for 8 GPUs x 18 NVLink links in-process, uncached (a new view
   version each time) and cached, side by side with prometheus_client's generic
   exposition of the same families. Goal: <= 2 ms uncached.

Usage: .venv/bin/python bench/daemon_cost.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib import cpu_seconds, free_port, rss_mib

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"


def measure_daemon(seconds: float) -> None:
    port = free_port()
    state = tempfile.mkdtemp(prefix="gpuwatchd-bench-")
    config = Path(state) / "gpuwatchd.yaml"
    config.write_text("poll:\n  interval: 1s\n")
    env = dict(os.environ, STATE_DIRECTORY=state)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatchd",
            "run",
            "-c",
            str(config),
            "--backend",
            f"scenario:{SCENARIO}",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(10)  # warm-up: imports done, rules loaded, first evaluations
        cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
        scrapes = 0
        while time.monotonic() - t0 < seconds:
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
            scrapes += 1
            time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - t0))))
        cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
        rss = rss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait(10)
    share = (cpu1 - cpu0) / (t1 - t0) * 100
    print(f"daemon, 8 GPUs x 18 links, 1 s polls, {t1 - t0:.0f} s window, {scrapes} scrapes:")
    print(f"  CPU {share:.3f} % of one core (goal < 0.5 %)   RSS {rss:.1f} MiB (goal < 40 MB)")


def measure_render(n: int) -> None:
    from prometheus_client.exposition import generate_latest
    from prometheus_client.registry import Collector, CollectorRegistry

    from gpuwatchd.core.clock import VirtualClock
    from gpuwatchd.core.families import to_client_metric
    from gpuwatchd.core.nodestate import NodeState
    from gpuwatchd.exposition.metrics import MetricsRenderer
    from gpuwatchd.scenario.backend import ScenarioBackend
    from gpuwatchd.scenario.model import load_scenario
    from gpuwatchd.sources.gpu.poller import Poller

    clock = VirtualClock()
    backend = ScenarioBackend(load_scenario(str(SCENARIO)), clock, real_stalls=False)
    infos = backend.open()
    state = NodeState("bench", clock.now())
    state.set_gpus(infos, clock.now())
    Poller(backend, infos, state, clock, 1.0, 1.0).poll_once_sync()
    renderer = MetricsRenderer(state.view)
    body = renderer.render()
    samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))

    t = time.perf_counter()
    for _ in range(n):
        state.touch()  # a new view version: the cache cannot answer
        renderer.render()
    uncached = (time.perf_counter() - t) / n * 1e3
    t = time.perf_counter()
    for _ in range(n):
        renderer.render()
    cached = (time.perf_counter() - t) / n * 1e3

    class Generic(Collector):
        def collect(self) -> Any:
            return [to_client_metric(f) for f in renderer.families()]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Generic())
    t = time.perf_counter()
    for _ in range(max(1, n // 10)):
        generate_latest(registry)
    generic = (time.perf_counter() - t) / max(1, n // 10) * 1e3
    print(f"/metrics render, 8 GPUs x 18 links, {samples} samples, {len(body)} bytes:")
    print(
        f"  gpuwatchd renderer, uncached {uncached:.3f} ms (goal <= 2 ms); cached "
        f"{cached * 1000:.1f} us"
    )
    print(
        f"  same families through prometheus_client generate_latest: {generic:.3f} ms "
        f"({generic / uncached:.1f}x the gpuwatchd renderer)"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--renders", type=int, default=300)
    args = ap.parse_args()
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}"
    )
    measure_render(args.renders)
    measure_daemon(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
