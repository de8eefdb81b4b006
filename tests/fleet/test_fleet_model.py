"""The Slurm claim protocol (issue 28: claim, then drain) as a discrete-event model.

Each daemon runs the product's own protocol (``claim_protocol``: the generator that
``FleetBudget`` drives against slurmctld) against a model controller that applies every
read and write at one instant, as slurmctld does under its locks. Timings are drawn at
random: when a daemon starts, how long each call takes to reach the controller and to come
back, each node's clock skew (claims carry the writer's clock), daemons that die mid-claim,
claim writes that fail. For every timing the model allows:

- never more than the budget of nodes drained at any moment (checked at every drain);
- once every daemon has asked again often enough (``recheck``), exactly
  min(budget, daemons still wanting) drained: dead daemons' claims expire, failed writes
  are tried again.

The old protocol (drain, re-count, release; docs/fleet.md before issue 28) held only the
end state: issue 28 measured 121 of 500 drained at once in the old model's 1-second storm.
This model fails on a protocol that counts only drains (not claims) and on a bakery that
does not wait for choosing nodes (both checked by hand when it was written)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Generator
from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpuwatchd.actions.fleet import (
    CLAIM_TTL,
    Census,
    Claim,
    FleetDrain,
    Mark,
    Op,
    Read,
    Verdict,
    Wait,
    Write,
    WriteMark,
    claim_protocol,
    limit_for,
)
from gpuwatchd.config.actions import FleetDrainConfig

RECHECK = 60.0
REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"


@dataclass
class Daemon:
    name: str
    skew: float  # this node's clock minus the controller's
    dies_at_op: int | None  # it stops for good before this operation (None: never)
    steps: Generator[Op, Census | None, Verdict] | None = None
    ops: int = 0
    done: bool = False  # drained, or dead


@dataclass
class Controller:
    """slurmctld as the protocol sees it: per node a claim (Comment) and a drain."""

    nodes: int
    claims: dict[str, Claim] = field(default_factory=dict)
    drained: dict[str, float] = field(default_factory=dict)
    marks: dict[str, Mark] = field(default_factory=dict)
    most: int = 0
    writes: int = 0  # claim and mark writes by the daemons
    full_reads: int = 0  # full censuses (every node's record: what costs slurmctld most)
    writes_before_resume: int | None = None

    def census(self, full: bool) -> Census:
        drains = tuple(FleetDrain(n, float(int(t)), REASON) for n, t in self.drained.items())
        claims = tuple(c for c in self.claims.values() if full or c.node in self.drained)
        marks = tuple(m for m in self.marks.values() if full or m.node in self.drained)
        return Census(self.nodes, drains, claims, full, marks)

    def drain(self, node: str, at: float) -> None:
        self.drained[node] = at
        self.most = max(self.most, len(self.drained))


def storm(
    n: int,
    budget: int,
    seed: int,
    *,
    spread: float = 1.0,
    latency: float = 0.2,
    skew: float = 0.5,
    die: float = 0.0,
    fail: float = 0.0,
    until: float = 900.0,
    breaker: bool = False,
    full: int = 0,
    resume_at: float | None = None,
    resume: int = 0,
    census: float = 0.0,
) -> tuple[Controller, int]:
    """Every daemon sees the XID within ``spread`` seconds; returns the controller after
    ``until`` seconds and how many daemons are still alive (wanting a drain). ``full``
    nodes outside the storm are drained by gpuwatchd (with their claims) before it starts;
    at ``resume_at`` an operator resumes ``resume`` of them (drain and claim go). A full
    census takes ``census`` seconds more (50-100 %) to come back than any other call: what
    the fleet's size costs to send, read and parse it (issue 28 at 2,000 nodes)."""
    rng = random.Random(seed)
    cfg = FleetDrainConfig(max_nodes=budget, recheck=RECHECK, breaker=breaker)
    ctl = Controller(n + 10)  # a few nodes nobody drains
    daemons = [
        Daemon(
            f"n{i:04d}",
            rng.uniform(-skew, skew),
            rng.randrange(1, 12) if rng.random() < die else None,
        )
        for i in range(n)
    ]
    for i in range(full):
        old = f"old{i:03d}"
        ctl.claims[old] = Claim(old, i + 1, 0.0, "79")
        ctl.drain(old, 0.0)
    clock = 0.0
    queue: list[tuple[float, int, str, Daemon, object]] = []
    seq = 0

    def at(t: float, kind: str, d: Daemon, payload: object = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(queue, (t, seq, kind, d, payload))

    def begin(d: Daemon, t: float) -> None:
        d.steps = claim_protocol(cfg, d.name, lambda: clock + d.skew, "79")
        advance(d, t, None)

    def advance(d: Daemon, t: float, answer: Census | None) -> None:
        assert d.steps is not None
        try:
            op = d.steps.send(answer)
        except StopIteration as stop:
            verdict: Verdict = stop.value
            if verdict.allowed:  # the drain reaches the controller a moment later
                at(t + rng.uniform(0.0, latency), "drain", d)
            else:
                at(t + RECHECK * rng.uniform(0.5, 1.0), "begin", d)
            return
        d.ops += 1
        if d.dies_at_op is not None and d.ops >= d.dies_at_op:
            d.done = True  # dead: whatever it wrote stays
            return
        if isinstance(op, Wait):
            at(t + op.seconds, "reply", d)
        else:
            at(t + rng.uniform(0.0, latency), "apply", d, op)

    for d in daemons:
        at(rng.uniform(0.0, spread), "begin", d)
    if resume_at is not None:
        at(resume_at, "resume", Daemon("operator", 0.0, None))
    while queue and queue[0][0] <= until:
        clock, _, kind, d, payload = heapq.heappop(queue)
        if d.done:
            continue
        if kind == "begin":
            begin(d, clock)
        elif kind == "resume":
            ctl.writes_before_resume = ctl.writes
            for old in [f"old{i:03d}" for i in range(resume)]:
                ctl.drained.pop(old, None)
                ctl.claims.pop(old, None)
        elif kind == "drain":
            ctl.drain(d.name, clock)
            assert len(ctl.drained) <= limit_for(cfg, ctl.nodes), (clock, sorted(ctl.drained))
            d.done = True
        elif kind == "apply":
            answer: Census | None = None
            if isinstance(payload, Read):
                answer = ctl.census(payload.full)
                ctl.full_reads += payload.full
            elif isinstance(payload, Write):
                ctl.writes += 1
                if rng.random() < fail:  # scontrol failed: FleetBudget drops the claim
                    if rng.random() < 0.5:
                        ctl.claims.pop(d.name, None)
                    at(clock + rng.uniform(5.0, 30.0), "begin", d)
                    continue
                if payload.claim is None:
                    ctl.claims.pop(d.name, None)
                else:
                    ctl.claims[d.name] = payload.claim
            elif isinstance(payload, WriteMark):
                ctl.writes += 1
                ctl.marks[d.name] = payload.mark
            back = rng.uniform(0.0, latency)
            if isinstance(payload, Read) and payload.full:  # sent, then read and parsed
                back += census * rng.uniform(0.5, 1.0)
            at(clock + back, "reply", d, answer)
        elif kind == "reply":
            advance(d, clock, payload if isinstance(payload, Census) else None)
    alive = sum(1 for d in daemons if d.dies_at_op is None or d.name in ctl.drained)
    return ctl, alive


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(1, 60),
    budget=st.integers(1, 10),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 3.0),
    latency=st.floats(0.0, 0.5),
    skew=st.floats(0.0, 2.0),
)
def test_never_above_the_budget_and_exact_once_settled(
    n: int, budget: int, seed: int, spread: float, latency: float, skew: float
) -> None:
    ctl, alive = storm(n, budget, seed, spread=spread, latency=latency, skew=skew)
    assert len(ctl.drained) == min(budget, alive), (len(ctl.drained), budget, alive)


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 40),
    budget=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    die=st.floats(0.0, 0.5),
    fail=st.floats(0.0, 0.3),
)
def test_dead_daemons_and_failed_writes_never_overshoot(
    n: int, budget: int, seed: int, die: float, fail: float
) -> None:
    """Daemons die between any two calls (their claims stay), claim writes fail: still never
    above the budget, and once the dead claims expired (CLAIM_TTL) and everyone asked again,
    the places are all taken by the living."""
    ctl, alive = storm(n, budget, seed, die=die, fail=fail, until=CLAIM_TTL + 10 * RECHECK)
    assert len(ctl.drained) == min(budget, alive), (len(ctl.drained), budget, alive)


def test_a_storm_of_500_in_one_second() -> None:
    """The issue's case: 500 daemons within 1 s, 5 %: the drains never exceed 25."""
    ctl, alive = storm(500, 25, 7, spread=1.0, latency=0.3, until=200.0)
    assert ctl.most == len(ctl.drained) == 25 and alive == 500


def test_skew_does_not_matter() -> None:
    """No clock is compared across nodes: clocks 30 s apart (far beyond what Slurm allows)
    still give exactly the budget, never more."""
    ctl, _ = storm(60, 5, 3, skew=30.0, until=300.0)
    assert ctl.most == len(ctl.drained) == 5


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 50),
    budget=st.integers(1, 8),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 3.0),
)
def test_the_breaker_stops_everyone_behind_the_budget(
    n: int, budget: int, seed: int, spread: float
) -> None:
    """With the breaker on, a storm larger than the budget trips it: the nodes whose claims
    were within the budget still drain, nobody else does, ever (no reset in the model).
    (A node that finds the budget already full of drains trips it too.)"""
    ctl, _ = storm(n, budget, seed, spread=spread, breaker=True)
    assert len(ctl.drained) <= budget
    if n <= budget:
        assert not ctl.marks and len(ctl.drained) == n
    elif ctl.marks:  # tripped: those ahead of the first to trip filled the budget
        assert all(m.what == "tripped" for m in ctl.marks.values())
        assert len(ctl.drained) == budget, (len(ctl.drained), budget)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 40),
    budget=st.integers(1, 6),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 3.0),
    data=st.data(),
)
def test_a_node_refused_at_the_first_census_needs_no_claim(
    n: int, budget: int, seed: int, spread: float, data: st.DataObject
) -> None:
    """A storm that finds the budget already full of gpuwatchd's drains: every daemon is
    refused at its first, cheap census and writes nothing (no claim: it holds no place, and
    a claim it kept would order before later nodes' without ever draining). When an operator
    resumes some of the drains, the held-back daemons fill exactly the places freed at
    their next check, never more: being invisible to the others until then loses nothing."""
    freed = data.draw(st.integers(1, budget))
    ctl, alive = storm(
        n,
        budget,
        seed,
        spread=spread,
        full=budget,
        resume_at=100.0,
        resume=freed,
        until=100.0 + 10 * RECHECK,
    )
    assert ctl.writes_before_resume == 0
    assert ctl.most == budget
    assert len(ctl.drained) == budget - freed + min(freed, alive), (len(ctl.drained), freed)


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(50, 300),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 5.0),
    latency=st.floats(0.005, 3.0),
)
def test_the_choosing_wait_reads_a_bounded_number_of_censuses(
    n: int, seed: int, spread: float, latency: float
) -> None:
    """Issue 28: the choosing phase re-reads the full census every 0.25 s while it waits.
    Whatever the call latency (5 ms to 3 s each way) and however the storm is spread, a
    daemon reads at most 6 full censuses (two are the protocol's own; measured 1.2-4.2 over
    this range): the nodes it waits for finish choosing within about one census of their
    own, and its next read starts only after its last one came back (without the 0.25 s
    pause at all: 3.6 instead of 3.0 at 5 ms). So the load a storm puts on slurmctld grows
    with the number of nodes times the cost of one census, not with the poll interval, and
    a backoff on it would save nothing (docs/fleet.md, "What the choosing phase costs
    slurmctld")."""
    ctl, _ = storm(n, max(1, n // 20), seed, spread=spread, latency=latency, until=60.0)
    assert ctl.full_reads <= 6 * n, ctl.full_reads / n


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(20, 200),
    seed=st.integers(0, 2**32),
    spread=st.floats(0.0, 3.0),
    census=st.floats(25.0, 80.0),
)
# renewed claims judged when a 69 s census came back, not when it was asked: 2 of a budget of 1
@example(n=20, seed=1, spread=1.0, census=69.0)
def test_slow_censuses_still_decide(n: int, seed: int, spread: float, census: float) -> None:
    """Issue 28 at 2,000 nodes: every stage wrote its claim and started its first full
    census, and none decided in 200 s. A full census that takes 25-80 s to come back (sent,
    read and parsed: 2,000 stages sharing one process, or 10,000 nodes dumping the node
    table together) used to outlast the protocol's fixed limits (40 s of waiting for
    choosing nodes, an admission within 60 s of the ticket): every node withdrew and
    asked again, in step, for ever. Claims are now kept fresh and the wait scales with the
    census's own time: the budget fills, and never overflows."""
    budget = max(1, n // 20)
    ctl, alive = storm(n, budget, seed, spread=spread, latency=0.5, census=census, until=900.0)
    assert ctl.most <= budget
    assert len(ctl.drained) == min(budget, alive), (len(ctl.drained), budget)
