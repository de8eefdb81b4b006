#!/usr/bin/env python3
"""What one census of the fleet budget costs slurmctld, by fleet size.

A real slurmctld (tests/slurm_support.py: auth/none, loopback; one real slurmd, the other
nodes carry state only) with N nodes, idle; the daemon's own Slurm census
(``SlurmFleetView.census``: ``full`` reads every node's Comment, the cheap one lists the
drained nodes and counts the names) run ``--rounds`` times each. Prints, per kind, the
slurmctld CPU time and the wall time per census: the price of every read the claim
protocol makes (its choosing phase re-reads a full census while it waits).

    python3 bench/fleet_census_cost.py -n 500 -n 2000 -n 10000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from fleet_storm import cpu_of, use_plugin_dir  # noqa: E402
from slurm_support import start_slurm  # noqa: E402

from gpuwatchd.actions.drain.drivers.slurm import SlurmDriver  # noqa: E402
from gpuwatchd.config.actions import FleetDrainConfig  # noqa: E402


def measure(nodes: int, rounds: int) -> dict[str, float]:
    work = Path(tempfile.mkdtemp(prefix="gpuwatchd-census-cost-"))
    cluster, procs = start_slurm(work, extra=nodes)
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    try:
        view = SlurmDriver(cluster.node, 60.0).fleet_view(FleetDrainConfig(max_percent=5))
        ctld = procs[0].popen.pid
        out: dict[str, float] = {"nodes": nodes + 1}
        for full in (True, False):
            view.census(full)  # warm
            cpu0, wall0 = cpu_of(ctld), time.monotonic()
            for _ in range(rounds):
                view.census(full)
            kind = "full" if full else "cheap"
            out[f"{kind}_ctld_cpu_ms"] = (cpu_of(ctld) - cpu0) * 1000 / rounds
            out[f"{kind}_wall_ms"] = (time.monotonic() - wall0) * 1000 / rounds
        return out
    finally:
        for p in reversed(procs):
            p.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nodes", type=int, action="append")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--plugin-dir", help="Slurm's plugin directory (bench/fleet_storm_remote.sh)")
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    if args.plugin_dir:
        use_plugin_dir(args.plugin_dir)
    results = [measure(n, args.rounds) for n in args.nodes or [500]]
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
