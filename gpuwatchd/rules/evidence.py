"""Evidence of memory errors per GPU: activity buckets, episodes and regimes.

Raw error counts are heavy-tailed (one bad job can log a million corrected errors in an
hour), so the memory-trend condition does not read counts. It reads *activity*: time is
cut into 10-minute buckets and a bucket is active when the counter grew in it. Runs of
active buckets with less than an hour of silence between them form one *episode*. A
*regime* starts at the first active bucket after a long silence (14 days by default); a
step from silence to a steady rate is a regime, not an acceleration.

Activity is kept as the sorted list of active bucket numbers (a few bytes per active
bucket, nothing for a GPU without errors). It is rebuilt after a restart from the counter
history the ``StateStore`` keeps (points every 5 minutes, so 10-minute buckets come back
exactly). Counter resets count as no growth.
"""

from __future__ import annotations

import bisect
import math
from collections import deque

BUCKET = 600.0  # seconds per activity bucket
EPISODE_GAP = 6  # buckets of silence (1 hour) that separate two episodes
RETENTION_BUCKETS = int(36 * 86400 / BUCKET)
PREPARE_STEP = 4  # buckets a look takes into a sliding maximum prepared ahead of its use


def bucket_of(t: float) -> int:
    return int(t // BUCKET)


class Activity:
    """The active buckets of one counter, oldest first.

    Every question the memory rules ask costs O(log n) in the number of kept buckets,
    whatever the history: the episode starts are kept as a running count beside the
    buckets, the regime breaks (gaps longer than ``quiet``) as a list per ``quiet`` asked
    about, and the peak of a regime as a sliding maximum of window counts per width, which
    each look extends as buckets leave its window (``keep_peaks``). A late point (a clock
    step) rebuilds them once."""

    __slots__ = (
        "_breaks",
        "_dropped",
        "_kept",
        "_lag",
        "_peaks",
        "_starts",
        "_turn",
        "buckets",
        "epoch",
        "version",
    )

    def __init__(self) -> None:
        self.buckets: list[int] = []
        self.version = 0
        self._dropped = 0  # buckets dropped from the front, ever: absolute = local + this
        # bumped when a late bucket lands in the middle: what a caller kept about the
        # buckets (indexes, counts) no longer holds, and the caches here start over
        self.epoch = 0
        # _starts[i]: episode starts (gap EPISODE_GAP) among buckets[: i + 1], plus a constant
        self._starts: list[int] = []
        self._breaks: dict[int, list[int]] = {}  # quiet -> absolute i: a gap > quiet before i
        self._peaks: dict[int, _Peaks] = {}  # window width -> its window counts
        self._kept: list[tuple[int, _Peaks]] = []  # _peaks' items, for keep_peaks
        self._lag: list[tuple[int, _Peaks]] = []  # those being prepared (lag), or were
        self._turn = 0  # which part of the widths the last look kept (keep_peaks)

    def mark(self, t: float) -> None:
        """The counter grew at time ``t``."""
        b = bucket_of(t)
        buckets = self.buckets
        if buckets and b <= buckets[-1]:
            if b == buckets[-1] or b in buckets:
                return
            bisect.insort(buckets, b)  # a late point (clock step): keep the order
            self._rebuild()
        else:
            starts = self._starts
            if buckets:
                prev = buckets[-1]
                starts.append(starts[-1] + (b - prev > EPISODE_GAP))
                i = len(buckets) + self._dropped
                for quiet, breaks in self._breaks.items():
                    if b - prev > quiet:
                        breaks.append(i)
            else:
                starts.append(starts[-1] + 1 if starts else 1)
            buckets.append(b)
            if len(buckets) > 64 and buckets[0] < b - RETENTION_BUCKETS:
                k = bisect.bisect_left(buckets, b - RETENTION_BUCKETS)
                del buckets[:k]
                del starts[:k]
                self._dropped += k
        self.version += 1

    def _rebuild(self) -> None:
        self.epoch += 1
        self._breaks.clear()
        self._peaks.clear()
        self._peaks_changed()
        starts: list[int] = []
        prev: int | None = None
        n = 0
        for b in self.buckets:
            n += prev is None or b - prev > EPISODE_GAP
            starts.append(n)
            prev = b
        self._starts = starts

    def restore(self, points: list[tuple[float, float]]) -> None:
        """Rebuild from counter points (time, reset-adjusted value), oldest first."""
        prev: float | None = None
        for t, v in points:
            if prev is not None and v > prev:
                self.mark(t)
            prev = v

    def count(self, b0: int, b1: int) -> int:
        """Active buckets in ``[b0, b1)``."""
        buckets = self.buckets
        return bisect.bisect_left(buckets, b1) - bisect.bisect_left(buckets, b0)

    def episodes(self, b0: int, b1: int, gap: int = EPISODE_GAP) -> int:
        """Episodes with an active bucket in ``[b0, b1)`` (one that began before ``b0`` and
        goes on into the range counts)."""
        buckets = self.buckets
        lo = bisect.bisect_left(buckets, b0)
        hi = bisect.bisect_left(buckets, b1)
        if hi <= lo:
            return 0
        if gap == EPISODE_GAP:  # the first bucket in range always starts one
            return 1 + self._starts[hi - 1] - self._starts[lo]
        n = 0
        prev: int | None = None
        for i in range(lo, hi):
            b = buckets[i]
            if prev is None or b - prev > gap:
                n += 1
            prev = b
        return n

    def episode_start(self, i: int) -> int:
        """The first bucket of the episode that ``buckets[i]`` belongs to (or the first
        bucket kept, where the episode began before it): one bisect on the running count of
        episode starts."""
        starts = self._starts
        return self.buckets[bisect.bisect_left(starts, starts[i], 0, i + 1)]

    def regime_start(self, b1: int, quiet: int) -> int | None:
        """The first active bucket of the regime that holds at ``b1``: the first one after
        at least ``quiet`` silent buckets (or the first one kept). None without activity."""
        hi = bisect.bisect_left(self.buckets, b1)
        return self.buckets[self.regime_index(hi, quiet)] if hi else None

    def regime_index(self, hi: int, quiet: int) -> int:
        """``regime_start`` by index, for a look that found ``hi`` (the index past the last
        bucket before its ``b1``, at least 1) already: the index of the regime's first
        bucket, so the regime's counts read from it without another bisect."""
        breaks = self._breaks.get(quiet)
        if breaks is None:
            breaks = self._scan_breaks(quiet)
        d = self._dropped
        k = bisect.bisect_right(breaks, hi - 1 + d) - 1
        return max(breaks[k] - d, 0) if k >= 0 else 0

    def _scan_breaks(self, quiet: int) -> list[int]:
        if len(self._breaks) >= 8:  # a handful of rules ask; never grow without bound
            self._breaks.clear()
        buckets = self.buckets
        d = self._dropped
        breaks = [i + d for i in range(1, len(buckets)) if buckets[i] - buckets[i - 1] > quiet]
        self._breaks[quiet] = breaks
        return breaks

    def dispersion(self, b0: int, b1: int, day: int = 144, most: int = 30) -> float:
        """How much more the active buckets per ``day`` buckets in ``[b0, b1)`` (its last
        ``most`` whole days) vary than a Poisson process's, leaving out one change of rate:
        about 1 for a Poisson process, or for one whose rate stepped once (a leak's weekly
        phase, then its daily one), far above for activity that comes in sessions or whose
        rate wanders. 1.0 with fewer than 2 days or none active (never below 1).

        The day counts are cut where a step of the rate fits them best (``change_split``:
        each side at least two days; none with fewer than four days), and the dispersion is
        the quasi-Poisson one of that two-rate fit: Pearson's chi-square of the day counts
        about their side's mean, over the degrees of freedom left (days - 2). A stretch whose
        rate stepped thus reads as a change of mean, not as dispersion; what a step leaves
        is the day-to-day spread within each side. At most ``most`` days: 2 * ``most``
        bisects and a pass over the day counts."""
        days = min((b1 - b0) // day, most)
        if days < 2:
            return 1.0
        counts = [self.count(b1 - (k + 1) * day, b1 - k * day) for k in range(days - 1, -1, -1)]
        return day_count_dispersion(counts)

    def peak(self, b0: int, b1: int, width: int) -> int:
        """The most active buckets any ``width``-bucket window inside ``[b0, b1)`` held."""
        buckets = self.buckets
        lo = bisect.bisect_left(buckets, b0)
        return self.peak_at(lo, bisect.bisect_left(buckets, b1), width)

    def peak_at(self, lo: int, hi: int, width: int) -> int:
        """``peak`` over the buckets ``[lo, hi)`` (indexes into ``buckets``).

        A window that reaches back before ``buckets[lo]`` (its end before
        ``buckets[lo] + width``) holds every bucket from ``lo`` to its end, so the best of
        those is the last one's count. Every later window lies inside the kept history, and
        its count does not depend on ``lo``: those counts are kept per width (``_Peaks``),
        one per bucket, and their maximum over ``[k, hi)`` is a sliding maximum (a
        monotone deque). The first ask builds them; from then on every look takes in the
        buckets that left the window since the last (``keep_peaks``), so while looks move
        forward in time (``lo`` and ``hi`` never go back) an ask takes in none,
        whatever the history: a new regime or retention moving ``lo`` only slides the
        window. A look at the past starts the deque over (O(n), tests and benches)."""
        if hi <= lo:
            return 0
        buckets = self.buckets
        k = bisect.bisect_left(buckets, buckets[lo] + width, lo, hi)
        best = k - lo  # the windows that reach back before lo: the last one holds k - lo
        if k >= hi:
            return best
        d = self._dropped
        pk = self._peaks.get(width)
        if pk is not None and pk.hi == hi + d and pk.k == k + d:
            queue = pk.queue  # as of the last ask or look: nothing to take in or drop
            return max(best, pk.counts[queue[0] - pk.base]) if queue else best
        if pk is None or pk.epoch != self.epoch or pk.base > k + d:
            if len(self._peaks) >= 64:  # the scan's widths too; never grow without bound
                self._peaks.clear()
            pk = self._peaks[width] = _Peaks(self.epoch, k + d)
            self._peaks_changed()
        return max(best, pk.max(buckets, d, k, hi, width))

    def window_at(self, s1: int, hi: int, w0: int) -> tuple[int, int, int, int]:
        """One look's counts for the window ``[w0, buckets[hi])`` of a regime whose first
        bucket is ``buckets[s1 - 1]`` (``s1 <= hi``, ``buckets[s1 - 1] < w0``): the active
        buckets in the window, those between the regime's first bucket and the window,
        the window's episodes, and the index where the window begins (for ``peak_before``).
        One bisect and a few indexes: the memory rules' scan asks this of every width."""
        lo = bisect.bisect_left(self.buckets, w0, s1, hi)
        if hi <= lo:
            return 0, lo - s1, 0, lo
        starts = self._starts
        return hi - lo, lo - s1, 1 + starts[hi - 1] - starts[lo], lo

    def peaks_kept(self, width: int) -> bool:
        """Whether the sliding maximum of ``width`` is kept (built, and not since a late
        bucket): asking ``peak_before`` then costs the buckets that came since it was last
        asked, not a build over the whole regime."""
        return width in self._peaks  # a late bucket clears them all (_rebuild)

    def keep_peaks(self, b1: int, part: int = 1) -> None:
        """Every kept width takes in the buckets that a look at ``b1`` (the bucket after
        its newest) or later no longer holds in its window: those before ``b1 - width``.
        Buckets leave a window one by one as time passes, so a look once per bucket takes
        in at most one per width, and a look that asks a peak catches up none. With
        ``part``, one width in ``part`` (the next ones at the next calls, in turn): for
        looks that ask a peak rarely, that share of the upkeep a look, and an ask catches
        up the few buckets its width is behind."""
        buckets = self.buckets
        d = self._dropped
        n = len(buckets)
        right = bisect.bisect_right
        kept = self._kept
        if part > 1:
            turn = self._turn = (self._turn + 1) % part
            kept = kept[turn::part]
        for width, pk in kept:
            if pk.lag:
                continue  # being prepared: below, at every call
            i = pk.hi - d
            limit = b1 - width
            if i >= 0 and (i >= n or buckets[i] >= limit):
                continue  # nothing left its window since
            base = pk.base
            if i < 0 or d - base > 4096:
                pk.advance(buckets, d, limit, width)
                continue
            # _Peaks.advance inline (a call costs about as much as the bucket it takes in)
            counts = pk.counts
            queue = pk.queue
            while i < n and buckets[i] < limit:
                a = i + d - base
                if a == len(counts):
                    counts.append(i - right(buckets, buckets[i] - width, 0, i) + 1)
                k = counts[a]
                while queue and counts[queue[-1] - base] <= k:
                    queue.pop()
                queue.append(i + d)
                i += 1
            pk.hi = i + d
        if self._lag:  # widths prepared ahead of their first ask: a few buckets every call
            lag = self._lag = [(width, pk) for width, pk in self._lag if pk.lag]
            for width, pk in lag:
                i = pk.hi - d
                limit = b1 - width
                if i < 0 or (i < n and buckets[i] < limit):
                    pk.advance(buckets, d, limit, width)

    def peaks_behind(self, b1: int) -> dict[int, int]:
        """The most buckets a kept sliding maximum would still take in for a look whose
        newest bucket is ``b1 - 1``, by width: what such a look could have to catch up
        (tests). 0 right after a whole ``keep_peaks`` (``part`` 1), but for a width being
        prepared; after a share of it, 0 for the widths whose turn it was."""
        buckets = self.buckets
        d = self._dropped
        behind = {}
        for width, pk in self._peaks.items():
            i = max(pk.hi - d, 0)
            behind[width] = max(bisect.bisect_left(buckets, b1 - width, i) - i, 0)
        return behind

    def prepare_peaks(self, s1: int, width: int) -> None:
        """Start keeping the sliding maximum of ``width`` over the regime whose first
        bucket is ``buckets[s1 - 1]``, before any look asks for it (the scan's next width,
        which the regime grows into in a few days): from then on each look takes in
        at most ``PREPARE_STEP`` of the buckets it has to count, so no single look pays the
        build over the regime (a look that asks before it is done pays what is left)."""
        if len(self._peaks) >= 64 or self.peaks_kept(width):
            return
        buckets = self.buckets
        first = buckets[s1 - 1]
        k = bisect.bisect_left(buckets, first + width, s1 - 1)
        pk = self._peaks[width] = _Peaks(self.epoch, k + self._dropped)
        pk.lag = True
        self._peaks_changed()

    def _peaks_changed(self) -> None:
        """A width kept, dropped or started over: the lists ``keep_peaks`` walks."""
        self._kept = list(self._peaks.items())
        self._lag = [(width, pk) for width, pk in self._kept if pk.lag]

    def peak_before(self, s1: int, lo: int, width: int) -> int:
        """The regime's peak before the window that ``window_at`` found begins at ``lo``:
        the most active buckets any ``width`` buckets held from the regime's first bucket
        (``buckets[s1 - 1]``) to the window (``peak_at``). The costliest count of a look
        (a sliding maximum kept per width), so the rate test asks it last."""
        return self.peak_at(s1 - 1, lo, width)

    def peak_floor(self, first: int, lo: int, width: int) -> int:
        """A lower bound on ``peak_before`` for every later look whose regime begins at
        bucket ``first`` or before and whose window begins at index ``lo`` or later: the
        most active buckets of the windows kept for ``width`` (``_Peaks``, as far as they
        have come) that end in ``[first + width, buckets[lo])``. Those windows lie after
        ``first`` (retention drops none of their buckets) and before any such window, and
        their maximum is the deque's first index past ``first + width``: no catching up,
        a few steps (the deque holds the suffix maxima). 0 for a width not kept."""
        pk = self._peaks.get(width)
        if pk is None:
            return 0
        d = self._dropped
        k = bisect.bisect_left(self.buckets, first + width) + d
        end = min(pk.hi, lo + d)
        for i in pk.queue:
            if i >= end:
                break
            if i >= k:
                return pk.counts[i - pk.base]
        return 0

    def majority_episode_end(self, lo: int, hi: int) -> int | None:
        """The last bucket of the episode (gap ``EPISODE_GAP``) that holds more than half
        of the active buckets ``[lo, hi)`` (indexes; one that began before ``lo`` counts
        with its buckets from ``lo`` on), or None where no episode does. It walks the
        range's episodes, one bisect on the running count of episode starts each, and
        stops as soon as the buckets left are too few to hold a majority: at most as many
        steps as the range has episodes, never more than its buckets."""
        n = hi - lo
        starts = self._starts
        i = lo
        while 2 * (hi - i) > n:
            j = bisect.bisect_right(starts, starts[i], i, hi)  # past the episode of i
            if 2 * (j - i) > n:
                return self.buckets[j - 1]
            i = j
        return None

    def episodes_at(self, lo: int, hi: int) -> int:
        """``episodes`` (gap ``EPISODE_GAP``) over the buckets ``[lo, hi)`` (indexes)."""
        if hi <= lo:
            return 0
        return 1 + self._starts[hi - 1] - self._starts[lo]


class _Peaks:
    """One window width's counts: ``counts[i - base]`` active buckets in the ``width``
    buckets that end with bucket ``i`` (absolute index), and a monotone deque of the
    indexes in ``[k, hi)`` whose counts no later index beats (its front: the maximum).

    Built at the first look that asks (``Activity.peak_at``); from then on ``advance``
    takes in each bucket as it leaves the window (``Activity.keep_peaks``, at every look),
    so an ask finds the counts and the deque current, not behind by all the buckets since
    the width was last asked."""

    __slots__ = ("base", "counts", "epoch", "hi", "k", "lag", "queue")

    def __init__(self, epoch: int, base: int) -> None:
        self.epoch = epoch
        self.base = base
        self.counts: list[int] = []
        self.queue: deque[int] = deque()
        self.k = base
        self.hi = base
        self.lag = False  # prepared ahead of its first ask: catching up PREPARE_STEP a look

    def _take(self, buckets: list[int], d: int, hi: int, width: int) -> None:
        """Counts and the deque up to ``hi`` (absolute, past ``self.hi``)."""
        counts = self.counts
        base = self.base
        right = bisect.bisect_right
        for i in range(base + len(counts), hi):  # counts of the buckets not yet seen
            j = i - d
            counts.append(j - right(buckets, buckets[j] - width, 0, j) + 1)
        queue = self.queue
        for i in range(self.hi, hi):
            n = counts[i - base]
            while queue and counts[queue[-1] - base] <= n:
                queue.pop()
            queue.append(i)
        self.hi = hi

    def advance(self, buckets: list[int], d: int, limit: int, width: int) -> None:
        """Take in the buckets before bucket ``limit``: no window of a look from now on
        (at ``limit + width`` or later) begins before them. At most one a call while
        looks come once a bucket; ``PREPARE_STEP`` at most while ``lag``."""
        if self.hi < d:  # retention dropped all it had come to: start at the front
            self.counts.clear()
            self.queue.clear()
            self.base = self.hi = self.k = d
        i = self.hi - d
        stop = len(buckets)
        if self.lag:
            stop = min(stop, i + PREPARE_STEP)
        counts = self.counts
        queue = self.queue
        base = self.base
        while i < stop and buckets[i] < limit:
            a = i + d - base
            if a == len(counts):
                counts.append(i - bisect.bisect_right(buckets, buckets[i] - width, 0, i) + 1)
            n = counts[a]
            while queue and counts[queue[-1] - base] <= n:
                queue.pop()
            queue.append(i + d)
            i += 1
        self.hi = i + d
        if self.lag and (i >= len(buckets) or buckets[i] >= limit):
            self.lag = False  # caught up: from now on like any kept width
        if d - base > 4096:  # counts of dropped buckets: no window starts there
            while queue and queue[0] < d:
                queue.popleft()
            del counts[: d - base]
            self.base = d

    def max(self, buckets: list[int], d: int, k: int, hi: int, width: int) -> int:
        """The most any window ending in ``[k, hi)`` (local indexes) held."""
        k += d
        hi += d
        self.lag = False
        queue = self.queue
        if k < self.k or hi < self.hi:  # a look back in time: start over from k
            queue.clear()
            self.hi = k
        counts = self.counts
        if self.base + len(counts) < k:  # none kept is asked for any more: start at k
            counts.clear()
            queue.clear()
            self.base = self.hi = k
        elif self.hi < k:  # the window moved past all the deque holds (a new regime)
            queue.clear()
            self.hi = k
        if hi > self.hi:
            self._take(buckets, d, hi, width)
        while queue and queue[0] < k:
            queue.popleft()
        self.k = k
        base = self.base
        if k - base > 4096:  # the regime moved on (retention, a new one): keep it bounded
            del counts[: k - base]
            base = self.base = k
        return counts[queue[0] - base] if queue else 0


def change_split(counts: list[int]) -> int:
    """Where a step of the rate fits a run of day counts best: the ``k`` (each side at
    least two days) whose two means, ``counts[:k]`` and ``counts[k:]``, give the Poisson
    likelihood its maximum (the likelihood-ratio test's change point; the earliest of
    equals). 0 when the run is shorter than four days."""
    n = len(counts)
    if n < 4:
        return 0
    total = sum(counts)
    best, best_k = -math.inf, 0
    left = sum(counts[:1])
    for k in range(2, n - 1):
        left += counts[k - 1]
        right = total - left
        # sum over sides of S log(S / n): the log-likelihood up to terms every k shares
        ll = (left * math.log(left / k) if left else 0.0) + (
            right * math.log(right / (n - k)) if right else 0.0
        )
        if ll > best + 1e-9:
            best, best_k = ll, k
    return best_k


def day_count_dispersion(counts: list[int]) -> float:
    """The quasi-Poisson dispersion of day counts (oldest first) about a rate that may
    have stepped once (``change_split``): Pearson's chi-square about each side's mean over
    ``len(counts) - 2`` (``- 1`` without a split, under four days). At least 1.0; 1.0 with
    fewer than two days or no activity."""
    n = len(counts)
    if n < 2 or not any(counts):
        return 1.0
    k = change_split(counts)
    sides = (counts[:k], counts[k:]) if k else (counts,)
    chi2 = 0.0
    for side in sides:
        s = sum(side)
        if s:  # a side with no activity fits its mean (0) exactly
            mean = s / len(side)
            chi2 += sum((c - mean) ** 2 for c in side) / mean
    return max(chi2 / (n - len(sides)), 1.0)


def binomial_tail(x: int, n: int, p: float, alpha: float = 0.0) -> float:
    """P(X >= x) for X ~ Binomial(n, p), exactly (to float precision; the terms are
    summed from ``x`` up until they no longer add to it).

    With ``alpha`` (a test at that level), only as exact as the test and its shown p-value
    need, which is usually far fewer terms: a partial sum at or above ``alpha`` once it
    gets there (the tail is at least that), or a partial sum that rounds to the same two
    significant digits (``f"{p:.1e}"``) as every value the rest of the sum could still add
    up to, below ``alpha``. What the rest can add is bounded by a geometric series, as the
    ratio of a term to the one before only shrinks beyond the mode. So the verdict
    (``< alpha``) and the shown value are those of the exact sum."""
    if x <= 0:
        return 1.0
    if x > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    q = 1.0 - p
    log_term = (
        math.lgamma(n + 1)
        - math.lgamma(x + 1)
        - math.lgamma(n - x + 1)
        + x * math.log(p)
        + (n - x) * math.log(q)
    )
    term = math.exp(log_term)
    total = term
    ratio = p / q
    if alpha <= 0.0:
        for k in range(x, n):
            term *= (n - k) / (k + 1) * ratio
            total += term
            if term < total * 1e-12:
                break
        return min(total, 1.0)
    if total >= alpha:
        return total  # the tail is at least its first term: not significant at alpha
    small = 1e-4  # a term this small against the sum: see whether the rest can matter
    for k in range(x, n):
        r = (n - k) / (k + 1) * ratio
        term *= r
        total += term
        if term < total * small:
            if small <= 1e-12:
                break
            # the terms after this one shrink at least as fast as r (the ratios only
            # shrink past the mode): all of them add less than term * r / (1 - r)
            if r < 1.0:
                upper = total + term * r / (1.0 - r)
                if upper < alpha and f"{total:.1e}" == f"{upper:.1e}":
                    return total
            small *= 1e-4
        elif total >= alpha:
            return total  # the tail is at least this: not significant at alpha
    return min(total, 1.0)


def binomial_tail_floor(x: int, n: int, p: float) -> float:
    """A lower bound on ``binomial_tail(x, n, p)`` that costs one ``erfc``: Slud's
    inequality, P(X >= x) >= P(Z >= (x - np) / sqrt(np(1 - p))) for p <= 1/4 and
    np <= x <= n. 0.0 where it does not apply. Lets a test skip the exact sum when the
    chance is surely above its alpha."""
    if not 0.0 < p <= 0.25 or x > n or x < n * p:
        return 0.0
    z = (x - n * p) / math.sqrt(n * p * (1.0 - p))
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def rate_ratio_p_value(x: int, w: float, y: int, b: float, rho: float, alpha: float = 0.0) -> float:
    """The exact conditional test of two Poisson rates (the C-test): the chance of at least
    ``x`` of the ``x + y`` events falling in the recent span ``w`` if the recent rate were
    only ``rho`` times the rate over the earlier span ``b``. Small means "accelerated".
    ``alpha``: only as exact as a test at that level needs (``binomial_tail``)."""
    p0 = rho * w / (rho * w + b)
    return binomial_tail(x, x + y, p0, alpha)
