#!/usr/bin/env python3
"""Fleet drain budget: what the budget check costs a drain decision on a real slurmctld.

Starts two real Slurm controllers side by side (auth/none, temp dirs, free loopback
ports; one real slurmd each, the other nodes carry state only): one with 50 nodes and one
with 500, a tenth of them drained by gpuwatchd. Then, interleaved so that both see the
same machine load, it times:

- ``read``:   the node read every Slurm drain already does (``sinfo -n NODE``), the baseline;
- ``cheap``:  the first census of a decision (``sinfo --list-reasons`` plus a node count),
              which is all a node does while the budget is full;
- ``full``:   a census with every node's claim (``sinfo`` of every node);
- ``check``:  ``FleetBudget.check()`` with room in the budget: the whole claim protocol (a
              cheap census, the choosing claim, a full census, the ticket, a full census),
              then the claim taken off again - at 50 and at 500 nodes.

    python3 bench/fleet_budget.py              # 200 rounds
    python3 bench/fleet_budget.py -n 500 --json out.json

Results: docs/fleet.md and docs/PERFORMANCE.md ("Fleet drain budget").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from slurm_support import start_slurm  # noqa: E402

from gpuwatchd.actions.drain.drivers.slurm import SlurmDriver, SlurmFleetView  # noqa: E402
from gpuwatchd.actions.fleet import FleetBudget  # noqa: E402
from gpuwatchd.config.actions import FleetDrainConfig  # noqa: E402


def timed(fn: Callable[[], object], env: dict[str, str]) -> float:
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def stats(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "median_ms": statistics.median(xs) * 1000,
        "p95_ms": xs[int(0.95 * (len(xs) - 1))] * 1000,
        "max_ms": xs[-1] * 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--rounds", type=int, default=200)
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpuwatchd-fleet-bench-"))
    clusters = {}
    procs = []
    try:
        for size in (50, 500):
            (work / str(size)).mkdir()
            cluster, started = start_slurm(work / str(size), extra=size - 1)
            procs += started
            drained = cluster.others[: size // 10]
            subprocess.run(
                [
                    "scontrol",
                    "update",
                    f"NodeName={','.join(drained)}",
                    "State=DRAIN",
                    "Reason=gpuwatchd: XID 79 GPU 3 00000000:3E:00.0",
                ],
                env=cluster.env,
                check=True,
                capture_output=True,
            )
            clusters[size] = cluster
        cfg = FleetDrainConfig(max_percent=20)
        probes: dict[str, tuple[Callable[[], object], dict[str, str]]] = {}
        for size, cluster in clusters.items():
            node = cluster.others[-1]
            view = SlurmDriver(node, 30.0).fleet_view(cfg)
            budget = FleetBudget(cfg, view, node)

            def check(budget: FleetBudget = budget, view: SlurmFleetView = view) -> None:
                assert budget.check().allowed
                view.write_claim(budget.node, None)

            probes[f"check_{size}"] = (check, cluster.env)
            probes[f"cheap_{size}"] = (lambda view=view: view.census(full=False), cluster.env)
            probes[f"full_{size}"] = (lambda view=view: view.census(full=True), cluster.env)
            if size == 50:
                probes["read"] = (SlurmDriver(node, 30.0).read, cluster.env)
            timed(check, cluster.env)  # the census sees what was set up
            assert budget.last is not None and budget.last.nodes == size, budget.last
            assert budget.last.count == size // 10, budget.last
        times: dict[str, list[float]] = {k: [] for k in probes}
        for _ in range(args.rounds):
            for name, (fn, env) in probes.items():
                times[name].append(timed(fn, env))
        out = {k: stats(v) for k, v in times.items()}
        base = out["read"]["median_ms"]
        print(f"{platform.node()}: {os.cpu_count()} CPUs, {args.rounds} rounds, interleaved")
        print(f"{'':10} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'x read':>7}")
        for name, s in out.items():
            ratio = s["median_ms"] / base
            print(
                f"{name:10} {s['median_ms']:10.1f} {s['p95_ms']:8.1f} {s['max_ms']:8.1f} "
                f"{ratio:7.2f}"
            )
        ratio = out["check_500"]["median_ms"] / out["check_50"]["median_ms"]
        print(f"check at 500 nodes / at 50 nodes: {ratio:.2f}")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    finally:
        for p in reversed(procs):
            p.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
