"""Thread wake-ups and CPU per poll round of `gpuwatchd run` with the NVML worker, for two
checkouts side by side in one run (issue 21: "before" and "after" a change to the worker).

No GPU needed: both daemons run the NVML backend in its worker process over the shipped
fake pynvml (a stand-in module with ``--gpus`` fake H100s of 18 NVLinks each, written to
a temporary folder and put first on both daemons' path), with 1 s polls, a kmsg file as
the kernel log and NVML events on. After a warm-up, over the same window, it reads for
each daemon and its worker every thread's CPU time (schedstat) and its context switches
(``voluntary_ctxt_switches``: a thread that sleeps and is woken counts one), and reports
them per poll round. The fake answers in microseconds, so the CPU here is the daemon's
and the worker's own Python and its hand-offs, not NVML's: what this measures is what a
change to the wire and the threads saves, not what a real GPU costs.

    PYTHONPATH=. python3 bench/worker_rounds.py --before /tmp/old --after . --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import free_port, thread_cpu_seconds

STANDIN = """
import sys
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

_fake = FakeNvml([h100(i, nvlink=True) for i in range({gpus})])


def __getattr__(name):
    return getattr(_fake, name)
"""


def switches(pid: int) -> dict[str, int]:
    """Voluntary context switches per thread name (threads of one name summed)."""
    out: dict[str, int] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{task}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        name = fields.get("Name", "?").strip()
        out[name] = out.get(name, 0) + int(fields.get("voluntary_ctxt_switches", "0"))
    return out


def worker_of(pid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            return int(entry)
    return None


def start(name: str, tree: Path, tmp: Path, standin_dir: Path, interval: float) -> dict[str, Any]:
    state = tmp / name
    state.mkdir()
    kmsg = state / "kmsg"
    kmsg.write_text("")
    cfg = state / "gpuwatchd.yaml"
    cfg.write_text(
        f"node_name: rounds-{name}\nstate_dir: {state}\nbackend: nvml\n"
        f"poll: {{interval: {interval:g}s}}\n"
        f"sources: {{kernel_log: kmsg, kmsg_path: {kmsg}, nvml_events: true}}\n"
        # a receiver, as on a real node, so the actions threads run (no alert fires here)
        f'receivers:\n  - {{name: hook, type: webhook, url: "http://127.0.0.1:{free_port()}/"}}\n'
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{standin_dir}:{tree}",
        "GPUWATCHD_NVML_MODULE": "bench_standin",
    }
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatchd", "run", "-c", str(cfg), "--listen", f"127.0.0.1:{port}"],
        stdout=(state / "daemon.log").open("wb"),
        stderr=subprocess.STDOUT,
        env=env,
        cwd=str(tree),
    )
    return {"name": name, "proc": proc, "log": state / "daemon.log"}


def snapshot(pid: int) -> tuple[dict[str, float], dict[str, int]]:
    return thread_cpu_seconds(pid), switches(pid)


def per_round(
    before: tuple[dict[str, float], dict[str, int]],
    after: tuple[dict[str, float], dict[str, int]],
    rounds: float,
) -> dict[str, Any]:
    cpu0, sw0 = before
    cpu1, sw1 = after
    threads = {}
    for name in sorted(set(cpu1) | set(sw1)):
        cpu = cpu1.get(name, 0.0) - cpu0.get(name, 0.0)
        wakes = sw1.get(name, 0) - sw0.get(name, 0)
        if cpu <= 0 and wakes <= 0:
            continue
        threads[name] = {
            "cpu_us_per_round": round(cpu / rounds * 1e6, 1),
            "wakeups_per_round": round(wakes / rounds, 2),
        }
    return {
        "cpu_us_per_round": round(
            (sum(cpu1.values()) - sum(cpu0.get(k, 0.0) for k in cpu1)) / rounds * 1e6, 1
        ),
        "wakeups_per_round": round(
            (sum(sw1.values()) - sum(sw0.get(k, 0) for k in sw1)) / rounds, 2
        ),
        "threads": threads,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="checkout for 'before'")
    ap.add_argument("--after", type=Path, required=True, help="checkout for 'after'")
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0, help="poll.interval, seconds")
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuwatchd-rounds-"))
    standin_dir = tmp / "standin"
    standin_dir.mkdir()
    (standin_dir / "bench_standin.py").write_text(STANDIN.format(gpus=args.gpus))
    runs = [
        start("before", args.before.resolve(), tmp, standin_dir, args.interval),
        start("after", args.after.resolve(), tmp, standin_dir, args.interval),
    ]
    try:
        time.sleep(args.warmup)
        pids: dict[str, tuple[int, int]] = {}
        for run in runs:
            daemon = run["proc"].pid
            worker = worker_of(daemon)
            give_up = time.monotonic() + 60  # a loaded machine starts slowly
            while worker is None and run["proc"].poll() is None and time.monotonic() < give_up:
                time.sleep(0.5)
                worker = worker_of(daemon)
            if run["proc"].poll() is not None or worker is None:
                raise SystemExit(f"{run['name']}: no daemon or worker:\n{run['log'].read_text()}")
            pids[run["name"]] = (daemon, worker)
        first = {n: (snapshot(d), snapshot(w)) for n, (d, w) in pids.items()}
        t0 = time.monotonic()
        time.sleep(args.seconds)
        seconds = time.monotonic() - t0
        rounds = seconds / args.interval
        result: dict[str, Any] = {
            "gpus": args.gpus,
            "seconds": round(seconds, 1),
            "interval": args.interval,
        }
        for name, (daemon, worker) in pids.items():
            d0, w0 = first[name]
            result[name] = {
                "daemon": per_round(d0, snapshot(daemon), rounds),
                "worker": per_round(w0, snapshot(worker), rounds),
            }
    finally:
        for run in runs:
            run["proc"].terminate()
        for run in runs:
            try:
                run["proc"].wait(10)
            except subprocess.TimeoutExpired:
                run["proc"].kill()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
