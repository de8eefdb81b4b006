#!/usr/bin/env python3
"""Page latency: from an alert transition handed to the actions sink to the webhook
receiving it, on loopback, with an idle queue.

The real ``ActionsSink`` (durable SQLite outbox in a temporary state directory on disk,
WAL + synchronous=FULL, sender thread, httpx keep-alive client) sends to a real HTTP
server in the same process; both ends read ``time.perf_counter``. Transitions go one at a
time: the next is handed over only after the previous one arrived, so the queue is idle.
``routing.group_wait`` is 0s here (the default 5s window adds up to 5s on purpose: it lets
a cascade go out as one message).

    python3 bench/page_latency.py                 # 300 deliveries, webhook
    python3 bench/page_latency.py -n 1000 --json out.json

Goal: p99 < 100 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actions_support import sink_for

from gpuwatchd.config.loader import load_config
from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.clock import SystemClock


class Receiver:
    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.event = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                at = time.perf_counter()
                msg = json.loads(body)
                for alert in msg["alerts"]:
                    outer.arrived[alert["labels"]["run"]] = at
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                outer.event.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("-n", type=int, default=300, help="deliveries to time (default 300)")
    ap.add_argument("--warmup", type=int, default=20, help="untimed deliveries first")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()

    rx = Receiver()
    state = tempfile.mkdtemp(prefix="gpuwatchd-bench-", dir=os.environ.get("BENCH_DIR"))
    cfg_path = Path(state) / "gpuwatchd.yaml"
    cfg_path.write_text(
        f"""node_name: bench-node
state_dir: {state}
receivers:
  - {{name: ops, type: webhook, url: "http://127.0.0.1:{rx.port}/hook"}}
routing:
  group_wait: 0s
  group_by: [node, run]
"""
    )
    config = load_config(str(cfg_path), must_exist=True, environ={})
    clock = SystemClock()
    sink = sink_for(config, clock, start=True)
    latencies: list[float] = []
    commit: list[float] = []
    try:
        for i in range(args.warmup + args.n):
            run = str(i)
            t = AlertTransition(
                rule="GpuXidFatal",
                state=AlertState.FIRING,
                severity=AlertSeverity.PAGE,
                labels={"node": "bench-node", "gpu": "3", "run": run},
                annotations={"summary": "XID 79 on GPU 3"},
                active_since=clock.now(),
                timestamp=clock.now(),
                sequence=1,
            )
            rx.event.clear()
            start = time.perf_counter()
            sink.deliver([t], clock.now())
            handed = time.perf_counter()
            deadline = start + 10
            while run not in rx.arrived:
                rx.event.wait(0.5)
                rx.event.clear()
                if time.perf_counter() > deadline:
                    print(f"delivery {i} did not arrive within 10s", file=sys.stderr)
                    return 1
            if i >= args.warmup:
                latencies.append((rx.arrived[run] - start) * 1000)
                commit.append((handed - start) * 1000)
            while sink.pending():  # idle queue: the sink has recorded the ack
                time.sleep(0.0005)
    finally:
        sink.close()
        rx.server.shutdown()

    result = {
        "deliveries": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 2),
        "p90_ms": round(percentile(latencies, 90), 2),
        "p99_ms": round(percentile(latencies, 99), 2),
        "max_ms": round(max(latencies), 2),
        "mean_ms": round(statistics.fmean(latencies), 2),
        "commit_p50_ms": round(percentile(commit, 50), 2),
        "commit_p99_ms": round(percentile(commit, 99), 2),
        "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
        "state_dir_fs": state,
    }
    print(
        f"page latency over {result['deliveries']} deliveries (transition handed to the sink "
        f"-> webhook received, loopback, idle queue):\n"
        f"  p50 {result['p50_ms']} ms  p90 {result['p90_ms']} ms  p99 {result['p99_ms']} ms  "
        f"max {result['max_ms']} ms  mean {result['mean_ms']} ms\n"
        f"  the deliver() call itself (durable commit, wake-up): p50 {result['commit_p50_ms']} ms  "
        f"p99 {result['commit_p99_ms']} ms\n"
        f"  goal p99 < 100 ms: {'met' if result['p99_ms'] < 100 else 'NOT met'}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["p99_ms"] < 100 else 1


if __name__ == "__main__":
    sys.exit(main())
