#!/usr/bin/env python3
"""The cost of one look of the memory rules at one GPU, by how much history it has.

A look is ``memory_trend.judge`` for the shipped ``GpuMemoryErrorsAccelerating`` (the
rate test on its 1-day and 3-day windows and its change-point scan in whole days) and for
the activity part of the corroborated rule (which the engine runs on every poll): what the
engine spends per GPU per look once the counter history is in memory. Each GPU history has
N active 10-minute buckets in one regime over the last 29 days (N = 0, 1000, 2000; a steady
trickle and a rising one), and the looks walk through its last day every 5 minutes, as the
periodic evaluation does.

"before" is the regime bookkeeping as it was up to commit 601502f (``NaiveActivity``
below: the regime start found by walking back through the whole history, the episodes
and the peak counted bucket by bucket, every look); "after" is ``rules/evidence.py`` now
(running counts, per-``quiet`` regime breaks, a peak extended as the regime grows). Both
read the same buckets and must agree on every verdict (checked here on every look).

    .venv/bin/python bench/memory_look_cost.py [--looks 288] [--repeat 5]
"""

from __future__ import annotations

import argparse
import bisect
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatchd.rules.conditions.memory_trend import JudgeMemo, MemoryTrend, judge
from gpuwatchd.rules.evidence import BUCKET, EPISODE_GAP, Activity

DAY = 86400.0
T_END = 1_767_225_600.0 + 40 * DAY


class NaiveActivity(Activity):
    """The bookkeeping before: every question walks the buckets it covers."""

    __slots__ = ()

    def episodes(self, b0: int, b1: int, gap: int = EPISODE_GAP) -> int:
        buckets = self.buckets
        lo = bisect.bisect_left(buckets, b0)
        hi = bisect.bisect_left(buckets, b1)
        n = 0
        prev: int | None = None
        for i in range(lo, hi):
            b = buckets[i]
            if prev is None or b - prev > gap:
                n += 1
            prev = b
        return n

    def regime_start(self, b1: int, quiet: int) -> int | None:
        buckets = self.buckets
        i = bisect.bisect_left(buckets, b1) - 1
        if i < 0:
            return None
        while i > 0 and buckets[i] - buckets[i - 1] <= quiet:
            i -= 1
        return buckets[i]

    def peak(self, b0: int, b1: int, width: int) -> int:
        buckets = self.buckets
        lo = bisect.bisect_left(buckets, b0)
        hi = bisect.bisect_left(buckets, b1)
        best = 0
        j = lo
        for i in range(lo, hi):
            while buckets[i] - buckets[j] >= width:
                j += 1
            best = max(best, i - j + 1)
        return best


def history(n: int, shape: str, seed: int) -> list[float]:
    """``n`` distinct active buckets over the 29 days before ``T_END`` (one regime)."""
    rng = random.Random(f"{shape}:{n}:{seed}")
    first = int((T_END - 29 * DAY) // BUCKET)
    last = int(T_END // BUCKET)
    span = last - first
    if shape == "steady":
        picks = rng.sample(range(first, last), n) if n else []
    else:  # rising: the density grows linearly, so the rate test fires on the last days
        chosen: set[int] = set()
        while len(chosen) < n:
            chosen.add(first + int(span * rng.random() ** 0.5))
        picks = list(chosen)
    return [b * BUCKET + 1.0 for b in sorted(picks)]


def build(cls: type[Activity], times: list[float]) -> Activity:
    a = cls()
    for t in times:
        a.mark(t)
    return a


def time_looks(
    act: Activity, rules: list[MemoryTrend], looks: int, repeat: int, memo: bool = False
) -> tuple[float, list[object]]:
    """Microseconds per look (per rule), best of ``repeat``; the verdicts of the last run.
    With ``memo``, each rule keeps its last verdict as the evaluator does (``JudgeMemo``)."""
    nows = [T_END - DAY + k * 300.0 for k in range(looks)]
    best = float("inf")
    verdicts: list[object] = []
    for _ in range(repeat):
        verdicts = []
        memos = [JudgeMemo() if memo else None for _ in rules]
        t0 = time.perf_counter()
        for now in nows:
            for c, m in zip(rules, memos, strict=True):
                verdicts.append(judge(c, act, now, m))
        dt = time.perf_counter() - t0
        best = min(best, dt)
    return best / (looks * len(rules)) * 1e6, verdicts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--looks", type=int, default=288, help="looks per history (5 min apart)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rules = [
        MemoryTrend(
            signal="acceleration", windows=(DAY, 3 * DAY), alpha=0.02, scan=DAY, scan_alpha=0.1
        ),
        MemoryTrend(signal="corroborated", windows=(DAY,), min_active=1, min_episodes=1),
    ]
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.node()}")
    print("active buckets | shape  | before us/look | after us/look | memo us/look | hits")
    for n in (0, 1000, 2000):
        for shape in ("steady", "rising"):
            times = history(n, shape, args.seed)
            old = build(NaiveActivity, times)
            new = build(Activity, times)
            assert old.buckets == new.buckets
            before, v_old = time_looks(old, rules, args.looks, args.repeat)
            after, v_new = time_looks(new, rules, args.looks, args.repeat)
            memoed, v_memo = time_looks(new, rules, args.looks, args.repeat, memo=True)
            if v_old != v_new or v_new != v_memo:
                print(f"verdicts differ at n={n} {shape}", file=sys.stderr)
                return 1
            hits = sum(v is not None for v in v_new)
            print(
                f"{n:14d} | {shape:6s} | {before:14.1f} | {after:13.1f} | {memoed:12.1f} | {hits}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
