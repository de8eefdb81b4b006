"""Counter history in memory: change points, reset-adjusted, downsampled with age.

A counter is kept as the points where its value changed, so a counter that does not move
costs one comparison per sample and no memory. Values are *adjusted* for resets: when the
raw value goes down (a driver reload clears the volatile ECC counts), the old value is
added to an offset, exactly like PromQL's ``increase``, so ``value_at(b) - value_at(a)`` is
the growth between ``a`` and ``b`` however often the driver was reloaded.

Old points are thinned: every point of the last ``RAW_SPAN`` is kept, then one point per
minute up to two days, then one per 15 minutes up to the retention (30 days). Of a
thinned bucket the last point is kept, so an increase over a long window is exact to
within one bucket at its start.
"""

from __future__ import annotations

import bisect

from gpuwatchd.rules.evidence import Activity

RAW_SPAN = 2 * 3600.0
TIERS: tuple[tuple[float, float], ...] = ((2 * 86400.0, 60.0), (float("inf"), 900.0))
RETENTION = 30 * 86400.0
DAY = 86400.0
# A fresh history seeded from a lifetime count (``seed``): at most one error a day, in the
# days [install - SEED_FROM, install - SEED_TO).
SEED_FROM = 28 * DAY
SEED_TO = 4 * DAY
SEED_MOST = int((SEED_FROM - SEED_TO) // DAY)


class CounterHistory:
    __slots__ = (
        "_compact_at",
        "activity",
        "last_raw",
        "last_t",
        "offset",
        "resets",
        "retention",
        "ts",
        "version",
        "vs",
    )

    def __init__(self, retention: float = RETENTION) -> None:
        self.ts: list[float] = []
        self.vs: list[float] = []
        self.last_raw: float | None = None
        self.last_t: float | None = None
        self.offset = 0.0
        self.resets = 0
        self.version = 0  # bumps whenever a point is added
        self.retention = retention
        self._compact_at = 512
        self.activity = Activity()  # 10-minute buckets in which the value grew

    def __len__(self) -> int:
        return len(self.ts)

    def add(self, t: float, raw: float) -> bool:
        """Record a sample; True when the (adjusted) value changed."""
        last = self.last_raw
        self.last_t = t
        if raw == last:
            return False
        if last is not None and raw < last:
            self.offset += last
            self.resets += 1
        self.last_raw = raw
        value = raw + self.offset
        vs = self.vs
        if vs and vs[-1] == value:
            return False
        if self.ts and t <= self.ts[-1]:
            # same timestamp (or a clock step back): replace the last point's value
            vs[-1] = value
        else:
            if vs:
                self.activity.mark(t)  # not the first point: that is where history starts
            self.ts.append(t)
            vs.append(value)
        self.version += 1
        if len(self.ts) > self._compact_at:
            self.compact(t)
        return True

    def restore(
        self,
        points: list[tuple[float, float]],
        last_raw: float | None,
        offset: float,
        last_t: float | None,
    ) -> None:
        """Load persisted points (adjusted values) and the reset bookkeeping."""
        points = sorted(points)
        self.ts = [p[0] for p in points]
        self.vs = [p[1] for p in points]
        self.last_raw = last_raw
        self.offset = offset
        self.last_t = last_t
        self.activity = Activity()
        self.activity.restore(points)
        self.version += 1

    def seed(self, t0: float, raw: float, prior: float) -> bool:
        """Start a fresh history (no point yet) with the errors a lifetime count says the
        GPU logged before ``t0``, the first sample (``raw`` its value): ``prior`` errors, at
        most one a day, as evenly spaced points in ``[t0 - SEED_FROM, t0 - SEED_TO)``, so
        that their activity makes the regime the new errors join (and its baseline) instead
        of a regime that begins at ``t0``. The last seeded point has the value ``raw``: the
        first real sample adds nothing, and no window of ``SEED_TO`` or less reaches them.
        True when seeded (points go to the store like any other, so a restart keeps them).
        """
        k = min(int(prior), SEED_MOST)
        if k <= 0 or self.ts:
            return False
        lo = t0 - SEED_FROM
        step = (SEED_FROM - SEED_TO) / (k + 1)
        self.ts = [lo + i * step for i in range(k + 1)]
        self.vs = [raw - k + i for i in range(k + 1)]
        for t in self.ts[1:]:
            self.activity.mark(t)
        self.version += 1
        return True

    @property
    def current(self) -> float | None:
        return self.vs[-1] if self.vs else None

    def value_at(self, t: float) -> float | None:
        """The adjusted value at time ``t`` (that of the last point at or before it);
        the first point's value before the history starts; None when empty."""
        ts = self.ts
        if not ts:
            return None
        i = bisect.bisect_right(ts, t) - 1
        return self.vs[i if i >= 0 else 0]

    def increase(self, start: float, end: float) -> float:
        a = self.value_at(start)
        b = self.value_at(end)
        if a is None or b is None:
            return 0.0
        return b - a

    def changes(self, start: float, end: float) -> int:
        """Points in ``(start, end]``: samples in which the counter grew."""
        ts = self.ts
        lo = bisect.bisect_right(ts, start)
        hi = bisect.bisect_right(ts, end)
        if lo == 0 and hi > 0:
            lo = 1  # the first point is where the history starts, not growth
        return max(hi - lo, 0)

    def points_between(self, start: float, end: float) -> list[tuple[float, float]]:
        ts = self.ts
        lo = bisect.bisect_right(ts, start)
        hi = bisect.bisect_right(ts, end)
        return list(zip(ts[lo:hi], self.vs[lo:hi], strict=True))

    def compact(self, now: float) -> None:
        """Thin old points and drop those past the retention."""
        ts, vs = self.ts, self.vs
        horizon = now - self.retention
        keep_t: list[float] = []
        keep_v: list[float] = []
        n = len(ts)
        # the last point at or before the horizon stays: it is the value at the window start
        first = bisect.bisect_right(ts, horizon) - 1
        start = max(first, 0)
        raw_from = now - RAW_SPAN
        for i in range(start, n):
            t = ts[i]
            if t >= raw_from or i == n - 1:
                keep_t.append(t)
                keep_v.append(vs[i])
                continue
            age = now - t
            res = next(r for limit, r in TIERS if age <= limit)
            nxt = ts[i + 1]
            if int(t // res) == int(nxt // res) and (now - nxt) > RAW_SPAN:
                continue  # a later point of the same bucket will stand for it
            keep_t.append(t)
            keep_v.append(vs[i])
        self.ts, self.vs = keep_t, keep_v
        self._compact_at = max(512, 2 * len(keep_t))
