"""Coverage-guided fuzzing (atheris, libFuzzer) of gpuwatchd's parsers and loaders: the XID
line parser and stream, /dev/kmsg records, and the config, rule, scenario and web config
loaders. A finding is any exception other than the documented ``ConfigError`` (loaders)
or any exception at all (parsers), a hang, or running out of memory; libFuzzer saves the
input that caused it. Not part of CI (minutes per target); results in docs/RELIABILITY.md.

    .venv/bin/pip install atheris
    .venv/bin/python bench/fuzz_atheris.py --all --seconds 60 [--json OUT]
    .venv/bin/python bench/fuzz_atheris.py rules -- -max_total_time=300   # one target
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("xid", "kmsg", "config", "rules", "scenario", "webconfig")
SEEDS = {
    "xid": [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off",
        "[  12.5] NVRM: Xid (PCI:0000:3b:00): 48, pid=12, name=python3, DBE",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress",
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    ],
    "kmsg": ["4,1234,5678901,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, y"],
    "config": [(ROOT / "packaging" / "gpuwatchd.yaml").read_text()],
    "rules": [(ROOT / "rules" / "xid.yaml").read_text(), (ROOT / "rules" / "gpu.yaml").read_text()],
    "scenario": [(ROOT / "scenarios" / "fallen-off-bus.yaml").read_text()],
    "webconfig": [
        "tls_server_config: {min_version: TLS12}\nbasic_auth_users: {a: x}\n"
        "rate_limit: {interval: 1s, burst: 5}\n"
        "http_server_config: {headers: {X-Frame-Options: deny}}\n"
    ],
}


def target(name: str) -> Callable[[bytes], None]:
    import atheris

    with atheris.instrument_imports():
        from gpuwatchd.config import yamlsrc
        from gpuwatchd.config.web import parse_web_config
        from gpuwatchd.configfile.loader import ReadContext, _build
        from gpuwatchd.core.errors import ConfigError
        from gpuwatchd.rules.loader import parse_rules
        from gpuwatchd.scenario.model import parse_scenario
        from gpuwatchd.xid.parser import XidStream, parse_kmsg_record, parse_line

    def text(data: bytes) -> str:
        return data.decode("utf-8", "replace")

    def xid(data: bytes) -> None:
        stream = XidStream()
        for line in text(data).split("\n"):
            parse_line(line)
            stream.feed(line)

    def kmsg(data: bytes) -> None:
        for line in text(data).split("\n"):
            parse_kmsg_record(line)

    def loader(fn: Callable[[str], object]) -> Callable[[bytes], None]:
        def run(data: bytes) -> None:
            with contextlib.suppress(ConfigError):
                fn(text(data))

        return run

    return {
        "xid": xid,
        "kmsg": kmsg,
        "config": loader(lambda t: _build(yamlsrc.parse(t, "f.yaml"), ReadContext({}, None), "f")),
        "rules": loader(lambda t: parse_rules(t, "f.yaml")),
        "scenario": loader(lambda t: parse_scenario(t, "f.yaml")),
        "webconfig": loader(lambda t: parse_web_config(yamlsrc.parse(t, "/tmp/f.yaml"), "/tmp/f")),
    }[name]


def fuzz_one(name: str, libfuzzer_args: list[str]) -> None:
    import atheris

    corpus = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-"))
    for i, seed in enumerate(SEEDS[name]):
        (corpus / f"seed{i}").write_text(seed)
    fn = target(name)
    sys.setrecursionlimit(3000)
    atheris.Setup([sys.argv[0], *libfuzzer_args, str(corpus)], fn)
    atheris.Fuzz()


STATS = re.compile(r"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+).*?exec/s: (\d+)")


def fuzz_all(seconds: int, out: str | None) -> int:
    results = {}
    for name in TARGETS:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{name}-run-"))
        res = subprocess.run(
            [sys.executable, __file__, name, "--",
             f"-max_total_time={seconds}", "-rss_limit_mb=2048", "-timeout=10", "-max_len=8192",
             f"-artifact_prefix={work}/"],
            capture_output=True, text=True, cwd=ROOT, check=False,
        )  # fmt: skip
        log = res.stdout + res.stderr
        m = STATS.search(log)
        crashes = sorted(p.name for p in work.iterdir())
        results[name] = {
            "seconds": seconds,
            "exit": res.returncode,
            "execs": int(m.group(1)) if m else None,
            "coverage_edges": int(m.group(2)) if m else None,
            "features": int(m.group(3)) if m else None,
            "execs_per_s": int(m.group(4)) if m else None,
            "findings": crashes,
            "finding_log": log[-3000:] if res.returncode else "",
        }
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "finding_log"}))
    if out:
        Path(out).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


def main() -> int:
    argv = sys.argv[1:]
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", nargs="?", choices=TARGETS)
    ap.add_argument("--all", action="store_true", help="every target, one after the other")
    ap.add_argument("--seconds", type=int, default=60, help="per target, with --all")
    ap.add_argument("--json", help="with --all: write the results here")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYTHONHASHSEED", "0")
    if args.all:
        return fuzz_all(args.seconds, args.json)
    if not args.target:
        ap.error("name a target or use --all")
    fuzz_one(args.target, extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())
