#!/usr/bin/env python3
"""What one node's scrape weighs, plain and gzip, and what that is for a fleet.

Runs the real pipeline (``Simulation``) over scenarios/healthy-8xh100.yaml (8 H100 SXM,
18 NVLink links each, a day at one poll a minute) for every combination of
``metrics.per_link`` and ``metrics.dcgm_compat`` and takes the body the daemon serves
(``MetricsRenderer``, the ``process_*`` lines included), in the text format and in
OpenMetrics, plain and gzip-compressed as served to ``Accept-Encoding: gzip``. Prints:

1. series (samples) and bytes per scrape, gzip bytes, and the ratios plain/gzip and
   dcgm_compat/default;
2. the series per family group for the default settings;
3. the time a scrape takes in-process (p50): plain from the cache, gzip between two polls
   (cached: only the fresh ``process_*`` tail is compressed) and gzip after a new poll
   (the node's body compressed once);
4. the traffic of one 15 s round at 10,000 nodes.

    python3 bench/scrape_size.py [--renders 200] [--daemon]

``--daemon`` also starts ``gpuwatchd run`` on the scenario and scrapes it over HTTP with
Prometheus 2.42's headers and plainly (its own HTTP and actions counters included).

Results are written up in docs/fleet.md ("How many series one node exports").
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gpuwatchd.configfile.loader import load_config  # noqa: E402
from gpuwatchd.harness.simulate import Simulation  # noqa: E402
from gpuwatchd.scenario.model import load_scenario  # noqa: E402

SCENARIO = ROOT / "scenarios" / "healthy-8xh100.yaml"
FLEET = 10_000
ROUND = 15.0  # seconds between two scrapes of a node
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
    "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


def simulation(per_link: bool, dcgm: bool, workdir: Path) -> Simulation:
    cfg = workdir / f"c-{per_link}-{dcgm}.yaml"
    cfg.write_text(
        "node_name: gpu-a001\n"
        f"metrics:\n  per_link: {str(per_link).lower()}\n  dcgm_compat: {str(dcgm).lower()}\n"
    )
    sim = Simulation(
        load_scenario(str(SCENARIO)), load_config(str(cfg), must_exist=True, environ={})
    )
    sim.run()
    return sim


def samples(text: bytes) -> list[bytes]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith(b"#")]


def p50_us(fn: Callable[[], object], n: int, before: Callable[[], None] | None = None) -> float:
    times = []
    for _ in range(n):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


GROUPS = (
    (
        "per-link NVLink (per_link)",
        (
            "gpuwatchd_nvlink_up",
            "gpuwatchd_nvlink_replay_errors",
            "gpuwatchd_nvlink_recovery_errors",
            "gpuwatchd_nvlink_crc_errors",
        ),
    ),
    ("alert rules (at 0 from start-up)", ("gpuwatchd_alert", "gpuwatchd_rule")),
    ("clock-event reasons", ("gpuwatchd_clock_event_reason_active",)),
    ("GPU health and status state sets", ("gpuwatchd_gpu_health", "gpuwatchd_gpu_status")),
    ("DCGM_FI_* (dcgm_compat)", ("DCGM_FI_",)),
    ("process_* (the daemon itself)", ("process_",)),
    ("actions, HTTP, sources, node", ("gpuwatchd_",)),
)  # first match wins; per-GPU fields are counted apart below


def group_of(line: bytes, per_gpu: bool) -> str:
    name = line.split(b"{", 1)[0].split(b" ", 1)[0].decode()
    for label, prefixes in GROUPS[:-1]:
        if name.startswith(prefixes):
            return label
    if per_gpu:
        return "other per-GPU fields (ECC, temperatures, power, clocks, PCIe, memory, ...)"
    return GROUPS[-1][0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=200, help="scrapes timed per variant")
    parser.add_argument("--daemon", action="store_true", help="also scrape `gpuwatchd run`")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        print("| per_link | dcgm_compat | format | series | bytes | gzip bytes | plain/gzip |")
        print("|---|---|---|---:|---:|---:|---:|")
        for per_link in (True, False):
            for dcgm in (False, True):
                sim = simulation(per_link, dcgm, Path(tmp))
                r = sim.renderer
                for fmt, render in (("text", r.render), ("openmetrics", r.render_openmetrics)):
                    plain, packed = render(), render(gzip=True)
                    rows[(per_link, dcgm, fmt)] = (len(samples(plain)), len(plain), len(packed))
                    print(
                        f"| {str(per_link).lower()} | {str(dcgm).lower()} | {fmt} | "
                        f"{len(samples(plain)):,} | {len(plain):,} | {len(packed):,} | "
                        f"{len(plain) / len(packed):.1f} |"
                    )
                if per_link and not dcgm:
                    default = sim
        base = rows[(True, False, "text")]
        dcgm_row = rows[(True, True, "text")]
        print(
            f"\ndcgm_compat/default: series {dcgm_row[0] / base[0]:.2f}, bytes "
            f"{dcgm_row[1] / base[1]:.2f}, gzip bytes {dcgm_row[2] / base[2]:.2f}"
        )
        off = rows[(False, False, "text")]
        print(f"per_link off/on: series {off[0] / base[0]:.2f}, gzip bytes {off[2] / base[2]:.2f}")

        body = default.renderer.render()
        gpus = {f'gpu="{i}"'.encode() for i in range(8)}
        groups: Counter[str] = Counter()
        for line in samples(body):
            groups[group_of(line, any(g in line for g in gpus))] += 1
        total = sum(groups.values())
        print(f"\nseries by group (defaults, {total:,} in all):")
        for label, n in groups.most_common():
            print(f"  {n:5,}  {100 * n / total:4.1f} %  {label}")

        r = default.renderer

        def new_poll() -> None:
            default.step()

        print(f"\nin-process scrape, p50 of {args.renders} (text; openmetrics):")
        for fmt, render in (("text", r.render), ("openmetrics", r.render_openmetrics)):
            render()
            cached = p50_us(render, args.renders)
            gz_cached = p50_us(lambda: render(gzip=True), args.renders)  # noqa: B023
            gz_new = p50_us(lambda: render(gzip=True), args.renders // 4, new_poll)  # noqa: B023
            plain_new = p50_us(render, args.renders // 4, new_poll)
            print(
                f"  {fmt:11}: plain cached {cached:5.0f} us, after a poll {plain_new:5.0f} us;"
                f" gzip cached {gz_cached:5.0f} us, after a poll {gz_new:5.0f} us"
            )

        print(f"\n{FLEET:,} nodes, one scrape each per {ROUND:g} s (default settings):")
        for fmt in ("text", "openmetrics"):
            _, plain_b, gz_b = rows[(True, False, fmt)]
            print(
                f"  {fmt:11}: {plain_b * FLEET / 1e9:.2f} GB plain, "
                f"{gz_b * FLEET / 1e6:.0f} MB gzip per round ({plain_b / gz_b:.0f}x less)"
            )
    if args.daemon:
        daemon_scrape()
    return 0


def daemon_scrape() -> None:
    """``gpuwatchd run`` on the scenario, scraped as Prometheus does and plainly."""
    from benchlib import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuwatchd",
                "run",
                "--listen",
                f"127.0.0.1:{port}",
                "--backend",
                f"scenario:{SCENARIO}",
            ],
            env={**os.environ, "STATE_DIRECTORY": state, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                        break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            time.sleep(2.0)  # a few polls
            print("\n`gpuwatchd run` (scenario backend, just started), one scrape each:")
            for name, headers in (
                ("text, plain", {}),
                ("text, gzip", {"Accept-Encoding": "gzip"}),
                (
                    "Prometheus 2.42's headers",
                    {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"},
                ),
            ):
                req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers=headers)
                with urllib.request.urlopen(req, timeout=5) as resp:
                    raw = resp.read()
                    encoding = resp.headers.get("Content-Encoding") or "identity"
                body = gzip.decompress(raw) if encoding == "gzip" else raw
                print(
                    f"  {name:27}: {len(samples(body)):,} series, {len(raw):,} bytes ({encoding})"
                )
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    sys.exit(main())
