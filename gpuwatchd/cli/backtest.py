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
from collections.abc import Callable

from gpuwatchd.configfile.loader import Config, default_config, load_config
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
        "clock, and print per family: share paged, lead time before the uncorrectable "
        "error, share drained a day ahead, false pages and false drains per 1000 GPU-days, "
        "and the fleet-weighted rates (5 %% and 1 %% of GPU-days error-active).",
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
        "--from-state",
        metavar="DIR",
        action="append",
        help="instead: report on nodes' own history, read from their state directories (or "
        "rules.sqlite3 files; repeatable): uncorrectable memory errors preceded by a memory "
        "page >= 1 h or a drain >= 24 h before, and memory pages no such error followed "
        "within 90 days; exact from the state's memory ledger, a floor where there is none "
        "(docs/DETECTION.md)",
    )
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
    if args.from_state:
        return _from_state(args.from_state, config, args.json)
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
            f"{'family':30} {'traces':>6} {'paged':>6} {'p50':>7} {'>=24h':>6} {'>=6h':>6} "
            f"{'>=1h':>6} {'drain>=24h':>10} {'any>=6h':>8} {'pages/1k':>8} {'drains/1k':>9} "
            f"{'tickets/mo':>10}"
        )
    show = _Progress(len(families)) if sys.stderr.isatty() else None
    for k, fam in enumerate(families, 1):
        step = show.step(k, fam.name) if show is not None else None
        score = bt.run_family(fam, args.seed, args.files, config, step)
        if show is not None:
            show.clear()
        scores.append(score)
        row = score.row()
        if args.json:
            print(json.dumps(row))
            continue
        print(
            f"{fam.name:30} {row['traces']:>6} {_cell(row.get('detected'), '%'):>6} "
            f"{_cell(row.get('lead_p50_h'), 'h'):>7} "
            f"{_cell(row.get('share_lead_24h'), '%'):>6} {_cell(row.get('share_lead_6h'), '%'):>6} "
            f"{_cell(row.get('share_lead_1h'), '%'):>6} "
            f"{_cell(row.get('share_drain_24h'), '%'):>10} "
            f"{_cell(row.get('share_action_6h'), '%'):>8} "
            f"{row['false_pages_per_1000_gpu_days']:>8.2f} "
            f"{row['false_drains_per_1000_gpu_days']:>9.2f} "
            f"{row['tickets_per_ticketed_gpu_month']:>10.2f}"
        )
        if row["node_tickets_per_node_month"]:
            print(
                f"{'':30} node tickets per node-month: {row['node_tickets_per_node_month']:.2f}; "
                f"GPUs with a ticket of their own: {_cell(row['ticketed_gpu_share'], '%')}"
            )
        if "within_1h_of_corroboration" in row:
            print(
                f"{'':30} paged within 1 h of the certificate: "
                f"{_cell(row['within_1h_of_corroboration'], '%')}"
            )
    fleet = {
        share: (
            bt.fleet_false_per_1000(scores, share),
            bt.fleet_false_drains_per_1000(scores, share),
        )
        for share in (bt.ERROR_ACTIVE, 0.01)
    }
    if args.json:
        print(
            json.dumps(
                {
                    "fleet_false_pages_per_1000_gpu_days": round(fleet[bt.ERROR_ACTIVE][0], 4),
                    "fleet_false_drains_per_1000_gpu_days": round(fleet[bt.ERROR_ACTIVE][1], 4),
                    "fleet_1pct_false_pages_per_1000_gpu_days": round(fleet[0.01][0], 4),
                    "fleet_1pct_false_drains_per_1000_gpu_days": round(fleet[0.01][1], 4),
                    "fleet_false_drains_per_1000_gpu_days_by_rule": {
                        rule: round(v, 4)
                        for rule, v in bt.fleet_false_drains_by_rule(scores).items()
                    },
                }
            )
        )
    else:
        for share, (pages, drains) in fleet.items():
            print(
                f"fleet-weighted, {share:.0%} of GPU-days error-active: false pages {pages:.3f}, "
                f"false drains {drains:.3f} per 1000 GPU-days"
            )
        by_rule = bt.fleet_false_drains_by_rule(scores)
        if by_rule:
            print(
                f"false drains by rule ({bt.ERROR_ACTIVE:.0%}): "
                + ", ".join(f"{rule} {v:.3f}" for rule, v in by_rule.items())
            )
        print(
            f"(benign families at their fleet shares; the rest of the GPU-days without corrected "
            f"errors); {time.perf_counter() - started:.0f} s"
        )
    return 0


class _Progress:
    """Per-family progress on a terminal (stderr), one line rewritten in place with a
    carriage return (no escape sequences, so ``TERM=dumb`` is fine); cleared before the
    family's row is printed, so the table on stdout stays as it is."""

    def __init__(self, families: int) -> None:
        self.families = families
        self.width = 0
        self.started = time.monotonic()

    def step(self, k: int, name: str) -> Callable[[int, int], None]:
        self._write(f"backtest: family {k}/{self.families} {name}: starting")

        def done(files_done: int, files: int) -> None:
            elapsed = time.monotonic() - self.started
            self._write(
                f"backtest: family {k}/{self.families} {name}: file {files_done}/{files} "
                f"({elapsed:.0f} s)"
            )

        return done

    def _write(self, text: str) -> None:
        pad = max(self.width - len(text), 0)
        sys.stderr.write("\r" + text + " " * pad)
        sys.stderr.flush()
        self.width = len(text)

    def clear(self) -> None:
        sys.stderr.write("\r" + " " * self.width + "\r")
        sys.stderr.flush()
        self.width = 0


def _from_state(paths: list[str], config: Config, as_json: bool) -> int:
    from gpuwatchd.harness.field_report import field_report, render

    try:
        report = field_report(paths, config)
    except OSError as exc:
        print(f"gpuwatchd backtest: {exc}", file=sys.stderr)
        return 1
    for warning in report.warnings:
        print(f"gpuwatchd backtest: warning: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(report.row()))
    else:
        for line in render(report):
            print(line)
    return 0


def _cell(value: object, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "%":
        return f"{float(value) * 100:.0f}%"  # type: ignore[arg-type]
    return f"{value}{unit}"
