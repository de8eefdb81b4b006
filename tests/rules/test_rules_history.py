"""Counter history: change points, resets, and thinning with age."""

from __future__ import annotations

from gpuwatchd.rules.history import RAW_SPAN, CounterHistory

DAY = 86400.0


def test_a_counter_that_does_not_move_costs_no_points() -> None:
    h = CounterHistory()
    for i in range(1000):
        assert h.add(float(i), 7.0) is (i == 0)
    assert len(h) == 1 and h.last_t == 999.0


def test_resets_are_folded_into_an_offset() -> None:
    h = CounterHistory()
    for t, raw in [(0, 5), (10, 8), (20, 0), (30, 3), (40, 1)]:
        h.add(float(t), float(raw))
    assert h.resets == 2
    assert h.increase(0, 40) == 3 + 3 + 1  # 5->8, 0->3, 0->1
    assert h.changes(0, 40) == 3
    assert h.value_at(-5) == 5.0  # before the history: its first value


def test_thinning_keeps_long_windows_accurate_and_bounds_memory() -> None:
    h = CounterHistory()
    t = 0.0
    v = 0.0
    while t <= 30 * DAY:  # one error every 10 s for 30 days: a change point every sample
        v += 1
        h.add(t, v)
        t += 10.0
    now = t - 10.0
    # raw for 2 h (720), one a minute to 2 d (~2,760), one per 15 min after (~2,690);
    # thinning runs when the list doubles, so it never holds more than twice that
    assert len(h) < 14000
    h.compact(now)
    assert len(h) < 7000
    recent = h.points_between(now - RAW_SPAN, now)
    assert len(recent) >= 700  # every point of the last two hours
    # windows are exact within one thinning bucket at their start
    assert abs(h.increase(now - 3600, now) - 360) <= 1
    assert abs(h.increase(now - DAY, now) - 8640) <= 6
    assert abs(h.increase(now - 7 * DAY, now) - 60480) <= 90
    assert h.ts == sorted(h.ts)
