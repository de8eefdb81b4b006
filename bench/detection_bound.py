#!/usr/bin/env python3
"""How early can anything page on a weekly -> daily -> hourly leak? The bound, side by side
with the shipped rule, on the same seeded traces.

The traces are the backtest's own (``gpuwatchd/harness/backtest.py``, same seed, same
files), reduced to the evidence the memory rules read: the 10-minute buckets in which the
device-memory counter grew. On them, in one run:

- **oracle**: told when the daily phase began (``rise_at``), it looks once, 24 h before
  the uncorrectable error, and applies the exact conditional test of the daily phase's rate
  against the weekly phase's (events after the first one; the first one only marks where
  the activity began). Given the number of events, that test (randomised, so it spends all
  of ``alpha``) is the most powerful test of level ``alpha`` whatever the unknown baseline
  rate: no test whose false-alarm chance is ``alpha`` at every rate does better. Real
  detectors do not know when the rise came and look many times.
- **ideal**: a detector without gates: the same test, evaluated every 10 minutes, on
  every recent window of 1..7 days against all activity since the first active bucket
  (excluded), ``alpha`` split over the 7 windows (Bonferroni). Its pages on the benign
  ``trickle`` and ``step`` traces (with the shipped page's 3-day hold) are the price of
  each ``alpha``.
- **shipped**: the shipped ``GpuMemoryErrorsAccelerating`` rule (its parameters read from
  the default rules, its ``judge`` evaluated every 5 minutes like the engine does, its
  3-day hold): the share of traces paged at least 24 h before the error, and its pages on
  the benign families. ``gpuwatchd backtest`` measures the same through the whole
  pipeline; this replay skips everything but the condition, so it takes seconds.

    .venv/bin/python bench/detection_bound.py [--files 25] [--benign-files 50] [--seed 1]
                                              [-c CONFIG]

The weights of the benign families (``Family.weight``, share of a fleet's GPU-days) turn
pages per 1000 GPU-days into the fleet-weighted figure the budget is set in (<= 0.05).

The oracle's ``alpha`` is a chance per look; a detector that pages a benign GPU before
the look with chance ``a`` is a test of level ``a`` at that look, so the oracle at ``a``
bounds it. The budget as such a chance: a steady-rate benign GPU (``trickle``, ``step``:
exactly the test's null hypothesis) watched as long as a precursor is watched before its
look (from its first error to 24 h before the uncorrectable one) may be paged with chance
at most (pages per 1000 GPU-days allowed on it) x (days watched) / 1000. The bench prints
that chance and the oracle there for two allowances: the whole fleet budget spent on the
steady-rate families, and the per-family cap.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatchd.configfile.loader import default_config, load_config
from gpuwatchd.configfile.stages import for_rules
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.harness import backtest as bt
from gpuwatchd.harness.simulate import SIM_EPOCH
from gpuwatchd.rules.conditions.memory_judge import judge
from gpuwatchd.rules.conditions.memory_model import MemoryTrend
from gpuwatchd.rules.evidence import BUCKET, Activity, binomial_tail, bucket_of
from gpuwatchd.rules.loader import rules_from_settings
from gpuwatchd.rules.model import Rule

ALPHAS = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1)
FLEET_BUDGET = 0.05  # false memory pages per 1000 GPU-days, fleet-weighted (the goal)
FAMILY_CAP = 10.0  # ... and for any single benign family
IDEAL_WINDOWS = tuple(range(1, 8))  # days
POLL = 300.0  # the backtest's step: the engine looks at a quiet GPU every 5 minutes
LEAD = 24 * 3600.0  # the goal: a page at least 24 h before the error
PRECURSORS = ("leak-weekly-daily-hourly", "leak-weekly-daily-hourly-long")
BENIGN = ("trickle", "step", "heavy-episodes", "single-burst", "job-modulated", "counter-resets")
BOUND_BENIGN = ("trickle", "step")  # a steady Poisson rate: H0 of the test, exactly
COST = [0, 0.0]  # looks of the shipped rule at GPUs with errors, and their seconds
_ADD = re.compile(r"^add: \{ecc_corrected_volatile: (\d+)\}$")
_RAMP = re.compile(r"^ramp: \{field: ecc_corrected_volatile, rate: ([0-9.]+), per: 1h\}$")


@dataclass
class Replayed:
    """One trace as the memory rules see it."""

    trace: bt.Trace
    activity: Activity
    buckets: list[int] = field(default_factory=list)


def replayed(trace: bt.Trace) -> Replayed:
    """The active buckets of the device-memory counter (every bucket of a ramp that runs;
    a ``set`` of the device counter alone, as in ``sram-only``, decouples it: no activity)."""
    marks: set[int] = set()
    ramp_from: float | None = None
    decoupled = any(text.startswith("set: {ecc_corrected_volatile_dev") for _, text in trace.events)
    for t, text in sorted(trace.events):
        if decoupled:
            break
        if m := _ADD.match(text):
            if int(m.group(1)) > 0:
                marks.add(bucket_of(SIM_EPOCH + t))
        elif m := _RAMP.match(text):
            if ramp_from is not None:
                marks.update(range(bucket_of(SIM_EPOCH + ramp_from), bucket_of(SIM_EPOCH + t) + 1))
            ramp_from = t if float(m.group(1)) > 0 else None
    if ramp_from is not None:
        end = SIM_EPOCH + trace.days * bt.DAY
        marks.update(range(bucket_of(SIM_EPOCH + ramp_from), bucket_of(end)))
    act = Activity()
    for b in sorted(marks):
        act.mark(b * BUCKET)
    return Replayed(trace, act, sorted(marks))


def traces_of(name: str, seed: int, files: int) -> list[Replayed]:
    """The family's traces exactly as ``gpuwatchd backtest`` generates them."""
    family = bt.family_named(name)
    out: list[Replayed] = []
    for n in range(files):
        rng = random.Random(f"{family.name}:{seed}:{n}")
        out.extend(replayed(family.make(rng)) for _ in range(bt.GPUS))
    return out


# -- the oracle -------------------------------------------------------------------------------
def oracle_power(r: Replayed, alpha: float) -> float:
    """The chance that the randomised most powerful test pages at the single look 24 h
    before the error, knowing when the rise came (0 when nothing came before the rise)."""
    tr = r.trace
    assert tr.dbe_at is not None and tr.rise_at is not None
    look = bucket_of(SIM_EPOCH + tr.dbe_at - LEAD)
    rise = bucket_of(SIM_EPOCH + tr.rise_at)
    act = r.activity
    if not r.buckets or r.buckets[0] >= rise:
        return 0.0  # no baseline at all: a step from silence, as the benign `step`
    anchor = r.buckets[0]
    x = act.count(rise, look)
    y = act.count(anchor + 1, rise)
    n = x + y
    p0 = (look - rise) / (look - anchor - 1)
    # reject for X >= k, and with chance gamma at X = k - 1
    k = n + 1
    while k > 0 and binomial_tail(k - 1, n, p0) <= alpha:
        k -= 1
    if x >= k:
        return 1.0
    if x == k - 1:
        at = binomial_tail(k - 1, n, p0) - binomial_tail(k, n, p0)
        return (alpha - binomial_tail(k, n, p0)) / at if at > 0 else 0.0
    return 0.0


# -- the ideal detector ------------------------------------------------------------------------
def ideal_p_values(r: Replayed, until: float) -> list[tuple[float, float]]:
    """``(time, Bonferroni p)`` every 10 minutes where p < the largest alpha."""
    act = r.activity
    if not r.buckets:
        return []
    anchor = r.buckets[0]
    widths = [int(d * 86400 / BUCKET) for d in IDEAL_WINDOWS]
    k = len(widths)
    cut = max(ALPHAS) / k
    out: list[tuple[float, float]] = []
    last = bucket_of(SIM_EPOCH + until)
    for b1 in range(anchor + 2, last + 1):
        best = 1.0
        for width in widths:
            w0 = b1 - width
            if w0 <= anchor + 1:
                break  # no baseline left (the widths grow)
            x = act.count(w0, b1)
            if x == 0:
                continue
            y = act.count(anchor + 1, w0)
            p0 = width / (b1 - anchor - 1)
            if x <= (x + y) * p0:
                continue  # no rise at all: p >= 1/2
            p = binomial_tail(x, x + y, p0)
            if p < cut:
                best = min(best, p)
        if best < cut:
            out.append((b1 * BUCKET - SIM_EPOCH, best * k))
    return out


def onsets(times: Iterable[float], hold: float) -> list[float]:
    """Firing transitions of a condition true at ``times`` with ``keep_firing_for`` hold."""
    out: list[float] = []
    last: float | None = None
    for t in times:
        if last is None or t - last > hold + BUCKET:
            out.append(t)
        last = t
    return out


# -- the shipped rule --------------------------------------------------------------------------
def shipped_rule(config_path: str | None) -> Rule:
    config = load_config(config_path, must_exist=True) if config_path else default_config({})
    for rule in rules_from_settings(for_rules(config)).rules:
        c = rule.condition
        if (
            isinstance(c, MemoryTrend)
            and c.signal == "acceleration"
            and (rule.severity is AlertSeverity.PAGE or rule.drain)
        ):
            return rule  # since issue 25 the shipped one drains and opens a ticket
    raise SystemExit("no page or drain rule with memory_trend signal: acceleration")


def shipped_hits(rule: Rule, r: Replayed, until: float) -> list[float]:
    """Times (since the trace's start) at which the rule's condition holds. The engine
    looks every 5 minutes; the condition reads whole buckets, so both looks in a bucket
    agree and one look per bucket (its first) gives the same answer at half the cost."""
    c = rule.condition
    assert isinstance(c, MemoryTrend)
    if not r.buckets:
        return []
    out: list[float] = []
    t = r.buckets[0] * BUCKET - SIM_EPOCH
    looks = 0
    started = time.perf_counter()
    while t <= until:
        if judge(c, r.activity, SIM_EPOCH + t) is not None:
            out.append(t)
        t += BUCKET
        looks += 1
    COST[0] += looks
    COST[1] += time.perf_counter() - started
    return out


# -- the run -----------------------------------------------------------------------------------
def deadline(r: Replayed) -> float:
    """24 h before the trace's uncorrectable error."""
    assert r.trace.dbe_at is not None
    return r.trace.dbe_at - LEAD


def weekly_counts(rs: list[Replayed]) -> dict[int, int]:
    """How many traces had 0, 1, 2, ... active buckets before the rise."""
    out: dict[int, int] = {}
    for r in rs:
        assert r.trace.rise_at is not None
        n = r.activity.count(0, bucket_of(SIM_EPOCH + r.trace.rise_at))
        out[min(n, 4)] = out.get(min(n, 4), 0) + 1
    return out


def pct(part: float, whole: int) -> str:
    return f"{100.0 * part / whole:.0f} %" if whole else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--files", type=int, default=25, help="files (8 traces each) per precursor family"
    )
    ap.add_argument(
        "--benign-files", type=int, default=50, help="files (8 traces each) per benign family"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("-c", "--config", help="a gpuwatchd config whose rules to replay")
    args = ap.parse_args()
    started = time.perf_counter()
    rule = shipped_rule(args.config)
    hold = rule.keep_firing_for
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}; seed {args.seed}, {args.files} files "
        f"({args.files * bt.GPUS} traces) per precursor family, {args.benign_files} per benign"
    )
    print(f"shipped rule: {rule.name}: {rule.condition}")
    for name in PRECURSORS:
        rs = traces_of(name, args.seed, args.files)
        n = len(rs)
        counts = weekly_counts(rs)
        print(f"\n== {name} ({n} traces): a page >= 24 h before the error")
        print(
            "   active buckets before the daily phase: "
            + ", ".join(
                f"{k}{'+' if k == 4 else ''}: {pct(v, n)}" for k, v in sorted(counts.items())
            )
        )
        ideal = [ideal_p_values(r, deadline(r)) for r in rs]
        print(f"   {'alpha':>8} {'oracle (1 look)':>16} {'ideal (10-min looks)':>21}")
        for a in ALPHAS:
            oracle = sum(oracle_power(r, a) for r in rs)
            hit = sum(1 for ps in ideal if any(p < a for _, p in ps))
            print(f"   {a:>8.0e} {pct(oracle, n):>16} {pct(hit, n):>21}")
        span = (
            sum((deadline(r) + SIM_EPOCH) / BUCKET - r.buckets[0] for r in rs if r.buckets)
            * BUCKET
            / 86400.0
            / n
        )
        steady = sum(bt.family_named(f).weight for f in BOUND_BENIGN)
        for what, per_1000 in (
            (
                f"the fleet budget ({FLEET_BUDGET}) spent on trickle+step alone",
                FLEET_BUDGET / steady,
            ),
            (f"the per-family cap ({FAMILY_CAP:g})", FAMILY_CAP),
        ):
            a = min(per_1000 * span / 1000.0, 1.0)
            oracle = sum(oracle_power(r, a) for r in rs)
            print(
                f"   {what}: {per_1000:.1f} pages / 1000 GPU-days over {span:.1f} days "
                f"watched = chance {a:.3f} per trace: oracle {pct(oracle, n)}"
            )
        early = 0
        leads: list[float] = []
        for r in rs:
            assert r.trace.dbe_at is not None
            hits = shipped_hits(rule, r, r.trace.dbe_at - POLL)
            if hits:
                leads.append((r.trace.dbe_at - hits[0]) / 3600)
                early += (r.trace.dbe_at - hits[0]) >= LEAD
        leads.sort()
        p50 = f"{leads[len(leads) // 2]:.1f} h" if leads else "-"
        print(
            f"   shipped rule: {pct(early, n)} >= 24 h, {pct(len(leads), n)} paged before the "
            f"error, lead p50 {p50}"
        )
    print("\n== benign: pages per 1000 GPU-days (fleet-weighted contribution: x weight)")
    header = f"   {'family':<16} {'weight':>6} " + " ".join(f"{a:>8.0e}" for a in ALPHAS)
    print(f"   ideal detector at alpha:\n{header}")
    fleet = dict.fromkeys(ALPHAS, 0.0)
    shipped_rows: list[tuple[str, float, float]] = []
    for name in BENIGN:
        family = bt.family_named(name)
        rs = traces_of(name, args.seed, args.benign_files)
        days = len(rs) * family.days
        end = family.days * bt.DAY
        if name in BOUND_BENIGN:
            ideal = [ideal_p_values(r, end) for r in rs]
            rates = []
            for a in ALPHAS:
                pages = sum(len(onsets((t for t, p in ps if p < a), hold)) for ps in ideal)
                rates.append(1000.0 * pages / days)
                fleet[a] += family.weight * rates[-1]
            print(f"   {name:<16} {family.weight:>6} " + " ".join(f"{x:>8.2f}" for x in rates))
        pages = sum(len(onsets(shipped_hits(rule, r, end), hold)) for r in rs)
        shipped_rows.append((name, family.weight, 1000.0 * pages / days))
    print(f"   {'fleet (these 2)':<16} {'':>6} " + " ".join(f"{fleet[a]:>8.3f}" for a in ALPHAS))
    print("   shipped rule (same traces):")
    total = 0.0
    for name, weight, rate in shipped_rows:
        total += weight * rate
        print(f"   {name:<16} {weight:>6} {rate:>8.2f}")
    print(f"   {'fleet (these 6)':<16} {'':>6} {total:>8.3f}")
    print(
        f"\nshipped rule's cost at GPUs with errors: {COST[1] / max(COST[0], 1) * 1e6:.1f} us "
        f"per look (judge() alone, {COST[0]} looks)"
    )
    print(f"\n{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
