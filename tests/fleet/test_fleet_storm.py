"""Issue 28 item 7: the fleet drain budget with real daemons during the storm.

A real slurmctld (tests/slurm_support.py: auth/none, loopback, state in a temp dir) with
NODES + 1 nodes, and NODES real ``gpuwatchd run`` processes, one per node, each on the
scenario backend (one GPU) and following its own kmsg file. The same XID 79 is written into
every file within one second; each daemon's rule fires and asks for a drain, with a fleet
budget of 10 %. Half a second later slurmctld stops (saving its state) and comes back 3 s
later. The controller is sampled every 100 ms while it answers: never more than the budget
of nodes drained by gpuwatchd at any moment, and, once every daemon has decided, exactly
the budget, each held drained by its own daemon (no stray drain).

CPU: the daemons run with the smallest config that drains (one GPU, polls every 30 s, no
NVML worker process, no receivers, no per-link metrics); they are started in small
batches and stopped (SIGTERM) as soon as the count is final. ``GPUWATCHD_STORM_NODES``
changes the size (bench/fleet_storm.py runs the large ones)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Proc, need_binary
from fault_support import Daemon, KmsgFile
from slurm_support import Slurm, start_slurm

NODES = int(os.environ.get("GPUWATCHD_STORM_NODES", "50"))
PERCENT = 10
BUDGET = max(1, (NODES + 1) * PERCENT // 100)  # the controller knows NODES + 1 nodes
PREFIX = "gpuwatchd:"

RULES = """rules:
- name: StormXid
  description: XID 79 drains the node (the storm test's only rule).
  severity: page
  drain: true
  condition:
    xid:
      codes: [79]
      quiet: 1h
  annotations:
    summary: 'XID {xid} on GPU {gpu} of {node}'
"""

SCENARIO = """name: one-gpu
description: One GPU whose readings never change.
duration: 1d
step: 1m
gpus:
  count: 1
  model: NVIDIA H100 80GB HBM3
timeline:
  - at: 0s
    set: {temperature_gpu: 40, power: 100}
"""


def config(work: Path, node: str, kmsg: Path, rules: Path) -> str:
    return f"""node_name: {node}
state_dir: {work / "state"}
poll: {{interval: 30s, worker: false}}
sources: {{kernel_log: kmsg, kmsg_path: {kmsg}, nvml_events: false}}
rules: {{defaults: false, files: [{rules}]}}
metrics: {{per_link: false}}
web: {{rate_limit: 0}}
drain:
  mode: slurm
  node: {node}
  state_file: null
  fleet: {{max_percent: {PERCENT}, recheck: 1m}}
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Slurm, list[Proc]]]:
    found, procs = start_slurm(tmp_path_factory.mktemp("storm"), extra=NODES)
    try:
        yield found, procs
    finally:
        for p in reversed(procs):
            p.stop()


def restart_slurmctld(cluster: Slurm, procs: list[Proc], down: float) -> None:
    """Stop slurmctld (it saves its state), stay down ``down`` seconds, start it again from
    the saved state (no ``-c``: drains and Comments come back)."""
    work = Path(cluster.env["SLURM_CONF"]).parent
    procs[0].stop()
    time.sleep(down)
    procs[0] = Proc([need_binary("slurmctld"), "-D"], work / "ctld-restarted.out", cluster.env)


def sample(cluster: Slurm) -> int | None:
    """gpuwatchd's drains as the controller has them now (None: it does not answer)."""
    res = subprocess.run(
        ["sinfo", "--noheader", "--list-reasons", "--Node", "--format", "%E"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        return None
    return sum(1 for line in res.stdout.splitlines() if line.startswith(PREFIX))


def drained(cluster: Slurm) -> list[str]:
    return sorted(n for n, r in cluster.reasons().items() if r.startswith(PREFIX))


def test_real_daemons_never_drain_above_the_budget(
    slurm: tuple[Slurm, list[Proc]], tmp_path: Path
) -> None:
    cluster, procs = slurm
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    scenario = tmp_path / "one-gpu.yaml"
    scenario.write_text(SCENARIO)
    daemons: list[Daemon] = []
    kmsgs: list[KmsgFile] = []
    assert len(cluster.others) == NODES
    try:
        for node in cluster.others:
            work = tmp_path / node
            work.mkdir()
            kmsg = KmsgFile(work / "kmsg")
            kmsgs.append(kmsg)
            d = Daemon(
                work,
                config(work, node, kmsg.path, rules),
                scenario,
                env={"SLURM_CONF": cluster.env["SLURM_CONF"]},
                name=node,
                verbose=False,
            )
            daemons.append(d.start(wait=False))
        for d in daemons:  # all up (they start side by side; generous on a loaded machine)
            d.wait_ready(timeout=300.0)
        assert drained(cluster) == []

        start = time.monotonic()
        for kmsg in kmsgs:  # the same XID on every node, all within one second
            kmsg.xid(0, 79)
        wrote = time.monotonic() - start
        assert wrote < 1.0, wrote
        samples: list[int] = []  # gpuwatchd's drains at the controller, every 100 ms

        def decided() -> int:
            """Daemons that drained, or that the budget holds back."""
            n = 0
            for d in daemons:
                drain = d.status().get("drain") or {}
                if drain.get("state") == "drained" or (drain.get("fleet") or {}).get("held_back"):
                    n += 1
            return n

        # slurmctld restarts mid-storm: down for 3 s while the daemons claim and drain
        time.sleep(0.5)
        restart_slurmctld(cluster, procs, 3.0)
        deadline = time.monotonic() + 300.0
        next_look = time.monotonic() + 5.0
        while True:
            count = sample(cluster)
            if count is not None:
                samples.append(count)
            if time.monotonic() >= next_look:
                if decided() == len(daemons):
                    break
                next_look = time.monotonic() + 2.0
            assert time.monotonic() < deadline, (samples[-20:], decided())
            time.sleep(0.1)
        took = time.monotonic() - start
        final = drained(cluster)
        print(
            f"{NODES} daemons, budget {BUDGET}: {len(samples)} samples, most {max(samples)}, "
            f"final {len(final)}, decided in {took:.1f}s"
        )
        assert max(samples) <= BUDGET, samples
        assert len(final) == BUDGET, final
        # no stray drain: every drained node is one whose daemon holds it drained
        holding = [
            node
            for node, d in zip(cluster.others, daemons, strict=True)
            if d.status()["drain"]["state"] == "drained"
        ]
        assert sorted(holding) == final, (holding, final)
    finally:
        for d in daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.proc.terminate()
        for d in daemons:
            d.stop()
