"""Kernel line (or NVML event) to page, on a real GPU host (through the device tool).

Runs the real daemon in this process with the DEFAULT config plus one loopback webhook and
one bench rule (XID 31 pages, quiet after 1 s, so that every fault is a new page); the
shipped GpuXidApplicationRepeated is disabled, since thirty deliberate XID 31s would keep
its ticket firing and fold every later page into its group's update window. It provokes
real XID 31s (a CuPy kernel writing to address 0x10 in a fresh child process: an
application fault, the GPU stays healthy) and measures per fault:
- read -> webhook: from the moment the daemon first saw the fault (it read the kernel line,
  the handler's emit, or it received the NVML XID event, whichever came first) to the
  webhook request arriving at the loopback receiver;
- launch -> webhook: from the CUDA launch to the webhook.
Modes: both (kernel line and NVML events), kernel-only (NVML events off), nvml-only (no
kernel-log source). Prints p50/p99/max per mode and writes xid_to_page.json.

Usage on the GPU host (see bench/README.md for carrying the wheels):
    PYTHONPATH=/tmp/site:. python3 bench/xid_to_page.py --out "$OUT" --faults 30
Never run this on a production node: it writes real XIDs into the kernel log.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from benchlib import BENCH_XID31_RULE, XID31_PROGRAM, pct

from gpuwatchd.configfile.loader import ListenAddress, default_config, load_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.records import XidEvent
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.sources.gpu.nvml import NvmlBackend

BENCH_RULE = f"\nrules:\n{BENCH_XID31_RULE}"


class Receiver:
    """A loopback webhook that notes when each firing BenchXid31 message arrived."""

    def __init__(self) -> None:
        self.hits: list[float] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.end_headers()
                try:
                    payload = json.loads(body)
                except ValueError:
                    return
                alerts = payload.get("alerts", [])
                if any(
                    a.get("status") == "firing"
                    and a.get("labels", {}).get("alertname") == "BenchXid31"
                    for a in alerts
                ):
                    with outer.lock:
                        outer.hits.append(arrived)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def run_mode(mode: str, faults: int, spacing: float) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix=f"gpuwatchd-{mode}-")
    rule_file = os.path.join(work, "bench.yaml")
    with open(rule_file, "w") as fh:
        fh.write(BENCH_RULE)
    rx = Receiver()
    cfg_file = os.path.join(work, "gpuwatchd.yaml")
    with open(cfg_file, "w") as fh:
        fh.write(
            f"state_dir: {work}/state\nlisten: 127.0.0.1:0\n"
            f"rules: {{files: [{rule_file}], disable: [GpuXidApplicationRepeated]}}\n"
            f"receivers:\n  - name: hook\n    type: webhook\n    url: {rx.url}\n"
        )
    config = load_config(cfg_file, must_exist=True)
    sources = config.sources
    if mode == "kernel-only":
        sources = dataclasses.replace(sources, nvml_events=False)
    elif mode == "nvml-only":
        sources = dataclasses.replace(sources, kernel_log="none")
    config = dataclasses.replace(config, sources=sources, listen=ListenAddress("127.0.0.1", 0))
    assert config.poll == default_config().poll  # the default cadence, on purpose
    clock = SystemClock()
    daemon = Daemon(config, NvmlBackend(clock=clock), clock)
    arrivals: list[tuple[float, XidEvent]] = []
    lock = threading.Lock()
    handler = daemon.xids.handler
    if handler is not None:  # time the moment the daemon read each kernel line
        intake = handler.sink

        class KernelTap:
            def append(self, event: XidEvent) -> None:
                with lock:
                    arrivals.append((time.time(), event))
                intake.append(event)

        handler.sink = KernelTap()
    events = daemon.xids.events
    if events is not None:
        xids = daemon.xids

        class NvmlTap:
            def nvml_event(self, event: XidEvent) -> None:
                with lock:
                    arrivals.append((time.time(), event))
                xids.nvml_event(event)

        events.sink = NvmlTap()
    daemon.start()
    daemon.wait_started(10.0)
    time.sleep(2.0)
    rows: list[dict[str, Any]] = []
    for i in range(faults):
        child = subprocess.run(
            [sys.executable, "-c", XID31_PROGRAM],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        first = child.stdout.split("\n", 1)[0].split()
        if len(first) != 2:
            print("fault child failed:", child.stdout, child.stderr[-1500:], flush=True)
            continue
        launched = float(first[1])
        deadline = time.time() + 10
        page = seen = None
        first_by = ""
        while time.time() < deadline:
            with rx.lock:
                pages = [t for t in rx.hits if t >= launched]
            with lock:
                seen_at = sorted(
                    (t, e.source) for t, e in arrivals if t >= launched and e.xid == 31
                )
            if pages and seen_at:
                page, (seen, first_by) = pages[0], seen_at[0]
                break
            time.sleep(0.002)
        row = {
            "fault": i,
            "launch_to_read_s": None if seen is None else seen - launched,
            "first_seen_by": None if seen is None else first_by,
            "read_to_page_s": None if page is None or seen is None else page - seen,
            "launch_to_page_s": None if page is None else page - launched,
        }
        rows.append(row)
        print(mode, json.dumps(row), flush=True)
        time.sleep(spacing)
    daemon.stop()
    rx.server.shutdown()
    summary: dict[str, Any] = {"mode": mode, "faults": len(rows)}
    for k in ("launch_to_read_s", "read_to_page_s", "launch_to_page_s"):
        vals = [r[k] for r in rows if r[k] is not None]
        summary[k] = {
            "n": len(vals),
            "p50_ms": round(pct(vals, 0.5) * 1000, 2),
            "p99_ms": round(pct(vals, 0.99) * 1000, 2),
            "max_ms": round(max(vals) * 1000, 2) if vals else None,
        }
    return {"summary": summary, "faults": rows}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--faults", type=int, default=30)
    ap.add_argument("--spacing", type=float, default=6.0, help="seconds between faults")
    ap.add_argument("--modes", default="both,kernel-only,nvml-only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = [run_mode(m, args.faults, args.spacing) for m in args.modes.split(",")]
    for r in results:
        print("SUMMARY " + json.dumps(r["summary"]), flush=True)
    with open(os.path.join(args.out, "xid_to_page.json"), "w") as fh:
        json.dump(results, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
