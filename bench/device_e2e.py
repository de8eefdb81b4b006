"""End-to-end run of the daemon on a real GPU host (through the device tool).

What it does, in one process so that both XID paths can be timed:
1. runs the real daemon (NVML backend, /dev/kmsg kernel-log source, 1 s polls) and scrapes
   /metrics and /api/v1/status after a few seconds;
2. provokes N real XID 31s, each in a fresh child process running a CuPy kernel that
   writes to address 0x10 (an application fault: the GPU stays healthy), and measures,
   per fault, the delay from the kernel launch to (a) the NVML event, (b) the kernel line
   and (c) the merged incident;
3. keeps the daemon running for at least --run-seconds and reports its CPU time and RSS.

Usage on the GPU host (see bench/README.md for carrying the wheels):
    PYTHONPATH=/tmp/site:. python3 bench/device_e2e.py --out "$OUT" --faults 20
Never run this on a production node: it writes real XIDs into the kernel log.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from typing import Any

from benchlib import XID31_PROGRAM, pct, rss_mib

from gpuwatchd.configfile.loader import ListenAddress, default_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.records import XidEvent
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.sources.gpu.nvml import NvmlBackend


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--faults", type=int, default=20)
    ap.add_argument("--run-seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=1.0)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    state = tempfile.mkdtemp(prefix="gpuwatchd-state-")
    config = default_config()
    config = dataclasses.replace(
        config,
        state_dir=state,
        listen=ListenAddress("127.0.0.1", 0),
        poll=dataclasses.replace(config.poll, interval=args.interval, call_timeout=2.0),
        sources=dataclasses.replace(config.sources, kernel_log="kmsg"),
    )
    clock = SystemClock()
    arrivals: dict[str, list[tuple[float, XidEvent]]] = {"nvml": [], "kernel": [], "merged": []}
    lock = threading.Lock()

    def on_record(record: object) -> None:
        if isinstance(record, XidEvent):
            with lock:
                arrivals["merged"].append((time.time(), record))

    daemon = Daemon(config, NvmlBackend(clock=clock), clock, emit=on_record)
    # instrument both paths (arrival time before the merger sees them)
    intake = daemon.xids

    class Tap:
        def append(self, event: XidEvent) -> None:
            with lock:
                arrivals["kernel"].append((time.time(), event))
            intake.append(event)

        def nvml_event(self, event: XidEvent) -> None:
            with lock:
                arrivals["nvml"].append((time.time(), event))
            intake.nvml_event(event)

    if intake.handler is not None:
        intake.handler.sink = Tap()
    if intake.events is not None:
        intake.events.sink = Tap()

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t_start = time.monotonic()
    daemon.start()
    assert daemon.http is not None
    url = daemon.http.url
    time.sleep(max(3.0, args.interval * 3))
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        metrics = resp.read()
    with open(os.path.join(args.out, "metrics.txt"), "wb") as fh:
        fh.write(metrics)
    with urllib.request.urlopen(url + "/api/v1/status", timeout=5) as resp:
        status = json.load(resp)
    with open(os.path.join(args.out, "status.json"), "w") as fh:
        json.dump(status, fh, indent=2)
    print(
        f"daemon up: {len(status['gpus'])} GPU(s); sources: "
        + ", ".join(f"{k}={'up' if v['up'] else 'DOWN'}" for k, v in status["sources"].items())
    )

    results: list[dict[str, Any]] = []
    for i in range(args.faults):
        child = subprocess.run(
            [sys.executable, "-c", XID31_PROGRAM],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        first = child.stdout.split("\n", 1)[0].split()
        if len(first) != 2:
            print("fault child failed:", child.stdout, child.stderr[-2000:])
            continue
        pid, launched = int(first[0]), float(first[1])
        deadline = time.time() + 8
        row: dict[str, Any] = {"fault": i, "pid": pid}
        while time.time() < deadline:
            with lock:
                merged = [(t, e) for t, e in arrivals["merged"] if e.pid == pid]
                nv = [t for t, e in arrivals["nvml"] if t >= launched]
                kn = [t for t, e in arrivals["kernel"] if e.pid == pid]
            if merged and kn:
                break
            time.sleep(0.01)
        with lock:
            merged = [(t, e) for t, e in arrivals["merged"] if e.pid == pid]
            kn = [t for t, e in arrivals["kernel"] if e.pid == pid]
            nv = [t for t, e in arrivals["nvml"] if launched <= t <= launched + 8]
        row["merged_s"] = merged[0][0] - launched if merged else None
        row["merged_source"] = merged[0][1].source if merged else None
        row["merged_count"] = len(merged)
        row["kernel_s"] = kn[0] - launched if kn else None
        row["nvml_s"] = nv[0] - launched if nv else None
        if merged:
            e = merged[0][1]
            row.update(xid=e.xid, gpu=e.gpu, process=e.process, pci=e.pci_bus_id)
        results.append(row)
        print(json.dumps(row), flush=True)
        time.sleep(0.5)

    remaining = args.run_seconds - (time.monotonic() - t_start)
    if remaining > 0:
        time.sleep(remaining)
    wall = time.monotonic() - t_start
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        final_metrics = resp.read()
    with open(os.path.join(args.out, "metrics-final.txt"), "wb") as fh:
        fh.write(final_metrics)
    daemon.stop()

    summary: dict[str, Any] = {"faults": len(results), "wall_s": wall}
    for key in ("nvml_s", "kernel_s", "merged_s"):
        vals = [r[key] for r in results if r.get(key) is not None]
        summary[key] = {
            "n": len(vals),
            "p50": pct(vals, 0.5),
            "p99": pct(vals, 0.99),
            "max": max(vals) if vals else None,
            "mean": statistics.fmean(vals) if vals else None,
        }
    summary["merged_both_sources"] = sum(
        1 for r in results if r.get("merged_source") == "kmsg+nvml"
    )
    summary["merged_once"] = sum(1 for r in results if r.get("merged_count") == 1)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    summary["cpu_s_including_fault_bookkeeping"] = cpu
    summary["rss_mib"] = rss_mib()
    summary["maxrss_mib"] = cpu1.ru_maxrss / 1024
    print("SUMMARY " + json.dumps(summary, indent=1))
    with open(os.path.join(args.out, "e2e.json"), "w") as fh:
        json.dump({"summary": summary, "faults": results}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
