"""Windows a look need not test: bounds that skip windows surely rejected.

Nearly every window the acceleration test looks at (the fixed windows and the scan's
widths, ``memory_acceleration.py``) is rejected, and by a margin that changes slowly: looks
move forward in time, and between two looks the activity moves only by new active buckets
after the last one, buckets of time, and the regime's first bucket moving later (retention,
a new regime). So a look that rejects a window also finds a budget ``a`` (``_budget``): the
window's test surely rejects it again at any later look whose ``b1`` is at most ``a``
buckets past the bucket after the last active one and whose regime starts at most ``a``
buckets later, that is with at most ``a`` more active buckets in the window, ``a`` fewer in
the baseline and a baseline at most ``a`` longer. Each bound is one of ``accelerated``'s
gates at that worst case: too few active buckets or episodes; the peak veto (the kept
windows that end far enough past the regime's first bucket stay in its peak); or the exact
test's chance, shown to stay at least ``alpha`` with cheap lower bounds on the binomial
tail only (``_rate_rejects``: the median, Slud's bound, the normal tail less the
Berry-Esseen distance), never a sum. A budget is at most a day (``SKIP_MOST``). A budget
of 0 or more holds at the look that finds it too (no move at all), so a window whose bound
ran out asks for a new bound first and is tested only where it finds none: most of them
find one, and a bound costs less than the test and its bound together.

``_Group`` keeps the windows one look tests in order with their two dues (``b1`` and the
regime's first bucket) in heaps, so a look finds the windows whose bound ran out without
visiting the rest; ``Skips`` holds one rule's groups on one GPU's activity (kept in its
``JudgeMemo``), the scan's widths as the regime grows, and the peaks' upkeep. The bounds
are gates only: every look gives the verdict it gives without them (docs/DETECTION.md,
"Windows that need no test"). They bound the gates up to the exact test only; the opt-in
gates ``accelerated`` asks after it (``dispersion``, ``session_veto``) only ever reject a
window the test accepted, so a window the bounds skip is one those would reject too, and
a window one of them rejected finds no bound here (its test is significant): it is tested
again at the next look.
"""

from __future__ import annotations

import heapq
import math
from statistics import NormalDist
from typing import TYPE_CHECKING

from gpuwatchd.rules.conditions.base import Hit
from gpuwatchd.rules.conditions.memory_acceleration import (
    Regime,
    accelerated,
    scan_leaves_baseline,
)
from gpuwatchd.rules.evidence import BUCKET, Activity, binomial_tail_floor

if TYPE_CHECKING:
    from gpuwatchd.rules.conditions.memory_model import MemoryTrend

SKIP_MOST = 144  # buckets (a day): the furthest a look may move and still skip a window
_MARGIN = 1e-7  # a bound's chance must clear alpha by this much (relative): float rounding
_FAR = 1 << 62
_SOON = 8  # buckets: a look tests a window whose bound runs out this soon, if no other
_SOON_SCAN = 24  # the scan's at most: it looks only in active buckets (Skips._test)
UPKEEP_PARTS = 4  # a look keeps one kept width in at most this many (Skips.upkeep)
_AHEAD = 12  # buckets: how soon before the regime grows into a width its bound is found
_Z: dict[float, float] = {}  # alpha -> the normal deviate with that upper tail


class _Group:
    """The windows one look tests in order (the fixed windows, or the scan's widths), each
    with how far later looks may move on from the one that last tested it while its test
    surely rejects it again: its budget ``a`` (``_budget``).

    Looks move forward in time, and between two looks the activity moves only this way:
    new active buckets after the last one, buckets of time, the regime's first bucket
    later (retention, a new regime). A window's bound holds while the look's ``b1`` is at
    most ``a`` buckets past the bucket after the last active one at the test (so at most
    ``a`` new active buckets and ``a`` buckets of time: ``b1`` at most ``due``) and its
    regime's first bucket at most ``a`` buckets later (so at most ``a`` buckets fewer in
    the baseline: ``start`` at most ``due_start``). Both dues are kept in heaps, so a look
    finds the windows whose bound ran out without visiting the others."""

    __slots__ = (
        "b1_from",
        "due",
        "due_start",
        "heap",
        "heap_start",
        "lim",
        "start_from",
        "tested",
        "widths",
    )

    def __init__(self, widths: list[int], old: _Group | None = None) -> None:
        n = len(widths)
        self.widths = widths
        self.due = [-1] * n  # b1 at most this: surely rejected (-1: test it)
        self.due_start = [-1] * n  # and the regime's first bucket at most this
        self.b1_from = [0] * n  # the look that found the bound (0: none yet)
        self.start_from = [0] * n
        if old is not None:  # the widths both hold keep what their last test found
            for i, width in enumerate(old.widths[:n]):
                if widths[i] != width:
                    break
                self.due[i] = old.due[i]
                self.due_start[i] = old.due_start[i]
                self.b1_from[i] = old.b1_from[i]
                self.start_from[i] = old.start_from[i]
        self.heap: list[tuple[int, int]] = []
        self.heap_start: list[tuple[int, int]] = []
        self.lim = (0, 0)
        self.tested = 0  # the windows the last look tested
        self._limits()

    def grow(self, width: int, early: _Early | None = None) -> None:
        """One more window, last (the scan's regime grew into it): tested at the next look,
        unless a look before found its bound already (``early``, for this width)."""
        bound = early if early is not None and early.width == width and early.due >= 0 else None
        self.widths.append(width)
        self.due.append(bound.due if bound else -1)
        self.due_start.append(bound.due_start if bound else -1)
        self.b1_from.append(bound.b1_from if bound else 0)
        self.start_from.append(bound.start_from if bound else 0)
        heapq.heappush(self.heap, (self.due[-1], len(self.widths) - 1))
        heapq.heappush(self.heap_start, (self.due_start[-1], len(self.widths) - 1))

    def _limits(self) -> None:
        """The heaps of dues afresh, and what every bound needs of a look: a ``b1`` and a
        first bucket no earlier than where a bound was found (looks move forward)."""
        self.heap = [(due, i) for i, due in enumerate(self.due)]
        heapq.heapify(self.heap)
        self.heap_start = [(due, i) for i, due in enumerate(self.due_start)]
        heapq.heapify(self.heap_start)
        if self.widths:
            self.lim = (max(self.b1_from), max(self.start_from))

    def test(self, c: MemoryTrend, r: Regime, alpha: float, soon: int = _SOON) -> Hit | None:
        """``accelerated`` for each window in order, but those still surely rejected and
        those whose new bound holds at this look already: the first hit, or None. At a
        look that has none to test, one whose bound runs out within ``soon`` buckets is
        tested early."""
        self.tested = 0
        if not self.widths:
            return None
        b1 = r.b1
        start = r.start
        heap = self.heap
        heap_start = self.heap_start
        due = self.due
        due_start = self.due_start
        lim = self.lim
        if b1 >= lim[0] and start >= lim[1]:
            if heap[0][0] >= b1 and heap_start[0][0] >= start:
                # every window is surely rejected: nothing to test
                if heap[0][0] >= b1 + soon:
                    return None
                # but one whose bound runs out soon is tested now, so that two that run
                # out at once do not both fall to one look
                d, i = heapq.heappop(heap)
                if d != due[i]:
                    return None  # a stale entry (its bound was found again since)
                order = [i]  # every other bound holds: no heap entry is due
            else:
                order = []
                while heap and heap[0][0] < b1:  # the bounds that ran out (or stale entries)
                    d, i = heapq.heappop(heap)
                    if d == due[i]:
                        order.append(i)
                while heap_start and heap_start[0][0] < start:
                    d, i = heapq.heappop(heap_start)
                    if d == due_start[i]:
                        order.append(i)
                if len(order) > 1:
                    order = sorted(set(order))
        else:  # a look back in time: test every window
            order = list(range(len(self.widths)))
        # bounds found now hold from the bucket after the last active one
        act = r.act
        widths = self.widths
        n = len(widths)
        spread = len(order) == n  # every window: the heaps are built afresh after
        self.tested = len(order)
        b0 = act.buckets[r.hi - 1] + 1
        for k, i in enumerate(order):
            width = widths[i]
            w0 = b1 - width
            counts = act.window_at(r.s1, r.hi, w0) if w0 > start else None
            # bounds that begin at one look (the first, or after the regime's first bucket
            # moved) end spread over the day, so no later look tests them all again at once
            most = SKIP_MOST
            if spread or not self.b1_from[i]:
                most = SKIP_MOST * (i + 1) // n
            # A bound holds from this look on, this look included: a window that finds one
            # needs no test. The bound first, then, where the width's peaks are kept (where
            # they are not, the test builds them now, as it would without the bounds).
            a = _budget(c, r, width, alpha, most, counts) if act.peaks_kept(width) else -1
            if a < 0:
                hit = accelerated(c, r, width, alpha, counts)
                if hit is not None:
                    for j in order[k:]:  # tested again at the next look
                        due[j] = -1
                    self._limits()
                    return hit
                a = _budget(c, r, width, alpha, most, counts)  # the test may have caught
                # the peaks up, and a bound found on them lasts longer
            due[i] = b0 + a
            due_start[i] = start + a
            self.b1_from[i] = b1
            self.start_from[i] = start
            if not spread:
                heapq.heappush(heap, (b0 + a, i))
                heapq.heappush(heap_start, (start + a, i))
        if spread or len(heap) + len(heap_start) > 8 * n:
            self._limits()
        else:  # the heaps' branch: this look's b1 and start are at least the limits
            self.lim = (b1, start)
        return None


class _Early:
    """The bound of the scan's next width, found before the regime grows into it (at a
    look that tested nothing): the look that grows then need not test that width."""

    __slots__ = ("b1_from", "due", "due_start", "start_from", "width")

    def __init__(self, width: int, due: int, due_start: int, b1_from: int, start_from: int):
        self.width = width
        self.due = due
        self.due_start = due_start
        self.b1_from = b1_from
        self.start_from = start_from


class Skips:
    """One rule's bounds on one GPU's activity (kept in its ``JudgeMemo``): which windows a
    look need not test because an earlier look proved they stay rejected (``_Group``).
    Most looks then test no window at all; the verdicts are those of ``judge`` without a memo
    (a bound only ever skips a window whose test would return None)."""

    __slots__ = (
        "act",
        "ahead",
        "early",
        "epoch",
        "fixed",
        "grew_at",
        "kept_at",
        "pace_b1",
        "pace_looks",
        "parts",
        "rooms",
        "scan",
        "top",
    )

    def __init__(self, act: Activity) -> None:
        self.act = act
        self.epoch = act.epoch
        self.fixed: _Group | None = None
        self.scan = _Group([])
        self.top = -1  # the scan's widths: step, 2 step, ... top * step (-1: none yet)
        self.rooms = (0, 0)  # b1 - start: the widths stay while it is in this range
        self.ahead: list[int] = []  # the next widths of the scan, to prepare (prepare_peaks)
        self.kept_at = -1  # the b1 of the last look that kept the peaks (upkeep)
        self.parts = 2  # the upkeep's split: one kept width in this many a look
        self.pace_b1 = -1  # the bucket whose looks are being counted (looked)
        self.pace_looks = 0
        self.early: _Early | None = None  # the next width's bound, found ahead (_bound_ahead)
        self.grew_at = -1  # the b1 of the last look at which the scan's widths changed

    def judge(self, c: MemoryTrend, r: Regime, alpha: float) -> Hit | None:
        """The fixed windows, then the scan (``scanned``), skipping what is bounded; and
        the peaks' upkeep (``upkeep``), but at a look that tested a window while the
        upkeep ran in this bucket or the last: the upkeep only spreads the work of keeping
        the peaks over the looks (a peak asked catches up itself), so it waits for a look
        with less to do. The scan's next widths are prepared (``prepare_peaks``) at a look
        that tests nothing, for the same reason."""
        act = r.act
        self.looked(r.b1)
        hit = self._test(c, r, alpha)
        assert self.fixed is not None
        if self.grew_at == r.b1:
            return hit  # the look that grew did that work: the upkeep waits a look
        if self.fixed.tested + self.scan.tested:
            if self.kept_at < r.b1 - 1:
                self.upkeep(r.b1)
            return hit
        self.upkeep(r.b1)
        if self.ahead:
            for width in self.ahead:
                act.prepare_peaks(r.s1, width)
            self.ahead = []
        else:
            self._bound_ahead(c, r)
        return hit

    def looked(self, b1: int) -> None:
        """Count a look at ``b1`` (every look, the memo's too): how many looks a bucket
        gets sets how many parts the peaks' upkeep is split into (``upkeep``)."""
        if b1 != self.pace_b1:
            self.parts = min(max(self.pace_looks, 2), UPKEEP_PARTS)
            self.pace_b1 = b1
            self.pace_looks = 0
        self.pace_looks += 1

    def upkeep(self, b1: int) -> None:
        """A share of the peaks' upkeep for a look at ``b1`` (``Activity.keep_peaks``:
        one kept width in ``parts``, in turn): at a look that tests nothing, and at a look
        that reuses the last verdict (``JudgeMemo``: the same bucket, no new activity),
        which would do nothing else. The share is as many parts as the last bucket had
        looks, from two to ``UPKEEP_PARTS``: the periodic looks come every minute
        (``engine.PERIODIC``) and a bucket turns every ten, so the buckets that leave the
        kept windows at a turn are taken in over that bucket's first four looks, not all
        at the one that turns it; with looks five or ten minutes apart, every other width
        a look (each width waits at most a bucket or two, so an ask catches up little)."""
        self.act.keep_peaks(b1, self.parts)
        self.kept_at = b1

    def _bound_ahead(self, c: MemoryTrend, r: Regime) -> None:
        """At a look that tested nothing, within ``_AHEAD`` buckets of the regime growing
        into the scan's next width: find that width's bound now (its counts, ``_budget``),
        so the look that grows, which may test other windows too, does not test it.
        The bound holds for any later look within it, whether or not the width is scanned
        yet: it is ``accelerated``'s own verdict at the window's worst case."""
        if self.top < 1 or c.scan <= 0:
            return
        room = r.b1 - r.start
        grows = self.rooms[1]
        if not grows - _AHEAD <= room < grows:
            return
        width = (self.top + 1) * c.scan_step
        early = self.early
        if early is not None and early.width == width and (early.due < 0 or early.due >= r.b1):
            return  # tried once (found none: the growing look tests it), or it holds yet
        assert self.fixed is not None
        if width in self.fixed.widths:
            return
        w0 = r.b1 - width
        counts = r.act.window_at(r.s1, r.hi, w0) if w0 > r.start else None
        a = _budget(c, r, width, c.scan_alpha, SKIP_MOST, counts)
        b0 = r.act.buckets[r.hi - 1] + 1
        self.early = _Early(width, b0 + a if a >= 0 else -1, r.start + a, r.b1, r.start)

    def _test(self, c: MemoryTrend, r: Regime, alpha: float) -> Hit | None:
        act = r.act
        self.scan.tested = 0
        fixed = self.fixed
        if fixed is None:
            fixed = self.fixed = _Group(list(c.window_widths))
        hit = fixed.test(c, r, alpha)
        if hit is not None or c.scan <= 0:
            return hit
        if act.buckets[r.hi - 1] != r.b1 - 1:
            return None  # no activity in the newest bucket (as scanned)
        room = r.b1 - r.start
        rooms = self.rooms
        # the scan looks only in active buckets, so between two of its looks more bounds
        # run out where they are sparse: it tests early over as many of those looks
        gap = room // max(r.hi - r.s1 + 1, 1)
        soon = min(_SOON_SCAN, _SOON * max(gap, 1))
        if rooms[0] <= room < rooms[1]:
            return self.scan.test(c, r, c.scan_alpha, soon)  # the same widths as the last look
        step = c.scan_step
        least = c.scan_baseline / BUCKET
        ratio = c.scan_ratio
        top = max(self.top, 0)
        # scanned's loop condition for the width k * step (monotone in k)
        while top > 0 and not scan_leaves_baseline(c, room, top * step):
            top -= 1
        while scan_leaves_baseline(c, room, (top + 1) * step):
            top += 1
        # the same condition as a least room (an int compared with a float is compared
        # exactly, so room - k step >= f is room >= k step + ceil(f)): the widths stay
        # those up to top while room is in [rooms[0], rooms[1])
        least_room = math.ceil(least)
        self.rooms = (
            top * step + max(least_room, math.ceil(ratio * (top * step))) if top else -_FAR,
            (top + 1) * step + max(least_room, math.ceil(ratio * ((top + 1) * step))),
        )
        if top != self.top:
            # the regime grew into a width (or out of one): the next two are prepared
            # ahead of their first test, as scanned does
            fixed_widths = fixed.widths
            if top == self.top + 1 and self.top >= 0:  # grew by one (once in days)
                if top * step not in fixed_widths:
                    self.scan.grow(top * step, self.early)
            else:
                widths = [k * step for k in range(1, top + 1) if k * step not in fixed_widths]
                self.scan = _Group(widths, self.scan)
            self.top = top
            self.grew_at = r.b1
            self.early = None  # used by the width it was for, or of no use now
            # prepared at the next look that tests nothing (this one tests the new width)
            self.ahead = [w for w in ((top + 1) * step, (top + 2) * step) if w not in fixed_widths]
        return self.scan.test(c, r, c.scan_alpha, soon)


def _budget(
    c: MemoryTrend,
    r: Regime,
    width: int,
    alpha: float,
    most: int,
    counts: tuple[int, int, int, int] | None,
) -> int:
    """How far looks may move on from this one while the window of ``width`` stays surely
    rejected (``_Group``): at most ``most``; -1: test it at the next look. ``counts``: the
    window's ``Activity.window_at``.

    Each bound is one of ``accelerated``'s gates at the window's worst case after the
    move: at most ``a`` more active buckets in it (the window's start only moves forward),
    ``a`` fewer in the baseline (retention or a new first bucket takes them), a baseline
    ``a`` buckets longer; the exact test's chance grows with the baseline count and the
    null rate and shrinks with the recent count, so a chance at or above ``alpha`` there is
    above it at every look within the budget. Too few active buckets or episodes bound the
    same way, and so does the regime's peak: the windows that end ``most`` buckets or more
    after its first bucket stay in it (``Activity.peak_floor``)."""
    w0 = r.b1 - width
    baseline = w0 - r.start - 1
    if (w0 - r.start) * BUCKET < c.min_baseline or baseline <= 0 or counts is None:
        return -1  # a young regime: it may pass its gates at the next look
    x, y, episodes, lo = counts
    a = max(c.min_active - 1 - x, c.min_episodes - 1 - episodes)
    if a >= most:
        return most
    peak = r.act.peak_floor(r.start + most, lo, width)  # the peak first: it costs little
    if peak >= c.min_active:
        ratio = c.peak_ratio
        b = most if ratio <= 0.0 else min(most, int(peak / ratio) - x)
        while b >= 0 and peak < ratio * (x + b):
            b -= 1  # float rounding: the gate's own product decides
        if b >= most:
            return most
        a = max(a, b)
    return _rate_budget(c, x, y, width, baseline, alpha, most, a)


def _rate_budget(
    c: MemoryTrend,
    x: int,
    y: int,
    width: int,
    baseline: int,
    alpha: float,
    most: int,
    floor: int = -1,
) -> int:
    """The most buckets ``a`` for which the window's exact test surely finds no rise with
    ``x + a`` of ``x + y`` active buckets in it and a baseline ``a`` buckets longer; -1
    where even this look's counts are not surely rejected by it. At least ``floor``, the
    budget another gate gave already: a candidate no higher is not checked (the candidates
    are the guess, its half and 0, the first that the cheap bounds show, else -1)."""
    fw = c.factor * width
    n = x + y
    p = fw / (fw + float(baseline))
    z = _Z.get(alpha)
    if z is None:
        z = _Z[alpha] = NormalDist().inv_cdf(1.0 - alpha)
    # about where the chance falls to alpha (a normal approximation, checked below): the
    # room above x, shared between the recent count (one a bucket) and the null mean
    # (n p falls by about n p^2 / fw a bucket of baseline)
    room = n * p + (z - 0.25) * math.sqrt(n * p * (1.0 - p)) - x
    guess = min(most, math.floor(room / (1.0 + n * p * p / fw)))
    floor = max(floor, -1)
    level = alpha * (1.0 + _MARGIN)
    for a in (guess, guess // 2, 0) if guess > 0 else (0,):
        if a <= floor:
            break  # and so is every later one: the other gate's budget stands
        if _rate_rejects(x, y, a, fw, baseline, level):
            return a
    return floor


def _rate_rejects(x: int, y: int, a: int, fw: float, baseline: int, level: float) -> bool:
    """Whether the chance of ``x + a`` recent of ``x + y`` active buckets, under the null
    rate of a baseline ``a`` buckets longer, is surely at least ``level``: then so is the
    chance at every look within budget ``a`` (``_budget``). Cheap lower bounds on the
    binomial tail only (no sum): the median, Slud's, and the normal tail less the
    Berry-Esseen distance (constant 0.4748, Shevtsova 2011); False where none suffices."""
    big = x + a
    if big <= 0:
        return True  # P(X >= 0) = 1
    n = big + max(y - a, 0)
    p = fw / (fw + float(baseline + a))
    if level < 0.5 and big <= n * p * (1.0 - 1e-12):
        return True  # at most the mean: the chance is at least 1/2 (the binomial median)
    if binomial_tail_floor(big, n, p) >= level:
        return True  # Slud's bound (p <= 1/4)
    q = 1.0 - p
    var = n * p * q
    if var <= 0.0 or p >= 1.0:
        return False
    sd = math.sqrt(var)
    # P(X >= big) = 1 - P(X <= big - 1) >= 1 - Phi((big - 1 - np) / sd) - distance
    tail = 0.5 * math.erfc((big - 1 - n * p) / (sd * math.sqrt(2.0)))
    return tail - 0.4748 * (p * p + q * q) / sd >= level
