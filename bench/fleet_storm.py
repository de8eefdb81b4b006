#!/usr/bin/env python3
"""Fleet drain budget during a storm, at sizes too large for one real daemon per node.

A real slurmctld (tests/slurm_support.py: auth/none, loopback, temp dir; one real slurmd,
the other nodes carry state only) with N nodes, and N in-process drain stages, one per
node: each runs the daemon's own Slurm drain driver with the fleet budget's claim protocol
(``SlurmDriver.drain`` with the ``FleetBudget`` gate, real ``sinfo``/``scontrol`` processes),
all seeing the same XID within ``--spread`` seconds (default 1). A stage held back asks
again after a jittered ``--recheck``. The controller is sampled every 100 ms.

Prints (and ``--json`` writes): peak gpuwatchd drains at any sample, the final count, the
time until every stage had decided and until the count last changed, slurmctld's RPC rate
and mean RPC time over the storm (``sdiag`` before and after, also per message type), how
many cheap and full censuses, choosing re-reads and claim writes the stages made, and how
many Slurm calls failed.

    python3 bench/fleet_storm.py -n 100
    python3 bench/fleet_storm.py -n 500 --percent 5 --json out.json
    python3 bench/fleet_storm.py -n 2000 --percent 5      # needs a bigger machine

It also prints where the machine's CPU went (slurmctld, the Slurm client processes) and
how many stages had an answer, so a run that only measured its own machine shows it. Every
stage starts real processes, as many at once as a real fleet would (no cap): on the 2-vCPU
development VM 500 stages took 31 s, and 2,000 had not drained one node after 244 s
(256 CPU-seconds of sinfo/scontrol against 9.9 for slurmctld). Size the machine first.
The real-daemon version at 50 nodes is tests/fleet/test_fleet_storm.py. Results: docs/fleet.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import queue
import random
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import slurm_support  # noqa: E402
from slurm_support import Slurm, start_slurm  # noqa: E402

from gpuwatchd.actions.drain.drivers.base import DrainError  # noqa: E402
from gpuwatchd.actions.drain.drivers.slurm import SlurmDriver  # noqa: E402
from gpuwatchd.actions.fleet import (  # noqa: E402
    CHOOSING_POLL,
    Census,
    Claim,
    FleetBudget,
    live_claims,
)
from gpuwatchd.config.actions import FleetDrainConfig  # noqa: E402

REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"


def sdiag(cluster: Slurm) -> dict[str, tuple[int, float]]:
    """Per RPC message type: (served, total microseconds), from slurmctld's statistics."""
    out = cluster.run("sdiag")
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    found = re.finditer(
        r"(\w+)\s*\(\s*\d+\)\s*count:\s*(\d+)\s+ave_time:\s*\d+\s+total_time:\s*(\d+)", section
    )
    return {m.group(1): (int(m.group(2)), float(m.group(3))) for m in found}


def rpc_delta(
    before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]]
) -> dict[str, tuple[int, float]]:
    """RPCs served between two ``sdiag`` reads, per type: (count, total milliseconds)."""
    out = {}
    for kind, (count, micros) in after.items():
        c0, m0 = before.get(kind, (0, 0.0))
        if count > c0:
            out[kind] = (count - c0, (micros - m0) / 1000.0)
    return dict(sorted(out.items(), key=lambda kv: -kv[1][1]))


REGISTRATION = "MESSAGE_NODE_REGISTRATION_STATUS"


def wait_for_registrations(cluster: Slurm, nodes: int, limit: float = 30.0) -> float | None:
    """Wait until slurmctld has had a registration for every node (seconds waited; None:
    not within ``limit``). The harness's one slurmd answers slurmctld's registration
    requests for every node it set up; at 1,000-2,000 nodes they came during the storm
    (1,000 of them at 70 ms to 2.1 s each on this VM, 2,000 at 800 ms on the 16-core host),
    holding the node write lock that claim writes need, which a real fleet's storm (each
    slurmd registered long before) does not have. The storm starts anyway after ``limit``."""
    began = time.monotonic()
    while time.monotonic() - began < limit:
        if sdiag(cluster).get(REGISTRATION, (0, 0.0))[0] >= nodes:
            return time.monotonic() - began
        time.sleep(0.5)
    return None


def use_plugin_dir(path: str) -> None:
    """Slurm's plugins are in ``path`` (a Slurm unpacked into a private prefix)."""
    slurm_support.SLURM_CONF = f"PluginDir={path}\n" + slurm_support.SLURM_CONF


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) of a running process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    """CPU seconds of every finished child (the stages' sinfo/scontrol processes)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _kind(what: str) -> str:
    """A step without its numbers: "census_full back", "write ticket done", "refused"."""
    what = what.split(":")[0]
    return " ".join(w for w in what.split() if not w.isdigit())


def trace_summary(traces: dict[str, list[tuple[float, str]]]) -> dict[str, object]:
    """Where the stages were when the storm ended (each one's last step, counted), and when
    each kind of step was first reached by the stages that reached it (seconds from the
    storm's start: median and 90th percentile), so a run that decides nothing shows where."""
    last = Counter(_kind(steps[-1][1]) if steps else "not started" for steps in traces.values())
    first: dict[str, list[float]] = {}
    for steps in traces.values():
        seen: set[str] = set()
        for t, what in steps:
            kind = _kind(what)
            if kind not in seen:
                seen.add(kind)
                first.setdefault(kind, []).append(t)
    reached = {
        kind: {
            "stages": len(ts),
            "median_s": sorted(ts)[len(ts) // 2],
            "p90_s": sorted(ts)[int(len(ts) * 0.9)],
        }
        for kind, ts in sorted(first.items(), key=lambda kv: sorted(kv[1])[len(kv[1]) // 2])
    }
    return {"stages_last_step": dict(last.most_common()), "steps_first_reached": reached}


TRACE_HEAD, TRACE_TAIL = 60, 40  # steps kept per stage in the trace file


def write_trace(path: Path, traces: dict[str, list[tuple[float, str]]]) -> None:
    """One JSON line per stage: its first TRACE_HEAD and last TRACE_TAIL steps (a stage
    that waits re-reads every 0.25 s; "omitted" counts the steps between), gzipped when
    the name ends in .gz (2,000 stages: a few MB)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as f:
        for node, steps in sorted(traces.items()):
            line: dict[str, object] = {"node": node, "steps": steps[:TRACE_HEAD]}
            if len(steps) > TRACE_HEAD + TRACE_TAIL:
                line["omitted"] = len(steps) - TRACE_HEAD - TRACE_TAIL
                line["last_steps"] = steps[-TRACE_TAIL:]
            elif len(steps) > TRACE_HEAD:
                line["last_steps"] = steps[TRACE_HEAD:]
            f.write(json.dumps(line) + "\n")


def run_stages(
    nodes: list[str],
    cfg: FleetDrainConfig,
    spread: float,
    recheck: float,
    began: Any,
    start: Any,
    stop: Any,
    q: Any,
) -> None:
    """One worker process: a thread per node in ``nodes``, each a drain stage, released by
    ``start``. Each stage's answer goes to ``q`` as it comes ("outcome", node, result); at
    ``stop`` its calls, trace, errors and own CPU ("done", ...)."""
    errors: list[str] = []
    lock = threading.Lock()
    # what the stages asked of slurmctld, by the protocol's step: full and cheap censuses,
    # the choosing phase's re-reads (one per CHOOSING_POLL wait), claim writes
    calls: Counter[str] = Counter()
    # per stage, its protocol steps as (seconds since the storm began, step): where a stage
    # is stuck shows as its last step (trace_summary)
    trace: dict[str, list[tuple[float, str]]] = {n: [] for n in nodes}

    def tally(what: str) -> None:
        with lock:
            calls[what] += 1

    def step(node: str, what: str) -> None:
        trace[node].append((round(time.monotonic() - began.value, 3), what))

    def stage(node: str) -> None:
        rng = random.Random(node)
        driver = SlurmDriver(node, 60.0)
        view = driver.fleet_view(cfg)
        census_of, write_of = view.census, view.write_claim

        def census(full: bool = True) -> Census:
            what = "census_full" if full else "census_cheap"
            tally(what)
            step(node, f"{what} asked")
            asked = budget.wall()
            try:
                found = census_of(full)
            except DrainError:
                step(node, f"{what} failed")
                raise
            live = live_claims(found, asked)
            expired = len(found.claims) - len(live)
            step(
                node,
                f"{what} back: {len(found.drains)} drains, {len(live)} live claims "
                f"({sum(c.choosing for c in live.values())} choosing), {expired} expired",
            )
            return found

        def write_claim(node: str, claim: Claim | None) -> None:
            tally("claim_writes")
            what = "none" if claim is None else claim.text.split(" at ")[0].split(": ")[1]
            step(node, f"write {what} asked")
            try:
                write_of(node, claim)
            except DrainError:
                step(node, f"write {what} failed")
                raise
            step(node, f"write {what} done")

        def pause(seconds: float) -> None:
            if seconds == CHOOSING_POLL:
                tally("choosing_rereads")
            time.sleep(seconds)

        view.census = census  # type: ignore[method-assign]
        view.write_claim = write_claim  # type: ignore[method-assign]
        budget = FleetBudget(cfg, view, node, sleep=pause)

        def gate() -> str | None:
            verdict = budget.check(REASON)
            step(node, "admitted" if verdict.allowed else f"refused: {verdict.detail}")
            return None if verdict.allowed else verdict.detail

        start.wait()
        time.sleep(rng.uniform(0.0, spread))
        while True:
            try:
                result = driver.drain({}, REASON, False, gate=gate)
            except DrainError as exc:
                with lock:
                    errors.append(str(exc)[:200])
                time.sleep(rng.uniform(2.0, 10.0))
                continue
            q.put(("outcome", node, result.result))
            step(node, f"result {result.result}")
            if result.result != "over_budget":
                return
            time.sleep(recheck * rng.uniform(0.5, 1.0))

    threads = [threading.Thread(target=stage, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    stop.wait()
    with lock:
        traces = {n: list(steps) for n, steps in trace.items()}
        q.put(("done", dict(calls), traces, errors[:50], len(errors), time.process_time()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--nodes", type=int, default=100)
    ap.add_argument("--percent", type=float, default=5.0)
    ap.add_argument("--spread", type=float, default=1.0)
    ap.add_argument("--recheck", type=float, default=30.0)
    ap.add_argument("--timeout", type=float, default=600.0, help="give up after this")
    ap.add_argument("--json", help="write the numbers here")
    ap.add_argument(
        "--plugin-dir",
        help="Slurm's plugin directory, for a Slurm unpacked into a private prefix "
        "(bench/fleet_storm_remote.sh)",
    )
    ap.add_argument("--log-dir", help="keep the tails of slurmctld's logs here")
    ap.add_argument(
        "--procs",
        type=int,
        default=max(1, (os.cpu_count() or 2) // 2),
        help="worker processes the stages are spread over (default: half the CPUs)",
    )
    ap.add_argument(
        "--trace",
        help="write each stage's protocol steps with their times here (JSON lines, one per "
        "stage; gzipped if it ends in .gz); where each stage stopped is in the result anyway",
    )
    args = ap.parse_args()
    if args.plugin_dir:
        use_plugin_dir(args.plugin_dir)
    work = Path(tempfile.mkdtemp(prefix="gpuwatchd-fleet-storm-"))
    cluster, procs = start_slurm(work, extra=args.nodes)
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    cfg = FleetDrainConfig(max_percent=args.percent, recheck=args.recheck)
    outcome: dict[str, str] = {}
    # the stages run in --procs worker processes (threads in each): a real fleet parses
    # each census on its own node, and 2,000 stages in one interpreter share one lock
    ctx = multiprocessing.get_context("fork")
    start, stop, began_at, q = ctx.Event(), ctx.Event(), ctx.Value("d", 0.0), ctx.Queue()
    shares = [list(cluster.others[i :: args.procs]) for i in range(args.procs)]
    workers = [
        ctx.Process(
            target=run_stages,
            args=(share, cfg, args.spread, args.recheck, began_at, start, stop, q),
            daemon=True,
        )
        for share in shares
        if share
    ]

    def collect(timeout: float = 0.0) -> tuple[object, ...] | None:
        """Take the workers' messages; return a "done" one if it came."""
        while True:
            try:
                msg = q.get(timeout=timeout) if timeout else q.get_nowait()
            except queue.Empty:
                return None
            if msg[0] == "outcome":
                outcome[msg[1]] = msg[2]
            else:
                return tuple(msg)

    try:
        for w in workers:
            w.start()
        registered_in = wait_for_registrations(cluster, len(cluster.others))
        rpcs0 = sdiag(cluster)
        ctld = procs[0].popen.pid
        ctld0, clients0 = cpu_of(ctld), children_cpu()
        self0 = time.process_time()
        began = began_at.value = time.monotonic()
        start.set()
        samples: list[int] = []
        changed_at = 0.0  # when the drained count last changed: the settle time
        sample_failures = 0
        decided_at: float | None = None
        while time.monotonic() - began < args.timeout:
            try:
                out = cluster.run(
                    "sinfo", "--noheader", "--list-reasons", "--Node", "--format", "%E"
                )
            except (AssertionError, subprocess.TimeoutExpired):
                # a saturated slurmctld refuses the sampler too: count it, keep sampling
                sample_failures += 1
            else:
                count = sum(1 for ln in out.splitlines() if ln.startswith("gpuwatchd:"))
                if not samples or count != samples[-1]:
                    changed_at = time.monotonic() - began
                samples.append(count)
            collect()
            done = len(outcome) == len(cluster.others)
            if done and decided_at is None:
                decided_at = time.monotonic() - began
                break
            time.sleep(0.1)
        rpcs1 = sdiag(cluster)
        rpcs = rpc_delta(rpcs0, rpcs1)
        served = sum(c for c, _ in rpcs.values())
        served_ms = sum(ms for _, ms in rpcs.values())
        span = time.monotonic() - began
        ctld1 = cpu_of(ctld)
        self1 = time.process_time()
        stop.set()
        calls: Counter[str] = Counter()
        traces: dict[str, list[tuple[float, str]]] = {}
        errors: list[str] = []
        n_errors = 0
        workers_cpu = 0.0
        deadline = time.monotonic() + 30.0  # the workers answer within seconds
        for _ in workers:
            done_msg = collect(timeout=max(0.1, deadline - time.monotonic()))
            if done_msg is None:
                break
            _, w_calls, w_traces, w_errors, w_n, w_cpu = done_msg
            calls.update(w_calls)  # type: ignore[arg-type]
            traces.update(w_traces)  # type: ignore[arg-type]
            errors += w_errors  # type: ignore[arg-type]
            n_errors += w_n  # type: ignore[operator]
            workers_cpu += w_cpu  # type: ignore[operator]
        for w in workers:
            w.join(timeout=30)
        # the workers are children too: their own CPU is the bench's, the rest the Slurm
        # clients' (sinfo/scontrol, the workers' children)
        clients1 = children_cpu() - workers_cpu
        decided = sum(1 for r in outcome.values() if r != "over_budget")
        answered = len(outcome)
        limit = max(1, int(len(cluster.others) * args.percent / 100 + 1e-9))
        final = samples[-1] if samples else 0
        result = {
            "nodes": args.nodes + 1,
            "budget_at_least": limit,
            "peak_drained": max(samples, default=0),
            "final_drained": final,
            "decided_s": decided_at,
            "settle_s": changed_at,  # the drained count's last change, seconds from the XID
            "span_s": span,
            "stages_answered": answered,  # had at least one answer (drained or held back)
            "stages_drained_or_done": decided,
            "samples": len(samples),
            "sample_failures": sample_failures,
            # where this machine's CPU went: slurmctld itself, and the Slurm client processes
            # (sinfo/scontrol) that a real fleet runs on its own 2,000 nodes
            "slurmctld_cpu_s": ctld1 - ctld0,
            "client_cpu_s": clients1 - clients0,
            "client_cpu_ms_per_stage": (clients1 - clients0) * 1000 / len(cluster.others),
            # the bench's own processes: the stages' Python (reading and parsing each census)
            # in --procs interpreters, which a real fleet spreads over its nodes
            "bench_cpu_s": self1 - self0 + workers_cpu,
            "bench_procs": len(workers),
            "load_avg_1m_end": os.getloadavg()[0],
            "rpc_per_s": served / span,
            "rpc_mean_ms": served_ms / max(1, served),
            "rpc_by_type": {
                k: {"count": c, "total_ms": round(ms, 1)} for k, (c, ms) in rpcs.items()
            },
            "registrations_waited_s": registered_in,
            "stage_calls": dict(sorted(calls.items())),
            **trace_summary(traces),
            "slurm_call_errors": n_errors,
            "first_errors": sorted(set(errors))[:3],
        }
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
        if args.trace:
            write_trace(Path(args.trace), traces)
    finally:
        for p in reversed(procs):
            p.stop()
        if args.log_dir:  # the controller's own account, before the work dir goes
            keep = Path(args.log_dir)
            keep.mkdir(parents=True, exist_ok=True)
            for name in ("slurmctld.log", "ctld.out", "slurmd.log", "slurmd.out", "slurm.conf"):
                if (work / name).exists():
                    tail = (work / name).read_bytes()[-2_000_000:]
                    (keep / f"n{args.nodes}-{name}").write_bytes(tail)
        subprocess.run(["rm", "-rf", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
