#!/usr/bin/env python3
"""The cost of one look of the memory rules at one GPU, by how much history it has.

A look is ``memory_judge.judge`` for the shipped ``GpuMemoryErrorsAccelerating`` (the
rate test on its 1-day and 3-day windows and its change-point scan in whole days, with
the dispersion and the ended-session veto on; ``--plain`` without them, as before round
10) and for the activity part of the corroborated rule (which the engine runs on every
poll): what the engine spends per GPU per look once the counter history is in memory.
Each GPU history has N active 10-minute buckets in one regime over the last 29 days (N =
0, 1000, 2000, 4000; a steady trickle, a rising one, and a chronic one older than the
history kept), and the looks walk through its last day once a minute, as the engine's
periodic evaluation does (``engine.PERIODIC``; ``--every 300`` for looks five minutes
apart, the sparser cadence the bench used up to round 9: fewer looks of a bucket to spread
the peaks' upkeep over).

"before" is the regime bookkeeping as it was up to commit 601502f (``NaiveActivity``
below: the regime start found by walking back through the whole history, the episodes
and the peak counted bucket by bucket, every look); "after" is ``rules/evidence.py`` now
(running counts, per-``quiet`` regime breaks, a regime's counts read by index once per
look, its peak as a sliding maximum per window width that every look extends by the
buckets that left the window; with the memo, the windows whose test surely rejects them
are skipped until their bound runs out). Both read the same buckets and must agree on
every verdict (checked here on every look). Each look is timed on its own: the average and the
worst over a day of looks, and the first look on a fresh history (cold caches, as after
a daemon start); the errors of the two days of looks are marked as the looks reach them,
and those marks are timed too.

    .venv/bin/python bench/memory_look_cost.py [--every 60] [--repeat 5] [--only 4000:chronic]
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

from gpuwatchd.rules.conditions.memory_judge import JudgeMemo, judge
from gpuwatchd.rules.conditions.memory_model import MemoryTrend
from gpuwatchd.rules.engine import PERIODIC
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

    def episodes_at(self, lo: int, hi: int) -> int:
        buckets = self.buckets
        return self.episodes(buckets[lo], buckets[hi - 1] + 1) if hi > lo else 0

    def regime_index(self, hi: int, quiet: int) -> int:
        buckets = self.buckets
        i = hi - 1
        while i > 0 and buckets[i] - buckets[i - 1] <= quiet:
            i -= 1
        return i

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

    def window_at(self, s1: int, hi: int, w0: int) -> tuple[int, int, int, int]:
        buckets = self.buckets
        start = buckets[s1 - 1]
        b1 = buckets[hi - 1] + 1 if hi else w0
        return (
            self.count(w0, b1),
            self.count(start + 1, w0),
            self.episodes(w0, b1),
            bisect.bisect_left(buckets, w0),
        )

    def peaks_kept(self, width: int) -> bool:
        return True  # nothing kept: every question walks

    def peak_before(self, s1: int, lo: int, width: int) -> int:
        buckets = self.buckets
        end = buckets[lo] if lo < len(buckets) else buckets[-1] + 1
        return self.peak(buckets[s1 - 1], end, width)


def history(n: int, shape: str, seed: int) -> tuple[list[float], list[float]]:
    """``n`` distinct active buckets over the 29 days before ``T_END`` (one regime), the
    history before the two days of looks, and those of the two days, marked as the looks
    reach them (a daemon never holds a bucket from its future); ``chronic``: a trickle for
    40 days, longer than the history kept (so retention moves the regime's first kept
    bucket on as errors come), that goes on at the same density through the looks."""
    rng = random.Random(f"{shape}:{n}:{seed}")
    if shape == "chronic":
        first = int((T_END - 40 * DAY) // BUCKET)
        last = int((T_END + DAY) // BUCKET)
        density = n / (29 * 144)
        picks = [b for b in range(first, last) if rng.random() < density]
        times = [b * BUCKET + 1.0 for b in picks]
        cut = T_END - 2 * DAY
        return [t for t in times if t < cut], [t for t in times if t >= cut]
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
    times = [b * BUCKET + 1.0 for b in sorted(picks)]
    cut = T_END - 2 * DAY
    return [t for t in times if t < cut], [t for t in times if t >= cut]


def build(cls: type[Activity], times: list[float]) -> Activity:
    a = cls()
    for t in times:
        a.mark(t)
    return a


def time_looks(
    cls: type[Activity],
    times: list[float],
    rules: list[MemoryTrend],
    looks: int,
    repeat: int,
    memo: bool = False,
    live: list[float] | None = None,
    every: float = 300.0,
) -> tuple[float, float, float, list[object], tuple[float, float, float]]:
    """Microseconds per GPU look (all ``rules``) over the last day of looks, after a day
    of untimed looks (a daemon that has been running): the average and the worst (each
    look's time the best of ``repeat`` runs, so the machine's other jobs count as little
    as they can); and the costliest look of the first day, on a fresh history (caches
    cold: a daemon start). The verdicts of the last run's timed day. With ``memo``, each
    rule keeps its last verdict as the evaluator does (``JudgeMemo``). ``live``: errors
    that come during the looks (marked before the first look after them; each new active
    bucket's ``mark`` of the timed day is timed too, best of ``repeat``: its average and
    worst, as a poll that brings a new bucket pays it; and the worst look together with
    the marks just before it: that poll's whole cost)."""
    warmup = [T_END - 2 * DAY + k * every for k in range(looks)]
    nows = [T_END - DAY + k * every for k in range(looks)]
    live = live or []
    per = [float("inf")] * looks
    polls = [float("inf")] * looks  # a look and the marks just before it
    timed_marks = [t for t in live if warmup[-1] < t <= nows[-1]]
    marks = [float("inf")] * len(timed_marks)
    cold = float("inf")
    verdicts: list[object] = []
    clock = time.perf_counter
    for _ in range(repeat):
        act = build(cls, times)
        memos = [JudgeMemo() if memo else None for _ in rules]
        pending = list(live)
        first = 0.0
        for now in warmup:
            while pending and pending[0] <= now:
                act.mark(pending.pop(0))
            t0 = clock()
            for c, m in zip(rules, memos, strict=True):
                judge(c, act, now, m)
            first = max(first, clock() - t0)
        cold = min(cold, first)
        verdicts = []
        seen = 0
        for i, now in enumerate(nows):
            marked = 0.0
            while pending and pending[0] <= now:
                t0 = clock()
                act.mark(pending.pop(0))
                dt = clock() - t0
                marked += dt
                if dt < marks[seen]:
                    marks[seen] = dt
                seen += 1
            t0 = clock()
            for c, m in zip(rules, memos, strict=True):
                verdicts.append(judge(c, act, now, m))
            dt = clock() - t0
            if dt < per[i]:
                per[i] = dt
            if dt + marked < polls[i]:
                polls[i] = dt + marked
    mark_cost = (
        (sum(marks) / len(marks) * 1e6, max(marks) * 1e6, max(polls) * 1e6)
        if marks
        else (0.0, 0.0, max(polls) * 1e6)
    )
    return sum(per) / looks * 1e6, max(per) * 1e6, cold * 1e6, verdicts, mark_cost


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--every",
        type=float,
        default=PERIODIC,
        help="seconds between looks (default: the engine's periodic evaluation, 60)",
    )
    ap.add_argument("--looks", type=int, help="looks per day of looks (default: a day's worth)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", help="one row, as N:SHAPE (4000:chronic)")
    ap.add_argument(
        "--plain",
        action="store_true",
        help="the rule without the dispersion and the ended-session veto (before round 10)",
    )
    args = ap.parse_args()
    every = args.every
    looks = args.looks or int(DAY // every)
    accel = MemoryTrend(
        signal="acceleration",
        windows=(DAY, 3 * DAY),
        alpha=0.02,
        scan=DAY,
        scan_alpha=0.1,
        dispersion=not args.plain,
        session_veto=not args.plain,
    )
    rules = [
        accel,
        MemoryTrend(signal="corroborated", windows=(DAY,), min_active=1, min_episodes=1),
    ]
    print(f"# {platform.python_implementation()} {platform.python_version()}, {platform.node()}")
    print("# us per GPU look: both rules (before, after, with the memo) and the acceleration")
    print("# rule alone with the memo; avg/worst over the second day of looks; cold: the")
    print("# costliest look of the first day (fresh history, caches cold: a daemon start);")
    print("# mark: us per new active bucket (Activity.mark) during the acceleration rule's day;")
    print("# +look: its worst look with the marks just before it (one poll with a new bucket)")
    print(f"# a look every {every:g} s, {looks} looks a day")
    print(
        "active | shape   | before avg | after avg | memo avg/worst | accel avg/worst | cold"
        " | mark avg/worst | +look | hits"
    )
    for n in (0, 1000, 2000, 4000):
        for shape in ("steady", "rising", "chronic"):
            if (n == 0 and shape == "chronic") or (args.only and args.only != f"{n}:{shape}"):
                continue
            times, live = history(n, shape, args.seed)
            assert build(NaiveActivity, times).buckets == build(Activity, times).buckets
            before, _, _, v_old, _ = time_looks(
                NaiveActivity, times, rules, looks, args.repeat, live=live, every=every
            )
            after, _, _, v_new, _ = time_looks(
                Activity, times, rules, looks, args.repeat, live=live, every=every
            )
            memo_avg, memo_worst, cold, v_memo, _ = time_looks(
                Activity, times, rules, looks, args.repeat, memo=True, live=live, every=every
            )
            acc_avg, acc_worst, _, _, (mark_avg, mark_worst, poll_worst) = time_looks(
                Activity, times, [accel], looks, args.repeat, memo=True, live=live, every=every
            )
            if v_old != v_new or v_new != v_memo:
                print(f"verdicts differ at n={n} {shape}", file=sys.stderr)
                return 1
            hits = sum(v is not None for v in v_new)
            print(
                f"{n:6d} | {shape:7s} | {before:10.1f} | {after:9.1f} |"
                f" {memo_avg:6.1f}/{memo_worst:7.1f} | {acc_avg:6.1f}/{acc_worst:8.1f} |"
                f" {cold:7.1f} | {mark_avg:5.1f}/{mark_worst:6.1f} | {poll_worst:5.1f} | {hits}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
