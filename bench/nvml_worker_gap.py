"""Why the NVML worker costs more than a plain loop reading the same values.

On a lent GPU machine (the device tool). Side by side, with an NCCL all-reduce on every
GPU: two daemons at 1 s polls (NVML events on and off) and four variants of the plain
pynvml loop of ``busy_node_soak.py`` at 1 s: one thread; one thread per GPU reading at
the same moments (as the worker's per-GPU threads do); each of those with a thread
waiting on XID events (10 s waits, as the worker). The plain variants isolate what NVML
itself charges for concurrency and for a waiting event thread; the daemons show the
worker against them. Prints CPU as % of one core over the window, and ratios.

    PYTHONPATH=. python3 bench/nvml_worker_gap.py --seconds 150 --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import free_port, gpu_indices, start_nccl
from busy_node_soak import children, cpu_s, start_daemon, threads

PLAINS = {
    "plain": [],
    "plain+threads": ["--plain-threads"],
    "plain+events": ["--plain-events"],
    "plain+threads+events": ["--plain-threads", "--plain-events"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gap-"))
    gpus = gpu_indices()
    total = args.seconds + args.warmup + 60
    me = Path(__file__).resolve().parent
    nccl = start_nccl(gpus, total, tmp / "nccl.log")
    time.sleep(15)
    hook = free_port()
    daemons = {
        "daemon": start_daemon("events", "1s", {}, free_port(), hook, tmp),
        "daemon, no NVML events": start_daemon(
            "noevents", "1s", {}, free_port(), hook, tmp, "{kernel_log: kmsg, nvml_events: false}"
        ),
    }
    plains = {
        name: subprocess.Popen(
            [sys.executable, str(me / "busy_node_soak.py"), "--plain", "1", *extra,
             "--seconds", str(total)]
        )
        for name, extra in PLAINS.items()
    }  # fmt: skip
    time.sleep(args.warmup)
    pids: dict[str, int] = {name: p.pid for name, p in plains.items()}
    for name, d in daemons.items():
        pids[name + " (process)"] = d["proc"].pid
        for kid in children(d["proc"].pid):
            pids[name + " (worker)"] = kid
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    t0 = time.monotonic()
    time.sleep(args.seconds)
    window = time.monotonic() - t0
    pct = {name: (cpu_s(pid) - before[name]) / window * 100 for name, pid in pids.items()}
    worker_threads = {name: threads(pid) for name, pid in pids.items() if name.endswith("(worker)")}
    for p in [nccl, *plains.values(), *(d["proc"] for d in daemons.values())]:
        p.kill()
    base = pct["plain"]
    lines = [f"GPUs {gpus} under NCCL, 1 s polls, {window:.0f} s window, % of one core"]
    for name, value in pct.items():
        ratio = value / base if base else float("nan")
        lines.append(f"{name:34s} {value:.4f} %  {ratio:.2f}x plain")
    (out / "gap.txt").write_text("\n".join(lines) + "\n")
    (out / "gap.json").write_text(
        json.dumps({"pct": pct, "window_s": window, "worker_threads_total_s": worker_threads})
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
