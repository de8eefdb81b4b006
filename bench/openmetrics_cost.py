"""OpenMetrics against the text format: what a stock Prometheus scrape costs.

Prometheus asks for OpenMetrics first. This bench prints, side by side:

1. In-process render of the 8 GPU x 18 NVLink link node (healthy-8xh100), p50 of N
   renders, a new snapshot each time (the cache cannot answer) and between two polls
   (cached): the text format, gpuwatchd's OpenMetrics, and the same families through
   prometheus_client's generic OpenMetrics exposition (the path before issue 23).
2. Over HTTP: `gpuwatchd run` (1 s polls) scraped alternately with the text format's
   Accept header and with the header Prometheus 2.42 sends (tests/exposition/test_openmetrics.py
   checks on a real Prometheus that it asks for OpenMetrics first): p50 latency each, and
   the daemon's RSS after the scrapes.

Usage: .venv/bin/python bench/openmetrics_cost.py [--renders 300] [--scrapes 200]
"""

from __future__ import annotations

import argparse
import http.client
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchlib import free_port, rss_mib

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
TEXT_ACCEPT = "text/plain;version=0.0.4"


def p50_ms(fn: Callable[[], Any], n: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def measure_render(n: int) -> None:
    from prometheus_client.openmetrics.exposition import generate_latest
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

    class Generic(Collector):  # the adapter the OpenMetrics path used before
        def collect(self) -> Any:
            fams = renderer.families()
            renderer.process.add(fams)
            return [to_client_metric(f) for f in fams]

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Generic())
    text_u = p50_ms(renderer.render, n, state.touch)
    om_u = p50_ms(renderer.render_openmetrics, n, state.touch)
    generic = p50_ms(lambda: generate_latest(registry), max(10, n // 10))  # type: ignore[no-untyped-call]
    text_c = p50_ms(renderer.render, n)
    om_c = p50_ms(renderer.render_openmetrics, n)
    size = len(renderer.render_openmetrics())
    print(f"in-process render, 8 GPUs x 18 links ({size} bytes of OpenMetrics), p50 of {n}:")
    print(f"  {'':34} {'text 0.0.4':>12} {'OpenMetrics':>12} {'ratio':>7}")
    print(f"  {'new snapshot (uncached)':34} {text_u:10.3f}ms {om_u:10.3f}ms {om_u / text_u:6.2f}x")
    print(
        f"  {'between two polls (cached)':34} {text_c:10.3f}ms {om_c:10.3f}ms {om_c / text_c:6.2f}x"
    )
    print(
        f"  {'prometheus_client generic (before)':34} {'':>12} {generic:10.3f}ms "
        f"{generic / text_u:6.2f}x"
    )


def measure_http(scrapes: int) -> None:
    port = free_port()
    state = tempfile.mkdtemp(prefix="gpuwatchd-bench-")
    config = Path(state) / "gpuwatchd.yaml"
    config.write_text("poll:\n  interval: 1s\n")
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gpuwatchd", "run", "-c", str(config)),
            *("--backend", f"scenario:{SCENARIO}", "--listen", f"127.0.0.1:{port}"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, STATE_DIRECTORY=state),
        cwd=ROOT,
    )

    def scrape(accept: str) -> tuple[float, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        t = time.perf_counter()
        conn.request("GET", "/metrics", headers={"Accept": accept})
        resp = conn.getresponse()
        resp.read()
        elapsed = time.perf_counter() - t
        conn.close()
        return elapsed, resp.headers["Content-Type"]

    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                scrape(TEXT_ACCEPT)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        time.sleep(5)  # warm-up
        rss0 = rss_mib(proc.pid)
        text: list[float] = []
        om: list[float] = []
        kinds: set[str] = set()
        for accept, into in ((TEXT_ACCEPT, text), (PROMETHEUS_ACCEPT, om)):
            for i in range(scrapes):
                elapsed, kind = scrape(accept)
                into.append(elapsed)
                if into is om:
                    kinds.add(kind)
                if i % 10 == 9:
                    time.sleep(0.5)  # let polls make new snapshots between some scrapes
            into.append(rss_mib(proc.pid))  # the RSS after this phase, last
    finally:
        proc.terminate()
        proc.wait(10)
    rss_text, rss_om = text.pop(), om.pop()
    t50, o50 = statistics.median(text) * 1e3, statistics.median(om) * 1e3
    print(f"HTTP /metrics of `gpuwatchd run`, {scrapes} text scrapes, then {scrapes} with")
    print("Prometheus's Accept header:")
    print(f"  {'':22} {'text 0.0.4':>12} {'OpenMetrics':>12} {'ratio':>7}")
    print(f"  {'p50 latency':22} {t50:10.3f}ms {o50:10.3f}ms {o50 / t50:6.2f}x")
    print(f"  {'daemon RSS after':22} {rss_text:8.1f} MiB {rss_om:8.1f} MiB   (before: {rss0:.1f})")
    print(f"  answered as: {', '.join(sorted(kinds))}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--renders", type=int, default=300)
    ap.add_argument("--scrapes", type=int, default=200)
    args = ap.parse_args()
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}"
    )
    measure_render(args.renders)
    measure_http(args.scrapes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
