"""Where the daemon's memory goes, next to a bare pynvml process: RSS per mapping
(/proc/PID/smaps) and the modules the daemon loaded. A diagnostic for the RSS goal of
bench/real_cost.py; prints JSON.

    PYTHONPATH=. python3 bench/real_cost.py ...   # the goal
    PYTHONPATH=. python3 bench/rss_breakdown.py --out "$OUT"   # why
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from real_cost import BARE, child, compile_package

ROOT = Path(__file__).resolve().parent.parent

PROBE = r"""
import json, os, sys, threading, time
out, argv = sys.argv[1], sys.argv[2:]
def probe():
    time.sleep(15)
    with open(out, "w") as fh:
        json.dump(sorted(sys.modules), fh)
threading.Thread(target=probe, daemon=True).start()
from gpuwatchd.cli.main import main
sys.exit(main(argv))
"""


def mappings(pid: int) -> dict[str, int]:
    """KiB of RSS per mapped file ([anon], [heap], [stack] included)."""
    agg: collections.Counter[str] = collections.Counter()
    current = "[anon]"
    with open(f"/proc/{pid}/smaps", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            parts = line.split()
            if parts and "-" in parts[0] and not parts[0].endswith(":"):
                current = parts[5] if len(parts) > 5 else "[anon]"
            elif parts and parts[0] == "Rss:":
                agg[current] += int(parts[1])
    return dict(agg.most_common())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--config", default="poll:\n  interval: 1s\n")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the gpuwatchd tree to measure")
    ap.add_argument("--no-compile", action="store_true", help="leave the tree uncompiled")
    args = ap.parse_args()
    tree = args.tree.resolve()
    if not args.no_compile:
        compile_package(tree)
    work = Path(tempfile.mkdtemp(prefix="gpuwatchd-rss-"))
    (work / "gpuwatchd.yaml").write_text(f"state_dir: {work}/state\n{args.config}")
    modules = work / "modules.json"
    argv = ["run", "-c", str(work / "gpuwatchd.yaml"), "--listen", "127.0.0.1:0"]
    # set as `run` would set it by re-executing itself (which would drop the probe)
    env = {**os.environ, "MALLOC_ARENA_MAX": "1", "PYTHONPATH": str(tree)}
    daemon = subprocess.Popen([sys.executable, "-c", PROBE, str(modules), *argv], cwd=tree, env=env)
    bare = child(BARE)
    deadline = time.monotonic() + 60
    while not modules.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)
    result = {
        "daemon": mappings(daemon.pid),
        "bare": mappings(bare.pid),
        "modules": json.loads(modules.read_text()) if modules.exists() else None,
    }
    total = {k: sum(v.values()) for k, v in result.items() if k != "modules"}
    names = set(result["daemon"]) | set(result["bare"])
    diff = {n: result["daemon"].get(n, 0) - result["bare"].get(n, 0) for n in names}
    top = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:25]
    print("RSS KiB", json.dumps(total))
    for name, kib in top:
        print(f"{kib:+8d} KiB  {name}")
    mods = result["modules"] or []
    print(len(mods), "modules;", " ".join(m for m in mods if not m.startswith("gpuwatchd")))
    name = f"rss_breakdown-{tree.name}{'-nocompile' if args.no_compile else ''}.json"
    with open(os.path.join(args.out, name), "w") as fh:
        json.dump(result, fh, indent=1)
    for proc in (daemon, bare):
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
