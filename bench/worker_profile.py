"""Where the NVML worker's CPU goes on a busy node, beside a plain loop reading the same.

On a lent GPU machine (the device tool), with py-spy installed there. Runs an NCCL
all-reduce on every GPU, one daemon at 1 s polls (the worker process on) and the plain
pynvml loop of ``busy_node_soak.py`` at 1 s, then samples the worker, the plain loop and
the daemon with ``py-spy record --native`` side by side. py-spy counts only samples where
a thread was on the CPU, so at a fixed rate the sample counts compare CPU time directly.
Writes raw collapsed stacks and ``profile.txt``: per process the samples in NVML
(libnvidia-ml and the driver below it), in the CPython interpreter and elsewhere, and
the heaviest frames.

    PYTHONPATH=. python3 bench/worker_profile.py --seconds 90 --out "$OUT"
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import free_port, gpu_indices, start_nccl
from busy_node_soak import children, start_daemon

# Leaf frames of a thread that waits: py-spy's idle detection misses some, so drop them
IDLE_LEAVES = ("wait", "futex", "poll", "select", "accept", "sleep", "_read_exact", "recv")


def summarize(name: str, raw: Path, top: int = 25) -> list[str]:
    where: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        count = int(n)
        total += count
        parts = stack.split(";")
        leaf_name = parts[-1].split(" (")[0].lower()
        if any(w in leaf_name for w in IDLE_LEAVES):
            where["waiting (not CPU)"] += count
            continue
        if any("libnvidia-ml" in p for p in parts):
            where["in NVML"] += count
            nvml = next(p for p in parts if "nvml" in p.lower() and "(" in p)
            frames["NVML <- " + nvml.split(" (")[0]] += count
        else:
            leaf = parts[-1]
            where["python/other"] += count
            py = [p for p in parts if ".py:" in p]
            frames[(py[-1] if py else leaf).split(" (")[0] + " | " + leaf.split(" (")[0]] += count
    out = [f"== {name}: {total} samples"]
    out += [f"   {k}: {v} ({100 * v / max(total, 1):.0f} %)" for k, v in where.most_common()]
    out += [f"   {v:6d} {k}" for k, v in frames.most_common(top)]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--rate", type=int, default=1000)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="wprof-"))
    gpus = gpu_indices()
    total = args.seconds + 90
    me = Path(__file__).resolve().parent
    nccl = start_nccl(gpus, total, tmp / "nccl.log")
    time.sleep(15)
    daemon = start_daemon("1s", "1s", {}, free_port(), free_port(), tmp)
    plain = subprocess.Popen(
        [sys.executable, str(me / "busy_node_soak.py"), "--plain", "1", "--seconds", str(total)]
    )
    time.sleep(30)
    kids = children(daemon["proc"].pid)
    targets = {"worker": kids[0], "plain": plain.pid, "daemon": daemon["proc"].pid}
    spies = {
        name: subprocess.Popen(
            ["py-spy", "record", "--native", "-r", str(args.rate), "-d", str(int(args.seconds)),
             "-f", "raw", "-o", str(out / f"{name}.txt"), "-p", str(pid)],
            stdout=subprocess.DEVNULL,
            stderr=(tmp / f"spy-{name}.log").open("wb"),
        )
        for name, pid in targets.items()
    }  # fmt: skip
    for spy in spies.values():
        spy.wait()
    lines = [f"py-spy --native at {args.rate} Hz for {args.seconds:g} s, NCCL on GPUs {gpus}"]
    for name in targets:
        raw = out / f"{name}.txt"
        if raw.exists():
            lines += summarize(name, raw)
        else:
            lines.append(f"== {name}: no profile ({(tmp / f'spy-{name}.log').read_text()[-300:]})")
    for p in (daemon["proc"], plain, nccl):
        p.kill()
    (out / "profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    os.sync()
    return 0


if __name__ == "__main__":
    sys.exit(main())
