"""An XID storm against the real daemon: N kernel-log lines per second for S seconds, XIDs
among them, through the kmsg path (a file of /dev/kmsg records the daemon follows; the
machine's real kernel log is never written). The issue's figure is 50,000 lines/s for
60 s; tests/faults/test_fault_storm.py plays 10 s of it in CI.

Measures: lines handled per second (and how long the daemon took to catch up after the
writer stopped), XID lines counted against XID lines written, RSS before / peak / after,
incidents (distinct alerts) and messages a webhook receiver got.

Usage: .venv/bin/python bench/xid_storm.py [--rate 50000] [--seconds 60] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatchd.testing.faults import KmsgStorm  # noqa: E402

SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(text: str, name: str, label: str = "") -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in "{ ") and label in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


class Hook(BaseHTTPRequestHandler):
    messages: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        Hook.messages.append(json.loads(body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=50_000, help="lines per second")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--json", help="write the numbers here too")
    args = ap.parse_args()

    hook = ThreadingHTTPServer(("127.0.0.1", free_port()), Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    work = Path(tempfile.mkdtemp(prefix="xid-storm-"))
    kmsg = work / "kmsg"
    kmsg.touch()
    port = free_port()
    cfg = work / "gpuwatchd.yaml"
    cfg.write_text(
        f"""node_name: storm-node
state_dir: {work / "state"}
poll: {{interval: 1s, call_timeout: 500ms}}
sources: {{kernel_log: kmsg, kmsg_path: {kmsg}, nvml_events: false}}
rules: {{files: []}}
receivers:
  - {{name: ops, type: webhook, url: "http://127.0.0.1:{hook.server_port}/hook"}}
routing: {{group_wait: 1s}}
web: {{rate_limit: 0}}
"""
    )
    url = f"http://127.0.0.1:{port}"
    log = (work / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatchd", "run", "-c", str(cfg), "--listen", f"127.0.0.1:{port}",
         "--backend", f"scenario:{SCENARIO}"],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )  # fmt: skip

    def scrape() -> str:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                scrape()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the daemon did not start") from None
                time.sleep(0.1)
        time.sleep(2.0)
        rss_before = rss_kib(proc.pid)
        storm = KmsgStorm(str(kmsg), args.rate, args.seconds).start()
        start = time.monotonic()
        rss_peak = rss_before
        timeline = []
        while storm.alive():
            time.sleep(1.0)
            rss_peak = max(rss_peak, rss_kib(proc.pid))
            timeline.append(
                (round(time.monotonic() - start, 1),
                 metric(scrape(), "gpuwatchd_kernel_log_lines_total", 'source="kmsg"'),
                 rss_kib(proc.pid))
            )  # fmt: skip
        storm.join()
        while metric(scrape(), "gpuwatchd_kernel_log_lines_total", 'source="kmsg"') < storm.lines:
            if time.monotonic() - start > args.seconds + 120:
                break
            time.sleep(0.1)
        done = time.monotonic() - start
        rss_peak = max(rss_peak, rss_kib(proc.pid))
        time.sleep(3.0)
        text = scrape()
        incidents = {
            (a["labels"]["alertname"], a["labels"].get("gpu", ""), a["startsAt"])
            for m in Hook.messages
            for a in m["alerts"]
        }
        out = {
            "machine": f"{platform.node()} ({os.cpu_count()} CPUs), "
            f"Python {platform.python_version()}",
            "target_rate": args.rate,
            "seconds": args.seconds,
            "lines_written": storm.lines,
            "writer_behind_max_s": round(storm.behind, 3),
            "lines_handled": metric(text, "gpuwatchd_kernel_log_lines_total", 'source="kmsg"'),
            "handled_per_s": round(storm.lines / done),
            "caught_up_after_writer_s": round(done - storm.elapsed, 2),
            "xid_lines_written": storm.xid_total,
            "xid_lines_counted": metric(text, "gpuwatchd_kernel_log_xid_lines_total"),
            "xid_incidents_counted": metric(text, "gpuwatchd_xid_errors_total"),
            "xid_duplicates_folded": metric(text, "gpuwatchd_xid_duplicates_total"),
            "rss_before_mib": round(rss_before / 1024, 1),
            "rss_peak_mib": round(rss_peak / 1024, 1),
            "rss_after_mib": round(rss_kib(proc.pid) / 1024, 1),
            "incidents": len(incidents),
            "pages": len({i for i in incidents if i[0] == "GpuXidFatal"}),
            "messages": len(Hook.messages),
            "timeline_s_lines_rsskib": timeline,
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        log.close()
        hook.shutdown()
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
