#!/usr/bin/env python3
"""XID parser throughput on a mixed kernel log, and its memory over a long stream.

The input is built from real lines only: the non-XID lines of the kernel logs captured on a
lent H200 (tests/data/xid_capture_h200_*: dmesg, -T, --decode, ISO, -r and /dev/kmsg
records) and the XID/SXid/fallen-off-the-bus lines of tests/data/xid_lines.tsv, shuffled
with a fixed seed. The default mix is an XID storm: 10% of 100,000 lines are reports.

    .venv/bin/python bench/xid_parse.py [--lines 100000] [--xid-share 0.1] [--repeat 5]

Prints lines per second (best of --repeat runs, one core) for:
  parse_line      the stateless parser alone
  XidStream.feed  what a source does per line (UUID lines, multi-line printk, parse)
  xid parse       XidStream + catalog verdict + JSON encoding, as ``gpuwatchd xid parse``
and the peak traced memory of streaming 10x more lines than the timed run, to show that
memory does not grow with input. The issue's goal is >= 50,000 lines/s.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from gpuwatchd.xid import Catalog, XidStream, parse_line

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"


def real_lines() -> tuple[list[str], list[str]]:
    """(non-XID lines, XID lines), all taken from the repository's real captures."""
    noise: list[str] = []
    for path in sorted(DATA.glob("xid_capture_h200_*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip() and parse_line(line) is None:
                noise.append(line)
    with (DATA / "xid_lines.tsv").open(encoding="utf-8", newline="") as f:
        rows = csv.DictReader(
            (line for line in f if not line.startswith("#")), delimiter="\t", quoting=csv.QUOTE_NONE
        )
        xids = [r["line"] for r in rows if r["expected"] != "null"]
    return noise, xids


def mixed(noise: list[str], xids: list[str], n: int, share: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [rng.choice(xids) if rng.random() < share else rng.choice(noise) for _ in range(n)]


def best_rate(work: Callable[[list[str]], int], lines: list[str], repeat: int) -> tuple[float, int]:
    best = float("inf")
    found = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        found = work(lines)
        best = min(best, time.perf_counter() - t0)
    return len(lines) / best, found


def run_parse_line(lines: list[str]) -> int:
    return sum(1 for line in lines if parse_line(line) is not None)


def run_stream(lines: Iterable[str]) -> int:
    stream = XidStream()
    return sum(1 for line in lines if stream.feed(line) is not None)


def run_cli(lines: list[str]) -> int:
    catalog = Catalog.default()
    stream = XidStream()
    out = 0
    for line in lines:
        found = stream.feed(line)
        if found is not None:
            verdict = catalog.classify(found.xid, found.message, found.kind)
            record = found.as_dict()
            record["severity"] = verdict.severity.value
            record["action"] = verdict.action.value
            json.dumps(record)
            out += 1
    return out


def peak_memory(noise: list[str], xids: list[str], n: int, share: float) -> int:
    """Peak traced bytes while streaming ``n`` generated lines through XidStream."""

    def generate() -> Iterator[str]:
        rng = random.Random(7)
        for _ in range(n):
            yield rng.choice(xids) if rng.random() < share else rng.choice(noise)

    tracemalloc.start()
    run_stream(generate())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--lines", type=int, default=100_000)
    ap.add_argument("--xid-share", type=float, default=0.10)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    noise, xids = real_lines()
    storm = mixed(noise, xids, args.lines, args.xid_share, seed=1)
    quiet = mixed(noise, xids, args.lines, 0.0, seed=2)
    print(f"python {platform.python_version()} on {platform.machine()}, one core")
    print(f"corpus: {len(set(noise))} distinct non-XID lines, {len(set(xids))} XID lines (real)")
    print(f"input: {args.lines} lines, {args.xid_share:.0%} XID reports; best of {args.repeat}")
    print()
    print(f"{'what':<34}{'lines/s':>12}{'reports':>10}")
    for label, work, lines in (
        ("parse_line, XID storm", run_parse_line, storm),
        ("XidStream.feed, XID storm", run_stream, storm),
        ("xid parse (+verdict, JSON), storm", run_cli, storm),
        ("parse_line, no XIDs", run_parse_line, quiet),
        ("XidStream.feed, no XIDs", run_stream, quiet),
    ):
        rate, found = best_rate(work, lines, args.repeat)
        print(f"{label:<34}{rate:>12,.0f}{found:>10}")
    print()
    for n in (args.lines, args.lines * 10):
        peak = peak_memory(noise, xids, n, args.xid_share)
        print(f"peak traced memory streaming {n:>9,} lines: {peak / 1024:8.1f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
