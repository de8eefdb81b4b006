#!/usr/bin/env python3
"""How many series one 8-GPU node exports, and what a Prometheus pays for them.

1. Series per node: runs the real pipeline (``simulate``) over
   scenarios/healthy-8xh100.yaml (8 H100 SXM, 18 NVLink links each) with every
   combination of ``metrics.per_link`` and ``metrics.dcgm_compat`` and counts the samples
   of the final exposition.
2. ``--prometheus N``: the Debian Prometheus server scrapes that exposition as N distinct
   nodes (one local HTTP server, N targets told apart by a ``node`` label) and reports head
   series and memory, minus an idle baseline: bytes per active series on this machine.

    python3 bench/fleet_series.py                    # the table (seconds)
    python3 bench/fleet_series.py --prometheus 200   # + memory per series (~1 minute)

Results are written up in docs/fleet.md.
"""

from __future__ import annotations

import argparse
import gzip
import http.server
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpuwatchd.configfile.loader import load_config  # noqa: E402
from gpuwatchd.harness.simulate import run_simulation  # noqa: E402
from gpuwatchd.scenario.model import load_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"


def exposition(per_link: bool, dcgm: bool, workdir: Path) -> str:
    cfg = workdir / f"c-{per_link}-{dcgm}.yaml"
    cfg.write_text(
        f"metrics:\n  per_link: {str(per_link).lower()}\n  dcgm_compat: {str(dcgm).lower()}\n"
    )
    out = workdir / f"m-{per_link}-{dcgm}.txt"
    run_simulation(
        load_scenario(str(SCENARIO)),
        load_config(str(cfg), must_exist=True),
        io.StringIO(),
        include_samples=False,
        metrics_out=str(out),
    )
    return out.read_text()


def samples(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def table(workdir: Path) -> dict[tuple[bool, bool], str]:
    bodies = {}
    print("| per_link | dcgm_compat | series | families | bytes | gzip bytes |")
    print("|---|---|---:|---:|---:|---:|")
    for per_link in (True, False):
        for dcgm in (False, True):
            text = exposition(per_link, dcgm, workdir)
            bodies[(per_link, dcgm)] = text
            fams = sum(1 for line in text.splitlines() if line.startswith("# TYPE "))
            raw = text.encode()
            print(
                f"| {str(per_link).lower()} | {str(dcgm).lower()} | {len(samples(text))} | "
                f"{fams} | {len(raw)} | {len(gzip.compress(raw))} |"
            )
    return bodies


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def own_metric(port: int, name: str) -> float:
    """A value from Prometheus' own /metrics (it does not scrape itself here)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def targets_up(port: int) -> int:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "sum(up)"})
    with urllib.request.urlopen(url, timeout=5) as resp:
        result = json.load(resp)["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


def prometheus_cost(body: str, nodes: int, workdir: Path) -> None:
    payload = body.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    target = f"127.0.0.1:{server.server_address[1]}"

    def run(n: int) -> tuple[float, float, float]:
        port = free_port()
        data = workdir / f"tsdb-{n}"
        cfg = workdir / f"prometheus-{n}.yml"
        static = [{"targets": [target], "labels": {"node": f"gpu{i:05d}"}} for i in range(n)]
        cfg.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "5s"},
                    "scrape_configs": [
                        {"job_name": "gpuwatchd", "static_configs": static or [{"targets": []}]}
                    ],
                }
            )
        )
        proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={cfg}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 120
            want = n * len(samples(body))
            while True:
                time.sleep(2)
                try:
                    head = own_metric(port, "prometheus_tsdb_head_series")
                except OSError:
                    head = 0.0
                if head >= want or time.monotonic() > deadline:
                    break
            time.sleep(12)  # a few more scrapes: steady state, chunks allocated
            if n:
                print(f"  {targets_up(port)}/{n} targets up", file=sys.stderr)
            rss = own_metric(port, "process_resident_memory_bytes")
            heap = own_metric(port, "go_memstats_heap_inuse_bytes")
            return own_metric(port, "prometheus_tsdb_head_series"), rss, heap
        finally:
            proc.terminate()
            proc.wait(30)

    base = run(0)
    loaded = run(nodes)
    series = loaded[0] - base[0]
    print(f"\nPrometheus {nodes} nodes: head series {loaded[0]:.0f} (baseline {base[0]:.0f})")
    print(
        f"  RSS {loaded[1] / 2**20:.0f} MiB (baseline {base[1] / 2**20:.0f} MiB): "
        f"{(loaded[1] - base[1]) / series:.0f} bytes/series"
    )
    print(
        f"  Go heap in use {loaded[2] / 2**20:.0f} MiB (baseline {base[2] / 2**20:.0f} MiB): "
        f"{(loaded[2] - base[2]) / series:.0f} bytes/series"
    )
    server.shutdown()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prometheus", type=int, metavar="N", help="also measure N nodes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        bodies = table(workdir)
        if args.prometheus:
            prometheus_cost(bodies[(True, False)], args.prometheus, workdir)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
