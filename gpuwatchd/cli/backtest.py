"""``gpuwatchd backtest``: score the memory rules on seeded scenario families.

``add_parser(subparsers)`` registers the command; docs/DETECTION.md explains the families,
the scores and the shipped defaults.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

from gpuwatchd.config.loader import default_config, load_config
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.health import EXIT_USAGE
from gpuwatchd.harness import backtest as bt


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "backtest",
        help="score the memory rules on labelled, seeded scenario families",
        description="Expand each scenario family into seeded traces (8 GPUs x 30 days per "
        "file; 56 days for the long leak), play them through the real pipeline on a virtual "
        "clock, and print per family: share detected, lead time before the uncorrectable "
        "error (p10/p50), false pages per 1000 GPU-days, and the fleet-weighted false-page "
        "rate.",
    )
    p.add_argument("-c", "--config", metavar="FILE", help="use this config's rules")
    p.add_argument(
        "--family",
        action="append",
        choices=[f.name for f in bt.FAMILIES],
        help="only this family (repeatable; default: all)",
    )
    p.add_argument("--files", type=int, default=2, help="scenario files per family (default 2)")
    p.add_argument("--seed", type=int, default=1, help="seed of the traces (default 1)")
    p.add_argument("--json", action="store_true", help="one JSON object per family")
    p.add_argument(
        "--write-scenarios",
        metavar="DIR",
        help="also write the generated scenario files (the scenario format) into DIR",
    )
    p.set_defaults(func=cmd_backtest)
    return p


def cmd_backtest(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config, must_exist=True) if args.config else default_config({})
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return 1
    if args.files < 1:
        print("gpuwatchd backtest: --files must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    logging.disable(logging.WARNING)
    families = [bt.family_named(n) for n in args.family] if args.family else list(bt.FAMILIES)
    if args.write_scenarios:
        os.makedirs(args.write_scenarios, exist_ok=True)
        for fam in families:
            for n, (text, _) in enumerate(bt.generate(fam, args.seed, args.files)):
                name = os.path.join(args.write_scenarios, f"{fam.name}-{args.seed}-{n}.yaml")
                with open(name, "w", encoding="utf-8") as fh:
                    fh.write(text)
    scores = []
    started = time.perf_counter()
    if not args.json:
        print(
            f"{'family':26} {'traces':>6} {'detected':>8} {'lead p10':>8} {'lead p50':>8} "
            f"{'>=24h':>6} {'>=6h':>6} {'false/1000':>10}"
        )
    for fam in families:
        score = bt.run_family(fam, args.seed, args.files, config)
        scores.append(score)
        row = score.row()
        if args.json:
            print(json.dumps(row))
            continue
        print(
            f"{fam.name:26} {row['traces']:>6} {_cell(row.get('detected'), '%'):>8} "
            f"{_cell(row.get('lead_p10_h'), 'h'):>8} {_cell(row.get('lead_p50_h'), 'h'):>8} "
            f"{_cell(row.get('share_lead_24h'), '%'):>6} {_cell(row.get('share_lead_6h'), '%'):>6} "
            f"{row['false_pages_per_1000_gpu_days']:>10.2f}"
        )
        if "within_1h_of_corroboration" in row:
            print(
                f"{'':26} paged within 1 h of the corroborating event: "
                f"{_cell(row['within_1h_of_corroboration'], '%')}"
            )
    fleet = bt.fleet_false_per_1000(scores)
    if args.json:
        print(json.dumps({"fleet_false_pages_per_1000_gpu_days": round(fleet, 4)}))
    else:
        print(
            f"fleet-weighted false memory pages: {fleet:.3f} per 1000 GPU-days "
            f"(benign families at their fleet shares, {bt.HEALTHY_WEIGHT:.0%} of GPU-days "
            f"without corrected errors); {time.perf_counter() - started:.0f} s"
        )
    return 0


def _cell(value: object, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{float(value) * 100:.0f}%"  # type: ignore[arg-type]
    return f"{value}{unit}"
