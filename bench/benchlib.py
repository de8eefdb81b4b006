"""Helpers the benchmarks share: process readings from /proc, percentiles, free ports, and
the CuPy program that provokes a real XID 31 on a GPU host."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

# An application fault: the kernel writes to address 0x10, the driver reports XID 31 (MMU
# fault) in the kernel log and as an NVML event; the GPU stays healthy. Prints the child's
# pid and the wall time of the launch. Never run on a production node.
XID31_PROGRAM = r"""
import os, time
import cupy as cp
x = cp.zeros(1, dtype=cp.int32)
src = 'extern "C" __global__ void boom(int *p) { *(volatile int *)0x10 = *p; }'
boom = cp.RawKernel(src, "boom")
boom.compile()
cp.cuda.runtime.deviceSynchronize()
print(os.getpid(), time.time(), flush=True)
boom((1,), (1,), (x,))
try:
    cp.cuda.runtime.deviceSynchronize()
except Exception as exc:
    print("fault:", type(exc).__name__, exc, flush=True)
"""


# A bench rule: every XID 31 pages, quiet after 1 s so each provoked fault is a new page
# (one entry of a ``rules:`` list; xid_to_page.py and busy_node_soak.py use it).
BENCH_XID31_RULE = """- name: BenchXid31
  description: Every XID 31 pages (bench only), quiet after 1 s so each fault pages anew.
  severity: page
  condition:
    xid:
      codes: [31]
      quiet: 1s
  annotations:
    summary: 'XID {xid} on GPU {gpu}'
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _schedstat_ns(path: str) -> int | None:
    """CPU time in ns from a schedstat file (None where the kernel keeps none)."""
    try:
        with open(path, encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def cpu_seconds(pid: int) -> float:
    """CPU time of a process: the sum of its live threads' schedstat (nanoseconds: a
    daemon using 0.1 % of a core moves utime by one 10 ms clock tick in 10 s, too coarse
    to compare), else utime + stime from /proc/PID/stat."""
    per_thread = thread_cpu_seconds(pid)
    if per_thread:
        return sum(per_thread.values())
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (the kernel's comm; threads of one name summed), from
    schedstat where the kernel has it, else utime + stime. A thread that ended since is
    missing: compare two readings name by name."""
    out: dict[str, float] = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{task}"
        try:
            with open(f"{base}/stat", encoding="ascii", errors="replace") as fh:
                raw = fh.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1 : raw.rindex(")")]
        ns = _schedstat_ns(f"{base}/schedstat")
        if ns is not None:
            seconds = ns / 1e9
        else:
            fields = raw.rsplit(")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / TICK
        out[name] = out.get(name, 0.0) + seconds
    return out


def status_value(pid: int | str, key: str) -> float:
    """A number from /proc/PID/status (``VmRSS`` in KiB, ``Threads``); pid may be "self"."""
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return float(line.split()[1])
    return float("nan")


def rss_mib(pid: int | str = "self") -> float:
    return status_value(pid, "VmRSS") / 1024


def pct(values: list[float], q: float) -> float:
    """The q-quantile by nearest rank (nan for no values)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def gpu_indices() -> str:
    """Every GPU's index, comma separated (as ``nccl_load.py --gpus`` takes them)."""
    import pynvml as nv

    nv.nvmlInit()
    try:
        return ",".join(str(g) for g in range(nv.nvmlDeviceGetCount()))
    finally:
        nv.nvmlShutdown()


def start_nccl(gpus: str, seconds: float, log: Path | None = None) -> subprocess.Popen[bytes]:
    """An NCCL all-reduce on ``gpus`` for ``seconds`` (bench/nccl_load.py, which sets the
    NVLS variables itself); the caller waits for it to come up (about 15 s)."""
    here = Path(__file__).resolve().parent
    return subprocess.Popen(
        [sys.executable, str(here / "nccl_load.py"), "--gpus", gpus, "--seconds", str(seconds)],
        stdout=log.open("wb") if log is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
