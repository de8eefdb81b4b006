"""The acceleration test of one regime (``memory_trend``'s ``acceleration`` signal).

``accelerated`` is the exact conditional binomial test of a rate ratio on one recent window
against the regime before it, behind its gates (active buckets, episodes, baseline, the
peak veto, overdispersion, an ended session); ``scanned`` is the change-point scan, the
same test on the windows of ``k * scan`` back from the newest bucket. ``Regime`` is one
look's bookkeeping of the regime, shared by every window it tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions.base import Hit
from gpuwatchd.rules.evidence import (
    BUCKET,
    EPISODE_GAP,
    Activity,
    binomial_tail_floor,
    rate_ratio_p_value,
)

if TYPE_CHECKING:
    from gpuwatchd.rules.conditions.memory_model import MemoryTrend

DAY_BUCKETS = int(86400 // BUCKET)  # the session veto asks only windows longer than this


class Regime:
    """One look's view of the regime that holds at ``b1``: the index past the last bucket
    before ``b1`` (``hi``), the regime's first bucket (``start``) and the index just past
    it (``s1``). The windows read their counts as index differences from these (one bisect
    for where each window begins), so testing one more window costs O(log n)."""

    __slots__ = ("act", "b1", "hi", "s1", "start")

    def __init__(self, act: Activity, b1: int, hi: int, start: int, s1: int) -> None:
        self.act = act
        self.b1 = b1
        self.hi = hi
        self.start = start
        self.s1 = s1


def scan_leaves_baseline(c: MemoryTrend, room: int, width: int) -> bool:
    """Whether a scanned window of ``width`` buckets, in a regime of ``room`` buckets up to
    the look (``b1 - start``), leaves a baseline of at least ``scan_baseline`` and
    ``scan_ratio`` times the window: the scan's widths are those that do (monotone: a
    wider window leaves less)."""
    baseline = room - width
    return not (baseline < c.scan_baseline / BUCKET or baseline < c.scan_ratio * width)


def scanned(c: MemoryTrend, r: Regime) -> Hit | None:
    """The change-point scan: windows of ``k * c.scan`` back from ``b1``, the shortest
    first, while the regime before them is long enough to be a baseline. It runs in an
    active bucket only: a rise shows most where new activity just came (later, the same
    windows hold no more events and a longer baseline), and so it costs nothing on the
    looks between errors. Each width reads the regime's counts by index (``Regime``) and
    its peak from a sliding maximum kept per width (``Activity.peak_at``) that each look
    extends: nothing is rescanned from the regime's start when a new bucket comes.
    The next widths the regime will grow into are prepared ahead of their first test
    (``Activity.prepare_peaks``)."""
    if r.act.buckets[r.hi - 1] != r.b1 - 1:
        return None  # no activity in the newest bucket
    step = c.scan_step
    fixed = set(c.window_widths)
    width = step
    while True:
        if not scan_leaves_baseline(c, r.b1 - r.start, width):
            # the next two widths this regime grows into: their peaks are prepared a few
            # buckets a look from now on, so the look that first tests one builds little
            # (two: the one after next has no backlog yet while the baseline is short)
            for ahead in (width, width + step):
                if ahead not in fixed:
                    r.act.prepare_peaks(r.s1, ahead)
            return None
        if width not in fixed:
            hit = accelerated(c, r, width, c.scan_alpha)
            if hit is not None:
                return hit
        width += step


def accelerated(
    c: MemoryTrend,
    r: Regime,
    width: int,
    alpha: float,
    counts: tuple[int, int, int, int] | None = None,
) -> Hit | None:
    """The rate test of the window of ``width`` at ``r.b1`` (``counts``: its
    ``Activity.window_at``, where the caller has them already)."""
    act = r.act
    w0 = r.b1 - width
    if (w0 - r.start) * BUCKET < c.min_baseline:
        return None  # a young regime: a step, not (yet) an acceleration
    # The regime's first bucket is the stopping time that defines the regime: it is active
    # by construction, so it is no evidence of the rate. Under H0 the activity after it is
    # the Poisson process; counting it would add one sure event to the baseline.
    baseline = w0 - r.start - 1
    if baseline <= 0:
        return None
    x, y, episodes, lo = act.window_at(r.s1, r.hi, w0) if counts is None else counts
    # The peak is the costliest count (bench/memory_look_cost.py): asked after the cheap
    # gates, which rule out most windows a look tests (the scan's), once its sliding maximum
    # is kept (built, or prepared by the scan); the first time a width that is not is tested
    # (a daemon start) it is built at once, so no later look pays a build over the regime.
    # Gates only: their order does not change a verdict.
    peak = act.peak_before(r.s1, lo, width) if not act.peaks_kept(width) else None
    if x < c.min_active or episodes < c.min_episodes:
        return None
    p0 = c.factor * width / (c.factor * width + baseline)
    if x <= (x + y) * p0:
        return None  # at most the expected count: p >= 0.5 > alpha (and no sum to take)
    if binomial_tail_floor(x, x + y, p0) >= alpha:
        return None  # surely not significant (Slud's bound): no exact sum to take
    veto = max(c.min_active, c.peak_ratio * x)
    if peak is None:
        # what the kept maximum holds already, without catching up, is often enough
        if act.peak_floor(act.buckets[r.s1 - 1], lo, width) >= veto:
            return None
        peak = act.peak_before(r.s1, lo, width)
    if peak >= veto:
        return None  # an earlier window of this regime was as busy, and it subsided
    # only as exact as the verdict and its shown p-value need (binomial_tail)
    p = rate_ratio_p_value(x, float(width), y, float(baseline), c.factor, alpha)
    if p >= alpha:
        return None
    if c.session_veto and width > DAY_BUCKETS:
        # An ended session: in a window longer than a day, one episode holds most of the
        # window's active buckets and has ended (an hour of quiet after its last bucket at
        # this look, so no later bucket can join it). A job that hammered a weak row for a
        # while and stopped, with the trickle's odd error around it; a leak's daily phase
        # is many episodes, and a stream that still goes on is never vetoed (the stream
        # rule's business). Asked only of a significant window (a rare look): one bisect
        # per episode of the window, at most its buckets.
        last = act.majority_episode_end(lo, r.hi)
        if last is not None and r.b1 - last > EPISODE_GAP:
            return None
    if c.dispersion:
        # Overdispersion: the baseline's day counts vary more than a Poisson process's, so
        # the counts carry less evidence than their size says; test them scaled down by the
        # dispersion factor (quasi-Poisson), the recent count rounded down. The factor is
        # read about a rate that may have stepped once inside the baseline (a leak's weekly
        # phase, then its daily one: a change of mean, not dispersion). Asked last, where
        # every cheap gate passed and the test is already significant: a rare look, over at
        # most 30 days of the baseline.
        phi = act.dispersion(r.start + 1, w0)
        if phi > 1.0:
            p = rate_ratio_p_value(
                int(x / phi), float(width), round(y / phi), float(baseline), c.factor, alpha
            )
            if p >= alpha:
                return None
    days = width * BUCKET / 86400.0
    values: dict[str, Any] = {
        "active": x,
        "episodes": episodes,
        "p_value": f"{p:.1e}",
        "baseline_rate": round(y / (baseline * BUCKET / 86400.0), 2),
        "recent_rate": round(x / days, 2),
        "window": format_duration(width * BUCKET),
    }
    return float(x), values
