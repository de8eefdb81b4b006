"""Loading many rule files: libyaml's event parser against PyYAML's, side by side.

Issue 15 measured 11.5 s to check or reload 10,000 rule files; most of it was the alias
check (``gpuwatchd.config.yamlsrc.check_expansion``) parsing every file a second time in
pure Python. This writes N small rule files to a temporary directory and loads them with
``load_rule_set`` twice, once with each event parser, alternating, and prints the times
and their ratio.

    .venv/bin/python bench/rule_files.py             # 10,000 files, 3 rounds
    .venv/bin/python bench/rule_files.py --files 2000 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import yaml

from gpuwatchd.config import yamlsrc
from gpuwatchd.rules import loader

RULE = """rules:
- name: R{i}
  severity: page
  condition:
    threshold: {{field: temperature_gpu, op: '>', value: 85}}
  annotations: {{summary: 'GPU {{gpu}} at {{value:.0f}} C'}}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if not getattr(yaml, "__with_libyaml__", False):
        raise SystemExit("PyYAML here has no libyaml: nothing to compare")
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-bench-rules-") as d:
        for i in range(args.files):
            with open(os.path.join(d, f"r{i:05d}.yaml"), "w", encoding="utf-8") as fh:
                fh.write(RULE.format(i=i))
        times: dict[str, list[float]] = {"libyaml": [], "pure Python": []}
        for _ in range(args.rounds):
            for name, event_loader in (
                ("libyaml", yaml.CSafeLoader),
                ("pure Python", yaml.SafeLoader),
            ):
                yamlsrc._EVENT_LOADER = event_loader
                start = time.perf_counter()
                rules = loader.load_rule_set([os.path.join(d, "*.yaml")], defaults=False)
                times[name].append(time.perf_counter() - start)
                assert len(rules.rules) == args.files
        best = {name: min(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"{name:12s} best {best[name]:6.2f} s  all {', '.join(f'{x:.2f}' for x in t)}")
        print(f"ratio pure Python / libyaml: {best['pure Python'] / best['libyaml']:.2f}")


if __name__ == "__main__":
    main()
