#!/usr/bin/env python3
"""Kubernetes fleet budget: the Lease race when many nodes want a place at once.

N drain stages (default 1,000), one thread each, each with its own API client and the
daemon's ``KubeFleetView``, call ``reserve`` at the same moment against the Kubernetes API
contract server of tests/fleet/test_fleet_kubernetes.py (real HTTP; one resourceVersion counter;
a write with a stale resourceVersion gets 409, as the API server does), with a budget of
10 % of N + 1 nodes. Every stage is handed the same census read before the storm (nothing
cordoned yet): the bench measures the Lease race, not N node lists.

Prints (and ``--json`` writes): places taken (must be the budget exactly), writes refused
as stale, the most a single stage lost in a row, stages that gave up, and the wall time.
``--fixed`` runs the retry as it was before issue 28's backoff (a wait of 0-20 ms after
every loss, 32 tries) for comparison.

    python3 bench/fleet_lease.py               # 1,000 stages
    python3 bench/fleet_lease.py -n 250 --fixed

Results: docs/fleet.md ("How concurrent daemons keep to it", Kubernetes).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from actions_support import BackloggedServer  # noqa: E402
from test_actions_kubernetes import TOKEN  # noqa: E402
from test_fleet_kubernetes import LEASE, PLACES, Cluster, serving  # noqa: E402

from gpuwatchd.actions.drain.drivers import kubernetes as kube  # noqa: E402
from gpuwatchd.actions.drain.drivers.base import DrainError  # noqa: E402
from gpuwatchd.actions.fleet import limit_for  # noqa: E402
from gpuwatchd.config.actions import FleetDrainConfig  # noqa: E402

REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--stages", type=int, default=1000)
    ap.add_argument("--fixed", action="store_true", help="the retry before the backoff")
    ap.add_argument(
        "--nodes-per-second",
        dest="per_node",
        type=float,
        help="the backoff window's cap grows 1 s per this many nodes (default: the product's)",
    )
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    if args.fixed:
        kube.LEASE_BACKOFF = kube.LEASE_BACKOFF_MAX = 0.02
        kube.LEASE_RETRIES = 32
    elif args.per_node is not None:
        kube.LEASE_BACKOFF_NODES = args.per_node
    # the contract server's listen backlog for every stage at once (the API server's is
    # not a limit here: refused connections would measure this test server, not the Lease)
    BackloggedServer.request_queue_size = max(128, 2 * args.stages)
    per_second = kube.LEASE_BACKOFF_NODES
    names = [f"gpu-{i:04d}" for i in range(args.stages + 1)]
    cluster = Cluster(names)
    fleet = FleetDrainConfig(max_percent=10, selector="nvidia.com/gpu.present=true")
    with serving(cluster) as port:
        views = [
            kube.KubeFleetView(
                kube.KubeClient(f"http://127.0.0.1:{port}", token=TOKEN),
                kube.KubernetesDrainConfig(),
                fleet,
                time.time,
            )
            for _ in names[:-1]
        ]
        census = views[0].census()
        limit = limit_for(fleet, census.nodes)
        start = threading.Barrier(len(views) + 1)
        streaks: list[int] = [0] * len(views)
        taken: list[bool] = [False] * len(views)
        gave_up: list[str] = []

        def stage(i: int) -> None:
            start.wait()
            try:
                taken[i] = views[i].reserve(names[i], limit, census, REASON)[0]
            except DrainError as exc:
                gave_up.append(str(exc))
            streaks[i] = views[i].lost

        threads = [threading.Thread(target=stage, args=(i,)) for i in range(len(views))]
        for t in threads:
            t.start()
        start.wait()
        began = time.monotonic()
        for t in threads:
            t.join()
        took = time.monotonic() - began
        places = json.loads(cluster.leases[LEASE]["metadata"]["annotations"][PLACES])
    result = {
        "stages": len(views),
        "retry": "fixed 0-20 ms, 32 tries" if args.fixed else "backoff (doubling window)",
        "window_cap_s": 0.02 if args.fixed else min(30.0, max(1.0, census.nodes / per_second)),
        "budget": limit,
        "places_taken": sum(taken),
        "places_in_lease": len(places),
        "stale_writes": cluster.lease_conflicts,
        "most_lost_in_a_row": max(streaks),
        "stages_that_gave_up": len(gave_up),
        "gave_up_on_stale_writes": sum("kept changing" in e for e in gave_up),
        "wall_s": round(took, 2),
        "first_errors": sorted({e[:160] for e in gave_up})[:3],
    }
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
