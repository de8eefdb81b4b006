"""The Slurm budget protocol (check, drain, re-count, release) as a discrete-event model,
with the product's own order and limit (``counted``, ``limit_for``, ``settled_at``): for
any timing of any number of daemons, the drains left once every re-count is done are
exactly the budget (or all, when fewer asked), and never more. The real-Slurm test shows
one timing; this shows all of them the model allows (docs/fleet.md, "How concurrent
daemons keep to it")."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd.actions.drivers import SlurmFleetView
from gpuwatchd.actions.fleet import FleetDrain, counted, limit_for
from gpuwatchd.config.actions import FleetDrainConfig

SETTLED_AT = SlurmFleetView("sinfo", 1.0, None).settled_at

daemon = st.tuples(
    st.floats(0.0, 3.0),  # when it checks
    st.floats(0.0, 0.4),  # check -> slurmctld applies the drain (stamped in whole seconds)
    st.floats(0.0, 0.4),  # applied -> scontrol returns
    st.floats(0.0, 0.4),  # re-count -> the release is applied
)


def run(timings: list[tuple[float, float, float, float]], budget: int) -> tuple[int, int]:
    """(drains left at the end, daemons that drained)."""
    cfg = FleetDrainConfig(max_nodes=budget)
    names = [f"n{i:03d}" for i in range(len(timings))]
    applied: dict[str, float] = {}  # node -> time its drain was applied
    released: dict[str, float] = {}  # node -> time its release was applied

    def visible(at: float) -> list[FleetDrain]:
        return [
            FleetDrain(n, float(math.floor(t)), "gpuwatchd: XID 79")
            for n, t in applied.items()
            if t <= at and not (n in released and released[n] <= at)
        ]

    # events in time order: ("check" | "recount", time, node)
    events = sorted((t[0], "check", n) for n, t in zip(names, timings, strict=True))
    timing = dict(zip(names, timings, strict=True))
    drained = 0
    while events:
        at, kind, node = events.pop(0)
        census = visible(at)
        limit = limit_for(cfg, len(names))
        if kind == "check":
            if len([d for d in counted(census, cfg, at) if d.node != node]) >= limit:
                continue  # over the budget: not drained
            _, apply, ret, _ = timing[node]
            applied[node] = at + apply
            drained += 1
            recount = max(SETTLED_AT(at + apply + ret), at + apply + ret)
            events.append((recount, "recount", node))
            events.sort()
        else:
            order = [d.node for d in counted(census, cfg, at)]
            if node in order and order.index(node) >= limit:
                released[node] = at + timing[node][3]
    left = len([n for n in applied if n not in released])
    return left, drained


@settings(max_examples=300, deadline=None)
@given(st.lists(daemon, min_size=1, max_size=60), st.integers(1, 10))
def test_any_timing_settles_at_exactly_the_budget(
    timings: list[tuple[float, float, float, float]], budget: int
) -> None:
    left, drained = run(timings, budget)
    assert left == min(budget, drained), (left, budget, drained)


def test_fifty_in_one_second() -> None:
    timings = [(0.01 * i, 0.05, 0.02, 0.05) for i in range(50)]
    left, drained = run(timings, 5)
    # the checks 10 ms apart let a few past the budget before the drains show; once the
    # re-counts are done exactly the budget is left
    assert left == 5 and 5 < drained < 50, drained
