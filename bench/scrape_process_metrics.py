"""What the ``process_*`` metrics add to a /metrics scrape, measured side by side.

Renders the exposition of an 8-GPU x 18-link node in-process, alternating, in one run:
- "before": the node's families only (what a scrape returned before process metrics);
- "after": the same plus the ``process_*`` families (what a scrape returns now);
each both uncached (a new snapshot before every render) and cached (between two polls,
the common case: Prometheus scrapes every 15-60 s, gpuwatchd polls every 5 s).

    .venv/bin/python bench/scrape_process_metrics.py [--renders N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--renders", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    from gpuwatchd.core.clock import VirtualClock
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
    before_body = renderer._node_text()
    after_body = renderer.render()

    def timed(fn: Callable[[], bytes], touch: bool) -> float:
        t = time.perf_counter()
        for _ in range(args.renders):
            if touch:
                state.touch()
            fn()
        return (time.perf_counter() - t) / args.renders * 1e6

    rows: dict[str, list[float]] = {k: [] for k in ("bu", "au", "bc", "ac")}
    for _ in range(args.rounds):  # alternate, so drift on a shared machine hits both alike
        rows["bu"].append(timed(renderer._node_text, True))
        rows["au"].append(timed(renderer.render, True))
        rows["bc"].append(timed(renderer._node_text, False))
        rows["ac"].append(timed(renderer.render, False))
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(
        f"machine: {platform.node()} {platform.machine()} {os.cpu_count()} cpus, "
        f"Python {platform.python_version()}"
    )
    print(
        f"8 GPUs x 18 links; body {len(before_body)} -> {len(after_body)} bytes; "
        f"median of {args.rounds} rounds x {args.renders} renders"
    )
    print(f"{'':<28}{'before':>12}{'after':>12}{'ratio':>8}")
    for label, b, a in (
        ("uncached (new snapshot)", "bu", "au"),
        ("cached (between polls)", "bc", "ac"),
    ):
        print(f"{label:<28}{med[b]:>10.1f}us{med[a]:>10.1f}us{med[a] / med[b]:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
