"""What `gpuwatchd run` costs on a real GPU host, measured side by side in one run.

For each config (the default, and `poll.interval: 1s`) it starts the real daemon (NVML
backend) as a child process and, over the same window, a plain pynvml loop polling the same
GPUs at the same cadence as a second child, and a bare Python process that imported pynvml,
initialised it and polled every GPU once. It reports:
- CPU of the daemon and of the plain loop as a share of one core, and their ratio;
- RSS of the daemon and of the bare process, and the difference;
- the daemon's threads, /metrics scrape latency (p50/p99 of 40 scrapes after the CPU
  window, which itself is scraped every 15 s as Prometheus would) and size;
- per-GPU poll wall time (the daemon's `gpuwatchd_source_duration_seconds{source="nvml"}`,
  the slowest GPU of the last cycle, sampled at every scrape).

Usage on the GPU host (wheels as in bench/README.md):
    PYTHONPATH=/tmp/site:. python3 bench/real_cost.py --seconds 180 --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchlib import cpu_seconds, free_port, pct, status_value, thread_cpu_seconds

ROOT = Path(__file__).resolve().parent.parent

PLAIN = r"""
import sys, time, pynvml as nv
interval = float(sys.argv[1])
nv.nvmlInit()
handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
def poll(h):
    out = {}
    for name, fn in (
        ("temp", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
        ("power", lambda: nv.nvmlDeviceGetPowerUsage(h)),
        ("util", lambda: nv.nvmlDeviceGetUtilizationRates(h)),
        ("mem", lambda: nv.nvmlDeviceGetMemoryInfo(h)),
        ("clock", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        ("throttle", lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
        ("ecc_c", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
        ("ecc_u", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)),
        ("remap", lambda: nv.nvmlDeviceGetRemappedRows(h)),
        ("pcie_replay", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)),
        ("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
        ("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
        ("procs", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h)),
    ):
        try:
            out[name] = fn()
        except nv.NVMLError:
            pass
    return out
print("ready", flush=True)
while True:
    start = time.monotonic()
    for h in handles:
        poll(h)
    time.sleep(max(0.0, interval - (time.monotonic() - start)))
"""

TRIM = "import ctypes; ctypes.CDLL('libc.so.6').malloc_trim(0)\n"

BARE = r"""
import time, pynvml as nv
nv.nvmlInit()
for i in range(nv.nvmlDeviceGetCount()):
    h = nv.nvmlDeviceGetHandleByIndex(i)
    nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
    nv.nvmlDeviceGetMemoryInfo(h)
print("ready", flush=True)
time.sleep(3600)
"""


def child(code: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.readline()  # "ready"
    return proc


def compile_package(root: Path = ROOT) -> None:
    """Byte-compile gpuwatchd as the .deb does (dh_python3's py3compile at install): a
    daemon that compiles its modules at start keeps the compiler's memory (~3 MiB)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(root / "gpuwatchd")], check=True, env=env
    )


def measure(name: str, config_text: str, seconds: float, tree: Path = ROOT) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix="gpuwatchd-cost-")
    config = Path(work) / "gpuwatchd.yaml"
    config.write_text(f"state_dir: {work}/state\n{config_text}")
    port = free_port()
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuwatchd",
            "run",
            "-c",
            str(config),
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(Path(work) / "daemon.log", "w"),  # noqa: SIM115
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
    )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).read()
            break
        except OSError:
            if time.monotonic() > deadline or daemon.poll() is not None:
                raise RuntimeError((Path(work) / "daemon.log").read_text()[-3000:]) from None
            time.sleep(0.2)
    interval = 1.0 if "interval: 1s" in config_text else 5.0  # the default poll.interval
    plain = child(PLAIN, str(interval))
    bare = child(BARE)
    # the same bare process after glibc's malloc_trim, as the daemon trims after start-up
    bare_trimmed = child(BARE.replace('print("ready"', TRIM + 'print("ready"'))
    time.sleep(10)  # warm-up
    d0, p0, t0 = cpu_seconds(daemon.pid), cpu_seconds(plain.pid), time.monotonic()
    threads0 = thread_cpu_seconds(daemon.pid)
    poll_s: list[float] = []
    while time.monotonic() - t0 < seconds:  # scraped every 15 s, as Prometheus would
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
        m = re.search(rb'^gpuwatchd_source_duration_seconds\{source="nvml"\} (\S+)$', body, re.M)
        if m:
            poll_s.append(float(m.group(1)))
        time.sleep(min(15.0, max(0.0, seconds - (time.monotonic() - t0))))
    d1, p1, t1 = cpu_seconds(daemon.pid), cpu_seconds(plain.pid), time.monotonic()
    threads1 = thread_cpu_seconds(daemon.pid)
    by_thread = {
        name: round((spent - threads0.get(name, 0.0)) / (t1 - t0) * 100, 4)
        for name, spent in sorted(threads1.items())
    }
    scrape_s: list[float] = []
    for _ in range(40):  # latency, after the CPU window
        started = time.perf_counter()
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = resp.read()
        scrape_s.append(time.perf_counter() - started)
        time.sleep(0.25)
    size = len(body)
    daemon_cpu = (d1 - d0) / (t1 - t0) * 100
    plain_cpu = (p1 - p0) / (t1 - t0) * 100
    daemon_rss = status_value(daemon.pid, "VmRSS") / 1024
    bare_rss = status_value(bare.pid, "VmRSS") / 1024
    trimmed_rss = status_value(bare_trimmed.pid, "VmRSS") / 1024
    out: dict[str, Any] = {
        "config": name,
        "window_s": round(t1 - t0, 1),
        "daemon_cpu_pct": round(daemon_cpu, 4),
        "plain_loop_cpu_pct": round(plain_cpu, 4),
        "cpu_ratio_daemon_to_plain": round(daemon_cpu / plain_cpu, 3) if plain_cpu else None,
        "daemon_rss_mib": round(daemon_rss, 1),
        "bare_pynvml_rss_mib": round(bare_rss, 1),
        "rss_over_bare_mib": round(daemon_rss - bare_rss, 1),
        "bare_pynvml_trimmed_rss_mib": round(trimmed_rss, 1),
        "rss_over_trimmed_bare_mib": round(daemon_rss - trimmed_rss, 1),
        "daemon_threads": int(status_value(daemon.pid, "Threads")),
        "scrapes": len(scrape_s),
        "scrape_p50_ms": round(pct(scrape_s, 0.5) * 1000, 2),
        "scrape_p99_ms": round(pct(scrape_s, 0.99) * 1000, 2),
        "scrape_bytes": size,
        "poll_wall_p50_ms": round(pct(poll_s, 0.5) * 1000, 3),
        "poll_wall_max_ms": round(max(poll_s) * 1000, 3) if poll_s else None,
        "cpu_pct_by_thread": by_thread,  # kernel thread names (gpuwatchd names them gw-...)
    }
    for proc in (daemon, plain, bare, bare_trimmed):
        proc.terminate()
        proc.wait(10)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--out", default=".")
    ap.add_argument("--configs", default="default,1s")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the gpuwatchd tree to run")
    args = ap.parse_args()
    configs = {"default": "", "1s": "poll:\n  interval: 1s\n"}
    compile_package(args.tree.resolve())
    tree = args.tree.resolve()
    results = [measure(c, configs[c], args.seconds, tree) for c in args.configs.split(",")]
    for r in results:
        print("COST " + json.dumps(r), flush=True)
    with open(os.path.join(args.out, "real_cost.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
