"""``memory_trend``: device-memory errors that start, step up, or accelerate.

It reads activity, not counts (``rules/evidence.py``): 10-minute buckets in which the
counter grew, episodes (runs of them less than an hour apart) and regimes (activity after
at least ``quiet`` of silence). One condition, six signals (``signal``):

- ``acceleration``: within one regime, the active buckets of a recent window ``W`` are
  tested against those of the regime before it (``B``) with the exact conditional
  binomial test of a rate ratio (``B`` begins after the regime's first bucket, which only
  marks where the regime starts): under "the recent rate is at most ``factor`` times the
  earlier one", ``x`` recent of ``x + y`` buckets is ``Binomial(x + y, p0)`` with
  ``p0 = factor * W / (factor * W + B)``. It holds when that chance is below ``alpha``,
  whatever the GPU's own baseline rate. ``window`` may list several recent windows (a
  fast leak shows in a short one, a slow one in a long one); ``alpha`` is then shared
  among them (Bonferroni). Gates: at least ``min_active`` buckets and ``min_episodes``
  episodes in the window (one burst is one episode), at least ``min_baseline`` of regime
  before the window, and no earlier window of the regime as busy as ``peak_ratio`` of
  this one (errors that come and go with one job).
  With ``scan`` (a step, e.g. ``1d``), a change-point scan over the whole regime follows
  the fixed windows: every window of ``k * scan`` (``k`` = 1, 2, ...) that leaves a
  baseline of at least ``scan_baseline`` and ``scan_ratio`` times the window is tested the
  same way, each at ``scan_alpha``, so a rise that began days ago (a daily phase after a
  weekly one, a regular cadence) is judged from where it began, not only by its last
  days. The scan runs in active buckets (where new activity just came). Each scanned
  window keeps every gate; what the scan costs in false drains is
  measured by ``gpuwatchd backtest`` (docs/DETECTION.md), not promised by ``scan_alpha``.
  Once it holds on a GPU, it stays true while the shortest window still holds
  ``min_active`` active buckets: the evidence keeps arriving (a leak that went on at its
  new rate), so the alert does not resolve under it.
- ``stream``: the GPU's errors have come without an hour's break for longer than
  ``stream`` (one episode), and still come, in a regime that had at least ``min_episodes``
  episodes over at least ``min_baseline`` before it. The acceleration test counts an
  episode once however long it runs (a window needs ``min_episodes`` of them), so a leak
  that turns into a continuous stream soon after its regime began is one it never sees;
  job sessions are such streams too, but end within a job's length (``stream``). The
  stream's active buckets must also be a significant rise over the regime's before it
  (the acceleration's test, ``factor`` and ``alpha``): a steady trickle of a few errors an
  hour breaks now and then, and runs unbroken for days too.
- ``activity``: a new regime (or one younger than ``min_baseline``) with at least
  ``min_active`` buckets and ``min_episodes`` episodes in the longest window.
- ``corroborated``: activity in the longest window together with the GPU certifying the
  fault itself: a correctable row remap or XID 92 or 63 on this GPU in that window, or a
  bank with low or no spare rows left (row-remapper histogram) in its latest sample.
- ``node``: one node-level alert while any GPU's activity in the longest window is
  node-wide (began after quiet on 3 or more GPUs within minutes: ``rules/node_wide.py``;
  a memory XID, 63/64/92/94/95, counts as activity of its GPU here),
  with the GPUs it touched (``gpus``). A job, a driver or a power event, not that many
  failing GPUs; ``increase``'s ``skip_node_wide`` leaves those GPUs out of the per-GPU
  ticket.
"""

from __future__ import annotations

import bisect
import heapq
import logging
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Literal

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import memory_certified as mc
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    NODE_KEY,
    ConditionKind,
    Evaluator,
    Hit,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import MAX_WINDOW, BodyReader
from gpuwatchd.rules.conditions.recheck import Recheck
from gpuwatchd.rules.evidence import (
    BUCKET,
    EPISODE_GAP,
    Activity,
    binomial_tail_floor,
    bucket_of,
    rate_ratio_p_value,
)
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.node_wide import (
    NodeLook,
    node_wide_gpus,
    with_memory_xids,
    xid_event_gpus,
)
from gpuwatchd.rules.rate_limited import lookback, note
from gpuwatchd.rules.snapshot import GpuView, Snapshot
from gpuwatchd.rules.store import StateStore

Signal = Literal["acceleration", "activity", "corroborated", "certified", "node", "stream"]
SIGNALS: tuple[Signal, ...] = (
    "acceleration",
    "activity",
    "corroborated",
    "certified",
    "node",
    "stream",
)
RECHECK = 300.0  # seconds between looks at a GPU whose counter did not move
CERTIFIED_SIGNATURE = "memory-certified-xids-1"  # the saved XIDs' format (rules store)
log = logging.getLogger(__name__)
REMAP_FIELD = "remapped_rows_correctable"
CORROBORATING_XIDS = frozenset({63, 92})
# Row-remapper histogram levels that mean a bank has been remapping rows again and again.
SPARE_ROWS_SHORT = ("row_remap_banks_low", "row_remap_banks_none")


@dataclass(frozen=True)
class MemoryTrend(Condition):
    """See the module docstring; durations in seconds."""

    signal: Signal = "acceleration"
    field: str = "ecc_corrected_volatile_dev"
    windows: tuple[float, ...] = (86400.0, 3 * 86400.0)
    factor: float = 1.0
    alpha: float = 3e-3
    min_active: int = 3
    min_episodes: int = 3
    min_baseline: float = 86400.0
    quiet: float = 28 * 86400.0
    peak_ratio: float = 0.3
    dispersion: bool = False
    scan: float = 0.0  # the scan's step; 0: no scan
    scan_alpha: float = 0.1
    scan_baseline: float = 7 * 86400.0
    scan_ratio: float = 1.5
    stream: float = 2 * 86400.0  # signal stream: how long an episode runs before it counts

    @property
    def window(self) -> float:
        """The longest recent window."""
        return max(self.windows)


def _corroboration(c: MemoryTrend, g: GpuView, snap: Snapshot, now: float) -> str | None:
    remaps = g.data.hist.get(REMAP_FIELD)
    if remaps is not None and remaps.increase(now - c.window, now) > 0:
        return "a correctable row remap"
    sample = g.latest
    if sample is not None and any(sample.fields.get(f, 0.0) > 0 for f in SPARE_ROWS_SHORT):
        return "a bank with low or no spare rows left"
    start = now - c.window
    for x in snap.xids.events:
        ev = x.event
        if ev.xid in CORROBORATING_XIDS and ev.timestamp >= start and snap.gpu_of(ev) == g.index:
            return f"XID {ev.xid}"
    return None


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
        self.skips: _Skips | None = None  # the windows surely rejected for a while


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
            skips = memo.skips = _Skips(act)  # a late bucket: the indexes kept moved
        memo.hit = _judge(c, act, b1, skips)
    hit = memo.hit
    if hit is None:
        return None
    return hit[0], None if hit[1] is None else dict(hit[1])


def _judge(c: MemoryTrend, act: Activity, b1: int, skips: _Skips | None = None) -> Hit | None:
    quiet = int(c.quiet // BUCKET)
    if c.signal == "stream":
        return _streaming(c, act, b1, quiet)
    if c.signal != "acceleration":
        width = int(c.window // BUCKET)
        w0 = b1 - width
        x = act.count(w0, b1)
        if x < c.min_active:
            return None
        episodes = act.episodes(w0, b1)
        if episodes < c.min_episodes:
            return None
        start = act.regime_start(b1, quiet)
        assert start is not None  # x > 0
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
    start = act.regime_start(b1, quiet)
    assert start is not None
    # the regime's bookkeeping, found once per look and shared by every window tested
    r = _Regime(act, b1, hi, start, bisect.bisect_right(buckets, start, 0, hi))
    alpha = c.alpha / len(c.windows)
    if skips is not None:
        return skips.judge(c, r, alpha)  # it keeps the peaks itself
    act.keep_peaks(b1)  # the buckets that left each width's window since the last look
    for window in c.windows:
        hit = _accelerated(c, r, int(window // BUCKET), alpha)
        if hit is not None:
            return hit
    if c.scan > 0:
        return _scanned(c, r)
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
    start = act.regime_start(b1, quiet)
    assert start is not None  # hi > 0
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


class _Regime:
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


def _scanned(c: MemoryTrend, r: _Regime) -> Hit | None:
    """The change-point scan: windows of ``k * c.scan`` back from ``b1``, the shortest
    first, while the regime before them is long enough to be a baseline. It runs in an
    active bucket only: a rise shows most where new activity just came (later, the same
    windows hold no more events and a longer baseline), and so it costs nothing on the
    looks between errors. Each width reads the regime's counts by index (``_Regime``) and
    its peak from a sliding maximum kept per width (``Activity.peak_at``) that each look
    extends: nothing is rescanned from the regime's start when a new bucket comes.
    The next widths the regime will grow into are prepared ahead of their first test
    (``Activity.prepare_peaks``)."""
    if r.act.buckets[r.hi - 1] != r.b1 - 1:
        return None  # no activity in the newest bucket
    step = max(int(c.scan // BUCKET), 1)
    least = c.scan_baseline / BUCKET
    fixed = {int(w // BUCKET) for w in c.windows}
    width = step
    while True:
        baseline = r.b1 - width - r.start
        if baseline < least or baseline < c.scan_ratio * width:
            # the next two widths this regime grows into: their peaks are prepared a few
            # buckets a look from now on, so the look that first tests one builds little
            # (two: the one after next has no backlog yet while the baseline is short)
            for ahead in (width, width + step):
                if ahead not in fixed:
                    r.act.prepare_peaks(r.s1, ahead)
            return None
        if width not in fixed:
            hit = _accelerated(c, r, width, c.scan_alpha)
            if hit is not None:
                return hit
        width += step


def _accelerated(
    c: MemoryTrend,
    r: _Regime,
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
    if peak is None:
        peak = act.peak_before(r.s1, lo, width)
    if peak >= max(c.min_active, c.peak_ratio * x):
        return None  # an earlier window of this regime was as busy, and it subsided
    # only as exact as the verdict and its shown p-value need (binomial_tail)
    p = rate_ratio_p_value(x, float(width), y, float(baseline), c.factor, alpha)
    if p >= alpha:
        return None
    if c.dispersion:
        # Overdispersion: the baseline's day counts vary more than a Poisson process's, so
        # the counts carry less evidence than their size says; test them scaled down by the
        # dispersion factor (quasi-Poisson), the recent count rounded down.
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


SKIP_MOST = 144  # buckets (a day): the furthest a look may move and still skip a window
_MARGIN = 1e-7  # a bound's chance must clear alpha by this much (relative): float rounding
_FAR = 1 << 62
_SOON = 8  # buckets: a look tests a window whose bound runs out this soon, if no other
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

    def grow(self, width: int) -> None:
        """One more window, last (the scan's regime grew into it): tested at the next look."""
        self.widths.append(width)
        self.due.append(-1)
        self.due_start.append(-1)
        self.b1_from.append(0)
        self.start_from.append(0)
        heapq.heappush(self.heap, (-1, len(self.widths) - 1))
        heapq.heappush(self.heap_start, (-1, len(self.widths) - 1))

    def _limits(self) -> None:
        """The heaps of dues afresh, and what every bound needs of a look: a ``b1`` and a
        first bucket no earlier than where a bound was found (looks move forward)."""
        self.heap = [(due, i) for i, due in enumerate(self.due)]
        heapq.heapify(self.heap)
        self.heap_start = [(due, i) for i, due in enumerate(self.due_start)]
        heapq.heapify(self.heap_start)
        if self.widths:
            self.lim = (max(self.b1_from), max(self.start_from))

    def test(self, c: MemoryTrend, r: _Regime, alpha: float) -> Hit | None:
        """``_accelerated`` for each window in order, but those still surely rejected: the
        first hit, or None."""
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
                if heap[0][0] >= b1 + _SOON:
                    return None
                # but one whose bound runs out soon is tested now, so that two that run
                # out at once do not both fall to one look
                d, i = heapq.heappop(heap)
                if d != due[i]:
                    return None  # a stale entry (its bound was found again since)
                due[i] = -1
                heapq.heappush(heap, (-1, i))
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
        self.tested = len(order)
        spread = len(order) == len(self.widths)
        b0 = act.buckets[r.hi - 1] + 1
        widths = self.widths
        for k, i in enumerate(order):
            width = widths[i]
            w0 = b1 - width
            counts = act.window_at(r.s1, r.hi, w0) if w0 > start else None
            hit = _accelerated(c, r, width, alpha, counts)
            if hit is not None:
                for j in order[k:]:  # tested again at the next look
                    due[j] = -1
                self._limits()
                return hit
            # bounds that begin at one look (the first, or after the regime's first bucket
            # moved) end spread over the day, so no later look tests them all again at once
            most = SKIP_MOST
            if spread or not self.b1_from[i]:
                most = SKIP_MOST * (i + 1) // len(widths)
            a = _budget(c, r, width, alpha, most, counts)
            due[i] = b0 + a
            due_start[i] = start + a
            self.b1_from[i] = b1
            self.start_from[i] = start
            if len(order) < len(widths):
                heapq.heappush(heap, (due[i], i))
                heapq.heappush(heap_start, (due_start[i], i))
        if len(order) == len(widths) or len(heap) + len(heap_start) > 8 * len(widths):
            self._limits()
        else:
            self.lim = (max(lim[0], b1), max(lim[1], start))
        return None


class _Skips:
    """One rule's bounds on one GPU's activity (kept in its ``JudgeMemo``): which windows a
    look need not test because an earlier look proved they stay rejected (``_Group``).
    Most looks then test no window at all; the verdicts are those of ``_judge`` without it
    (a bound only ever skips a window whose test would return None)."""

    __slots__ = ("act", "ahead", "epoch", "fixed", "kept", "rooms", "scan", "top")

    def __init__(self, act: Activity) -> None:
        self.act = act
        self.epoch = act.epoch
        self.fixed: _Group | None = None
        self.scan = _Group([])
        self.top = -1  # the scan's widths: step, 2 step, ... top * step (-1: none yet)
        self.rooms = (0, 0)  # b1 - start: the widths stay while it is in this range
        self.ahead: list[int] = []  # the next widths of the scan, to prepare (prepare_peaks)
        self.kept = False  # whether the last look kept the peaks (Activity.keep_peaks)

    def judge(self, c: MemoryTrend, r: _Regime, alpha: float) -> Hit | None:
        """The fixed windows, then the scan (``_scanned``), skipping what is bounded; and
        the peaks' upkeep (``Activity.keep_peaks``), but at a look that tested a window
        right after one that kept them: the upkeep only spreads the work of keeping the
        peaks over the looks (a peak asked catches up itself), so it waits a look rather
        than add to one that tests. The scan's next widths are prepared (``prepare_peaks``)
        at a look that tests nothing, for the same reason."""
        act = r.act
        hit = self._test(c, r, alpha)
        assert self.fixed is not None
        if self.fixed.tested + self.scan.tested:
            if not self.kept:
                act.keep_peaks(r.b1, half=True)
            self.kept = not self.kept
            return hit
        act.keep_peaks(r.b1, half=True)
        self.kept = True
        if self.ahead:
            for width in self.ahead:
                act.prepare_peaks(r.s1, width)
            self.ahead = []
        return hit

    def _test(self, c: MemoryTrend, r: _Regime, alpha: float) -> Hit | None:
        act = r.act
        self.scan.tested = 0
        fixed = self.fixed
        if fixed is None:
            fixed = self.fixed = _Group([int(w // BUCKET) for w in c.windows])
        hit = fixed.test(c, r, alpha)
        if hit is not None or c.scan <= 0:
            return hit
        if act.buckets[r.hi - 1] != r.b1 - 1:
            return None  # no activity in the newest bucket (as _scanned)
        room = r.b1 - r.start
        rooms = self.rooms
        if rooms[0] <= room < rooms[1]:
            return self.scan.test(c, r, c.scan_alpha)  # the same widths as the last look
        step = max(int(c.scan // BUCKET), 1)
        least = c.scan_baseline / BUCKET
        ratio = c.scan_ratio
        top = max(self.top, 0)
        # _scanned's loop condition for the width k * step (monotone in k)
        while top > 0 and (room - top * step < least or room - top * step < ratio * top * step):
            top -= 1
        while not (
            room - (top + 1) * step < least or room - (top + 1) * step < ratio * (top + 1) * step
        ):
            top += 1
        # the same condition as a least room (an int compared with a float is compared
        # exactly, so room - k step >= f is room >= k step + ceil(f)): the widths stay
        # those up to top while room is in [rooms[0], rooms[1])
        least_room = math.ceil(least)
        self.rooms = (
            top * step + max(least_room, math.ceil(ratio * top * step)) if top else -_FAR,
            (top + 1) * step + max(least_room, math.ceil(ratio * (top + 1) * step)),
        )
        if top != self.top:
            # the regime grew into a width (or out of one): the next two are prepared
            # ahead of their first test, as _scanned does
            fixed_widths = fixed.widths
            if top == self.top + 1 and self.top >= 0:  # grew by one (once in days)
                if top * step not in fixed_widths:
                    self.scan.grow(top * step)
            else:
                widths = [k * step for k in range(1, top + 1) if k * step not in fixed_widths]
                self.scan = _Group(widths, self.scan)
            self.top = top
            # prepared at the next look that tests nothing (this one tests the new width)
            self.ahead = [w for w in ((top + 1) * step, (top + 2) * step) if w not in fixed_widths]
        return self.scan.test(c, r, c.scan_alpha)


def _budget(
    c: MemoryTrend,
    r: _Regime,
    width: int,
    alpha: float,
    most: int,
    counts: tuple[int, int, int, int] | None,
) -> int:
    """How far looks may move on from this one while the window of ``width`` stays surely
    rejected (``_Group``): at most ``most``; -1: test it at the next look. ``counts``: the
    window's ``Activity.window_at``.

    Each bound is one of ``_accelerated``'s gates at the window's worst case after the
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
    return max(a, _rate_budget(c, x, y, width, baseline, alpha, most))


def _rate_budget(
    c: MemoryTrend, x: int, y: int, width: int, baseline: int, alpha: float, most: int
) -> int:
    """The most buckets ``a`` for which the window's exact test surely finds no rise with
    ``x + a`` of ``x + y`` active buckets in it and a baseline ``a`` buckets longer; -1
    where even this look's counts are not surely rejected by it."""
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
    level = alpha * (1.0 + _MARGIN)
    for a in (guess, guess // 2, 0) if guess > 0 else (0,):
        if _rate_rejects(x, y, a, fw, baseline, level):
            return a
    return -1


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


class _Evaluator(Evaluator):
    __slots__ = (
        "c",
        "certified_hits",
        "certs",
        "look",
        "memos",
        "node",
        "restored",
        "sustained",
    )

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, MemoryTrend)
        self.look = Recheck(RECHECK)
        self.certs = mc.Certificates()
        self.certified_hits: Hits = {}  # the last look's (certified), while nothing moved
        self.restored = False  # saved XIDs taken back (or adopted from a reload)
        self.sustained: dict[int, dict[str, Any]] = {}  # GPU -> its hit's values, while held
        self.memos: dict[int, JudgeMemo] = {}  # GPU -> its last verdict
        self.node = NodeLook()  # signal: node, while no memory XID is in its window

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator):
            self.certs.adopt(old.certs)
            self.restored = True
            if old.c.windows == self.c.windows and old.c.min_active == self.c.min_active:
                self.sustained = old.sustained

    def restore(self, store: StateStore, snap: Snapshot, now: float) -> None:
        if self.c.signal != "certified" or self.restored:
            return
        self.restored = True
        records, bad = store.load_episodes(self.rule.name, CERTIFIED_SIGNATURE)
        bad += self.certs.load(records, snap, now)
        if bad:
            log.warning(
                "rule %s: %d saved XID(s) made no sense and were dropped", self.rule.name, bad
            )
            self.certs.dirty = True  # rewrite the saved state without them

    def save(self, store: StateStore, now: float) -> None:
        certs = self.certs
        if certs.dirty and store.save_episodes(
            self.rule.name, CERTIFIED_SIGNATURE, certs.records()
        ):
            certs.dirty = False

    def _certified(self, snap: Snapshot, now: float, fresh: bool) -> Result:
        c = self.c
        certs = self.certs
        targets, unknown = snap.targets(self.rule)
        fields = mc.FIELDS | {c.field}
        if not fresh and certs.unchanged(snap, fields, now):
            # nothing it reads moved since a recent look: the same verdict, for the GPUs
            # still looked at (evidence only ages out over days: looked at every 5 min)
            indexes = {g.index for g in targets}
            return {k: v for k, v in self.certified_hits.items() if k[0] in indexes}, unknown
        certs.take(snap, now, c.window)
        hits: Hits = {}
        for g in targets:
            why = mc.certified(certs, g, c.field, c.window, now)
            if why is not None:
                hits[(g.index, -1, -1)] = (1.0, {"evidence": why})
        self.certified_hits = hits
        return dict(hits), unknown

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        if c.signal == "certified":
            return self._certified(snap, now, fresh)
        if c.signal == "node":
            return self._node(snap, now)
        look = self.look
        corroborated = c.signal == "corroborated"
        if not active and not fresh and not corroborated and look.node_quiet(snap, c.field, now):
            return NO_HITS, set()
        targets, unknown = snap.targets(self.rule)
        hits: Hits = {}
        for g in targets:
            h = g.data.hist.get(c.field)
            if h is None:
                continue
            act = h.activity
            if not act.buckets:
                continue
            if not corroborated and look.unchanged(h, act.version, now):
                continue
            memo = self.memos.get(g.index)
            if memo is None:
                memo = self.memos[g.index] = JudgeMemo()
            hit = judge(c, act, now, memo)
            if c.signal == "acceleration":
                hit = self._sustain(g.index, act, now, hit)
            if hit is not None and corroborated:
                why = _corroboration(c, g, snap, now)
                if why is None:
                    hit = None
                else:
                    assert hit[1] is not None
                    hit[1]["evidence"] = why
            look.record(h, act.version, now, hit is not None)
            if hit is not None:
                limited = note(snap, c.field, g.index, now, c.window)
                if limited:  # a new dict: the memo and the sustained verdict keep theirs
                    hit = hit[0], {**(hit[1] or {}), "rate_limited": limited}
                hits[(g.index, -1, -1)] = hit
        return hits, unknown

    def _node(self, snap: Snapshot, now: float) -> Result:
        c = self.c
        b1 = bucket_of(now) + 1
        b0 = b1 - int(c.window // BUCKET)
        acts = self.node.look(snap, c.field, b0, b1)
        with_xids = with_memory_xids(snap, acts, b0)
        found = self.node.node_wide() if with_xids is acts else node_wide_gpus(with_xids, b0, b1)
        gpus = sorted(set(found) | xid_event_gpus(snap, b0))
        if not gpus:
            return NO_HITS, set()
        values: dict[str, Any] = {"gpus": ", ".join(map(str, gpus))}
        return {NODE_KEY: (float(len(gpus)), values)}, set()

    def _sustain(self, gpu: int, act: Activity, now: float, hit: Hit | None) -> Hit | None:
        """An acceleration holds on while its evidence keeps arriving: after a hit, the
        condition stays true as long as the shortest window still holds ``min_active``
        active buckets (a leak that went on at its new rate is no longer a *rise* to the
        test, and its peak veto sees an earlier window as busy; yet nothing subsided)."""
        if hit is not None:
            assert hit[1] is not None
            self.sustained[gpu] = hit[1]
            return hit
        last = self.sustained.get(gpu)
        if last is None:
            return None
        c = self.c
        width = int(min(c.windows) // BUCKET)
        b1 = bucket_of(now) + 1
        x = act.count(b1 - width, b1)
        if x < c.min_active:
            del self.sustained[gpu]
            return None
        values = dict(last)
        values.update(
            active=x,
            episodes=act.episodes(b1 - width, b1),
            window=format_duration(width * BUCKET),
            recent_rate=round(x / (width * BUCKET / 86400.0), 2),
        )
        return float(x), values


class MemoryTrendKind(ConditionKind):
    key = "memory_trend"
    keys = (
        "signal",
        "field",
        "window",
        "factor",
        "alpha",
        "min_active",
        "min_episodes",
        "min_baseline",
        "quiet",
        "peak_ratio",
        "dispersion",
        "scan",
        "scan_alpha",
        "scan_baseline",
        "scan_ratio",
        "stream",
    )
    placeholders = frozenset(
        {
            "field",
            "window",
            "active",
            "episodes",
            "regime_age",
            "evidence",
            "p_value",
            "baseline_rate",
            "recent_rate",
            "gpus",
            "rate_limited",
            "stream_age",
        }
    )

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        r = p.r
        values: dict[str, Any] = {}
        if "signal" in keys:
            values["signal"] = r.string(keys["signal"], f"{what}.signal", SIGNALS)
        if "field" in keys:
            found = p.field(keys["field"], f"{what}.field", counter=True, allow_link=False)
            values["field"] = found[0] if found is not None else None
        if "window" in keys:
            values["windows"] = self._windows(p, keys["window"], f"{what}.window")
        for name in ("min_baseline", "quiet", "scan", "scan_baseline", "stream"):
            if name in keys:
                values[name] = p.window(keys[name], f"{what}.{name}")
        if "factor" in keys:
            values["factor"] = r.number(keys["factor"], f"{what}.factor", minimum=1.0)
        for name in ("alpha", "scan_alpha"):
            if name in keys:
                values[name] = r.number(keys[name], f"{what}.{name}", minimum=1e-12)
                if values[name] is not None and values[name] >= 0.5:
                    p.error(keys[name], f"{what}.{name}: a small chance, below 0.5 (e.g. 1e-4)")
                    values[name] = None
        if "scan_ratio" in keys:
            values["scan_ratio"] = r.number(keys["scan_ratio"], f"{what}.scan_ratio", minimum=0.0)
        for name in ("min_active", "min_episodes"):
            if name in keys:
                values[name] = r.integer(keys[name], f"{what}.{name}", 1, 10000)
        if "peak_ratio" in keys:
            values["peak_ratio"] = r.number(keys["peak_ratio"], f"{what}.peak_ratio", minimum=0.0)
        if "dispersion" in keys:
            values["dispersion"] = r.boolean(keys["dispersion"], f"{what}.dispersion")
        if any(v is None for v in values.values()):
            return None
        c = MemoryTrend(**values)
        if c.signal == "certified":
            if c.window > MAX_WINDOW:
                p.error(body, f"{what}: window must be at most 30d (history kept)")
                return None
        elif c.window + c.min_baseline > MAX_WINDOW:
            p.error(body, f"{what}: window + min_baseline must be at most 30d (history kept)")
            return None
        return c

    @staticmethod
    def _windows(p: BodyReader, node: Node, what: str) -> tuple[float, ...] | None:
        items = p.r.sequence(node, what) if node.is_sequence() else [node]
        if not items:
            if items is not None:
                p.error(node, f"{what}: name at least one window")
            return None
        out: list[float] = []
        for item in items:
            w = p.window(item, what)
            if w is None:
                return None
            if w < BUCKET:
                p.error(item, f"{what}: at least 10m (one activity bucket), got {item.value!r}")
                return None
            out.append(w)
        return tuple(sorted(set(out)))

    def schema(self) -> sp.Schema:
        counters = sp.fields(links=False)
        return sp.body(
            {
                "signal": {"enum": list(SIGNALS), "default": "acceleration"},
                "field": {**counters, "default": "ecc_corrected_volatile_dev"},
                "window": {
                    "oneOf": [
                        sp.DURATION,
                        {"type": "array", "items": sp.DURATION, "minItems": 1},
                    ],
                    "default": ["1d", "3d"],
                },
                "factor": {"type": "number", "minimum": 1, "default": 1},
                "alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.003,
                },
                "min_active": {"type": "integer", "minimum": 1, "default": 3},
                "min_episodes": {"type": "integer", "minimum": 1, "default": 3},
                "min_baseline": sp.duration("1d"),
                "quiet": sp.duration("28d"),
                "peak_ratio": {"type": "number", "minimum": 0, "default": 0.3},
                "dispersion": {"type": "boolean", "default": False},
                "scan": sp.DURATION,
                "scan_alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.1,
                },
                "scan_baseline": sp.duration("7d"),
                "scan_ratio": {"type": "number", "minimum": 0, "default": 1.5},
                "stream": sp.duration("2d"),
            },
            "Device-memory errors as activity (10-minute buckets, episodes, regimes): a "
            "significant acceleration within a regime (exact conditional binomial test), new "
            "activity, or activity the GPU corroborates (a correctable remap, a bank low on "
            "spare rows, XID 92 or 63); errors without an hour's break for longer than "
            "stream, after earlier episodes of their regime (signal stream); or, as one node "
            "alert, activity on 3 or more GPUs within minutes (signal node).",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, MemoryTrend)
        if c.signal == "certified":
            return Needs(gpu_counters=frozenset({c.field, *mc.FIELDS}), xid_window=mc.NODE_SPAN)
        if c.signal == "corroborated":
            return Needs(gpu_counters=frozenset({c.field, REMAP_FIELD}), xid_window=c.window)
        if c.signal == "node":
            return Needs(gpu_counters=frozenset({c.field}), xid_window=c.window)
        # XID 92 within the window says the count is a lower bound (rate_limited)
        return Needs(gpu_counters=frozenset({c.field}), xid_window=lookback(c.field, c.window))

    def trigger(self, c: Condition) -> Trigger:
        assert isinstance(c, MemoryTrend)
        return "sample" if c.signal in ("corroborated", "certified") else "periodic"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, MemoryTrend)
        return {"field": c.field, "window": format_duration(c.window), "rate_limited": ""}


KIND = MemoryTrendKind()
