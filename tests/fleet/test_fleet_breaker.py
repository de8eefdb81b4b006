"""Issue 28 item 2: the fleet drain breaker and the pause switch, on a real slurmctld.

Twelve drain controllers on their own nodes see XID 79 at the same moment with a budget of
3 and ``drain.fleet.breaker: true``: 3 drain, the breaker trips, one page (from one node)
names the XID and the share of nodes, and no node drains any more, even when places free
up, until an operator runs ``gpuwatchd fleet reset``. ``gpuwatchd fleet pause`` stops the
fleet by hand the same way."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from actions_support import HttpReceiver, transition
from conftest import GPUWATCHD, ROOT, free_port
from fleet_support import alerts, at_once, module_slurm, ours, slurm_controller
from slurm_support import Slurm

from gpuwatchd.actions import ActionsSink
from gpuwatchd.actions.fleet import BREAKER_RULE, BUDGET_RULE
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

NODES = 20
BUDGET = 3
CLOCK = VirtualClock(time.time())


cluster = module_slurm(NODES)


def daemon(tmp_path: Path, node: str, url: str) -> ActionsSink:
    fleet = f"{{max_nodes: {BUDGET}, recheck: 1m, jitter: 0s, breaker: true}}"
    return slurm_controller(tmp_path, node, url, fleet, CLOCK)


def pages(rx: HttpReceiver, rule: str) -> list[dict[str, Any]]:
    return alerts(rx, rule)


def fleet_cli(tmp_path: Path, cluster: Slurm, *args: str) -> str:
    cfg = tmp_path / "operator.yaml"
    cfg.write_text(
        f"node_name: {cluster.others[0]}\nstate_dir: {tmp_path / 'op-state'}\n"
        f"drain: {{mode: slurm, fleet: {{max_nodes: {BUDGET}}}}}\n"
    )
    res = subprocess.run(
        [*GPUWATCHD, "fleet", *args, "-c", str(cfg)],
        env=cluster.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_the_breaker_stops_the_fleet_until_an_operator_resets_it(
    cluster: Slurm, tmp_path: Path
) -> None:
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    rx = HttpReceiver(free_port()).start()
    nodes = cluster.others[:12]
    sinks = {n: daemon(tmp_path, n, rx.url) for n in nodes}
    try:
        for n, sink in sinks.items():
            sink.deliver([transition(at=CLOCK.now(), drain=True, node=n, xid=79)], CLOCK.now())
        at_once(list(sinks.values()))
        drained = ours(cluster)
        assert len(drained) == BUDGET, drained  # the claims ahead of the breaker drain
        (page,) = pages(rx, BREAKER_RULE)  # one page for the fleet, not one per node
        summary = page["annotations"]["summary"]
        assert page["status"] == "firing" and "XID 79 on" in summary, summary
        assert f"of {NODES + 1} nodes" in summary and "gpuwatchd fleet reset" in summary
        assert page["annotations"]["xids"].startswith("XID 79 on ")
        assert pages(rx, BUDGET_RULE) == []  # the held-back nodes do not page each
        status = json.loads(fleet_cli(tmp_path, cluster, "status", "--json"))
        assert [s["what"] for s in status["stops"]] != [] and status["budget"] == BUDGET
        assert "stopped by the breaker" in fleet_cli(tmp_path, cluster, "status")

        # two drained nodes recover: places free up, but the fleet stays stopped
        for n in drained[:2]:
            resolve = transition(state=AlertState.RESOLVED, seq=2, at=CLOCK.now(), node=n, xid=79)
            sinks[n].deliver([resolve], CLOCK.now())
            sinks[n].run_pending()
        left = ours(cluster)
        CLOCK.advance(61)
        at_once(list(sinks.values()))
        assert ours(cluster) == left

        out = fleet_cli(tmp_path, cluster, "reset")
        assert "took the tripped mark off" in out
        assert json.loads(fleet_cli(tmp_path, cluster, "status", "--json"))["stops"] == []
        # the next checks (held back twice: within 2 x recheck) fill the two free places;
        # the storm still goes on (9 nodes want 2 places), so the breaker trips again
        CLOCK.advance(121)
        at_once(list(sinks.values()))
        after = ours(cluster)
        assert len(after) == BUDGET and set(drained[2:]) < set(after), after
        assert json.loads(fleet_cli(tmp_path, cluster, "status", "--json"))["stops"] != []
    finally:
        for sink in sinks.values():
            sink.close()
        rx.stop()
        for n in ours(cluster):
            cluster.admin("State=RESUME", node=n)
        cluster.admin("Comment=", node=f"gw[001-{NODES:03d}]")


def test_pause_holds_every_drain_until_reset(cluster: Slurm, tmp_path: Path) -> None:
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    rx = HttpReceiver(free_port()).start()
    me = cluster.others[15]
    sink = daemon(tmp_path, me, rx.url)
    try:
        assert "paused" in fleet_cli(tmp_path, cluster, "pause")
        sink.deliver([transition(at=CLOCK.now(), drain=True, node=me, xid=79)], CLOCK.now())
        sink.run_pending()
        assert ours(cluster) == []
        drain = sink.status().as_json()["drain"]
        assert drain["state"] == "drain_pending"
        assert "paused by an operator" in drain["incidents"][0]["result"]
        assert "paused by an operator" in fleet_cli(tmp_path, cluster, "status")
        fleet_cli(tmp_path, cluster, "reset")
        CLOCK.advance(61)
        sink.run_pending()
        assert ours(cluster) == [me]
    finally:
        sink.close()
        rx.stop()
        for n in ours(cluster):
            cluster.admin("State=RESUME", node=n)
        cluster.admin("Comment=", node=f"gw[001-{NODES:03d}]")
