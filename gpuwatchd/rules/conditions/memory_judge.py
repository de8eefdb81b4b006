"""The verdict of ``memory_trend``'s per-GPU signals on one GPU's activity: ``judge``.

``acceleration`` runs the rate test over the regime's recent windows and the change-point
scan (``memory_acceleration.py``), skipping the windows an earlier look proved surely
rejected (``memory_bounds.py``); ``stream`` and ``activity`` (and ``corroborated``'s
activity part) are counts read here. ``JudgeMemo`` keeps the last verdict per rule and GPU,
so a look that nothing changed for reuses it.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions.base import Hit
from gpuwatchd.rules.conditions.memory_acceleration import Regime, accelerated, scanned
from gpuwatchd.rules.conditions.memory_bounds import Skips
from gpuwatchd.rules.evidence import BUCKET, EPISODE_GAP, Activity, bucket_of, rate_ratio_p_value

if TYPE_CHECKING:
    from gpuwatchd.rules.conditions.memory_model import MemoryTrend


class JudgeMemo:
    """The last verdict of ``judge`` for one rule on one GPU's activity. The verdict is a
    function of the rule, the active buckets and the bucket of ``now`` only, so while no
    new active bucket arrived (``Activity.version``) and the bucket did not turn, the next
    look reuses it: the fixed windows and the change-point scan run once per new active
    bucket or bucket turn, not on every poll."""

    __slots__ = ("act", "b1", "hit", "skips", "version")

    def __init__(self) -> None:
        self.act: Activity | None = None
        self.b1 = -1
        self.version = -1
        self.hit: Hit | None = None
        self.skips: Skips | None = None  # the windows surely rejected for a while


def judge(c: MemoryTrend, act: Activity, now: float, memo: JudgeMemo | None = None) -> Hit | None:
    """Whether the activity shows ``c.signal`` at ``now`` (for ``corroborated``, only its
    activity part: the remaps and XIDs need the GPU). With ``memo`` (one per rule and GPU),
    a look that nothing changed for returns the last verdict (a fresh copy)."""
    b1 = bucket_of(now) + 1
    if memo is None:
        return _judge(c, act, b1)
    if memo.act is not act or memo.b1 != b1 or memo.version != act.version:
        memo.act, memo.b1, memo.version = act, b1, act.version
        skips = memo.skips
        if (
            c.signal == "acceleration"
            and act.buckets
            and (skips is None or skips.act is not act or skips.epoch != act.epoch)
        ):
            skips = memo.skips = Skips(act)  # a late bucket: the indexes kept moved
        memo.hit = _judge(c, act, b1, skips)
    elif memo.skips is not None and memo.skips.epoch == act.epoch:
        memo.skips.looked(b1)
        memo.skips.upkeep(b1)  # nothing to judge: a share of the peaks' upkeep instead
    hit = memo.hit
    if hit is None:
        return None
    return hit[0], None if hit[1] is None else dict(hit[1])


def _judge(c: MemoryTrend, act: Activity, b1: int, skips: Skips | None = None) -> Hit | None:
    quiet = int(c.quiet // BUCKET)
    if c.signal == "stream":
        return _streaming(c, act, b1, quiet)
    if c.signal != "acceleration":
        # the window's counts by index: two bisects for the window, none more for the
        # regime (the corroborated rule asks this on every poll with new activity)
        buckets = act.buckets
        w0 = b1 - int(c.window // BUCKET)
        hi = bisect.bisect_left(buckets, b1)
        lo = bisect.bisect_left(buckets, w0, 0, hi)
        x = hi - lo
        if x < c.min_active:  # at least 1 (the kind's schema), so hi > 0 below
            return None
        episodes = act.episodes_at(lo, hi)
        if episodes < c.min_episodes:
            return None
        start = buckets[act.regime_index(hi, quiet)]
        values: dict[str, Any] = {"active": x, "episodes": episodes}
        if c.signal == "activity":
            if (w0 - start) * BUCKET >= c.min_baseline:
                return None  # an old regime: acceleration's business
            values["regime_age"] = format_duration(max(b1 - start, 0) * BUCKET)
        return float(x), values
    buckets = act.buckets
    hi = bisect.bisect_left(buckets, b1)
    if hi == 0:
        return None  # no activity before b1
    # the regime's bookkeeping, found once per look and shared by every window tested
    j = act.regime_index(hi, quiet)
    r = Regime(act, b1, hi, buckets[j], j + 1)
    alpha = c.alpha / len(c.windows)
    if skips is not None:
        return skips.judge(c, r, alpha)  # it keeps the peaks itself
    act.keep_peaks(b1)  # the buckets that left each width's window since the last look
    for window in c.windows:
        hit = accelerated(c, r, int(window // BUCKET), alpha)
        if hit is not None:
            return hit
    if c.scan > 0:
        return scanned(c, r)
    return None


def _streaming(c: MemoryTrend, act: Activity, b1: int, quiet: int) -> Hit | None:
    """The episode that holds at ``b1`` has run longer than ``c.stream`` and is still going
    (a new error now would join it), after ``c.min_episodes`` episodes of its regime over at
    least ``c.min_baseline``, at a rate significantly above the regime's before it."""
    buckets = act.buckets
    hi = bisect.bisect_left(buckets, b1)
    if hi == 0:
        return None
    last = buckets[hi - 1]
    if b1 - 1 - last > EPISODE_GAP:
        return None  # an hour of silence: the episode ended
    first = act.episode_start(hi - 1)
    if (last - first) * BUCKET <= c.stream:
        return None
    start = buckets[act.regime_index(hi, quiet)]
    if (first - start) * BUCKET < c.min_baseline:
        return None  # the regime began with it: a step to a steady rate
    before = act.episodes(start, first)
    if before < c.min_episodes:
        return None
    # and a rise: a steady trickle of a few errors an hour breaks now and then and also runs
    # unbroken for days, at the rate it had all along (the test and baseline of acceleration)
    x = act.count(first, b1)
    baseline = first - start - 1
    y = act.count(start + 1, first)
    if rate_ratio_p_value(x, float(b1 - first), y, float(baseline), c.factor, c.alpha) >= c.alpha:
        return None
    values: dict[str, Any] = {
        "active": x,
        "episodes": before,
        "stream_age": format_duration((last + 1 - first) * BUCKET),
        "regime_age": format_duration((first - start) * BUCKET),
    }
    return (last + 1 - first) * BUCKET / 3600.0, values
