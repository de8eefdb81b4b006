"""The fleet drain budget: how many nodes gpuwatchd may hold drained across the cluster.

Every gpuwatchd decides alone, per node; a driver bug that makes every node log the same XID
would otherwise drain the whole cluster one correct-looking drain at a time. The budget is
counted in the scheduler itself (Slurm's controller, the Kubernetes API): no coordination
service of our own.

Two kinds of view keep it (docs/fleet.md, "How concurrent daemons keep to it"):

- an *exclusive* view (Kubernetes) keeps the places in one object the scheduler updates
  atomically: ``reserve`` takes a place before the drain, ``release`` gives it back;
- a *claiming* view (Slurm) lets each node write a claim on its own node record (a field
  that does not affect scheduling) and read every node's claim in one census. Claims follow
  Lamport's bakery: a node says it is *choosing*, reads every claim, takes a ticket one
  above the highest it saw, waits until each node that was choosing when it wrote its
  ticket has chosen, and drains only if fewer than the budget of claims and drains order
  before its own (ticket, node name). A drain therefore happens only after the claim that
  admits it, so the budget holds at every moment, not only once the storm has settled; no
  clock is compared across nodes (a claim's time only lets a dead daemon's claim expire).

``claim_protocol`` is that protocol as a generator of scheduler operations, driven by
``FleetBudget`` against the real view and by tests/fleet/test_fleet_model.py against a model
with random timings, clock skew and failures. The rest of this module is pure.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Protocol

from gpuwatchd.config.actions import FleetDrainConfig
from gpuwatchd.core.errors import GpuwatchdError

BUDGET_RULE = "GpuwatchdFleetDrainBudget"
BREAKER_RULE = "GpuwatchdFleetDrainBreaker"
CORRELATED_NODES = 3  # the same XID on this many nodes within ``correlate`` is named
_XID_RE = re.compile(r"\bXID (\d+)\b")
CLAIM_PREFIX = "gpuwatchd-claim:"
CLAIM_TTL = 120.0  # seconds: a claim on a node not drained by gpuwatchd expires after this
CHOOSING_POLL = 0.25  # seconds between the reads that wait for choosing nodes
CHOOSING_PATIENCE = 40.0  # seconds: choosing nodes that take longer make us back off
PATIENT_READS = 4  # ... or longer than this many of our own slowest full censuses
# a claim is renewed, or given up, this long before another node could take it for a dead
# daemon's (covers clock skew between nodes and the write's own time)
CLAIM_MARGIN = 20.0
# an admission more than this after our claim was written renews the claim first: another
# reader may soon take it for a dead daemon's (the drain's own write comes within its timeout)
ADMIT_WITHIN = CLAIM_TTL / 2
TRIP_SETTLE = 1.0  # seconds after tripping the breaker before choosing who pages
MARK_PREFIX = "gpuwatchd-fleet:"
_MARK_RE = re.compile(
    r"gpuwatchd-fleet: (?P<what>tripped|paused) at "
    r"(?P<at>[0-9]{1,11}(?:\.[0-9]{1,3})?)(?: xid (?P<xid>[0-9]{1,4}))?"
)
_CLAIM_RE = re.compile(
    r"gpuwatchd-claim: (?:choosing|ticket (?P<ticket>[1-9][0-9]{0,8})) at "
    r"(?P<at>[0-9]{1,11}(?:\.[0-9]{1,3})?)(?: xid (?P<xid>[0-9]{1,4}))?"
)


@dataclass(frozen=True)
class FleetDrain:
    node: str
    since: float | None  # when the scheduler recorded the drain (epoch seconds), if known
    reason: str


@dataclass(frozen=True)
class Claim:
    """A node's claim on a place in the budget (Slurm: in the node's ``Comment``)."""

    node: str
    ticket: int | None  # None: choosing (it is reading the others' tickets)
    at: float  # the writer's wall clock: only for expiry
    xid: str | None = None  # the XID it wants to drain for (named in budget pages)

    @property
    def choosing(self) -> bool:
        return self.ticket is None

    @property
    def text(self) -> str:
        what = "choosing" if self.ticket is None else f"ticket {self.ticket}"
        return f"{CLAIM_PREFIX} {what} at {self.at:.3f}" + (f" xid {self.xid}" if self.xid else "")

    @classmethod
    def parse(cls, node: str, text: str) -> Claim | None:
        """The claim at the end of a node's field (after any text of another owner)."""
        at = text.rfind(CLAIM_PREFIX)
        if at < 0:
            return None
        m = _CLAIM_RE.fullmatch(text[at:].strip())
        if m is None:
            return None
        ticket = m.group("ticket")
        return cls(node, int(ticket) if ticket else None, float(m.group("at")), m.group("xid"))


@dataclass(frozen=True)
class Mark:
    """A fleet-wide stop (Slurm: in a node's ``Comment``, before any claim; Kubernetes: in
    the budget's Lease): ``tripped`` by
    the breaker when more nodes wanted to drain at once than the budget allows, or
    ``paused`` by an operator (``gpuwatchd fleet pause``). While any node carries one, no
    node drains; ``gpuwatchd fleet reset`` takes them all off."""

    node: str
    what: str  # tripped | paused
    at: float
    xid: str | None = None

    @property
    def text(self) -> str:
        return f"{MARK_PREFIX} {self.what} at {self.at:.3f}" + (
            f" xid {self.xid}" if self.xid else ""
        )

    @classmethod
    def parse(cls, node: str, text: str) -> Mark | None:
        at = text.find(MARK_PREFIX)
        if at < 0:
            return None
        end = text.find(CLAIM_PREFIX, at)
        part = text[at : end if end >= 0 else len(text)].strip().removesuffix(";").strip()
        m = _MARK_RE.fullmatch(part)
        if m is None:
            return None
        return cls(node, m.group("what"), float(m.group("at")), m.group("xid"))


@dataclass(frozen=True)
class Census:
    nodes: int  # nodes the scheduler knows (in the partition or selector)
    drains: tuple[FleetDrain, ...]  # the nodes drained by gpuwatchd
    claims: tuple[Claim, ...] = ()  # claims on places (a claiming view's full census)
    full: bool = True  # False: a cheap census that shows drains only, not claims
    marks: tuple[Mark, ...] = ()  # fleet-wide stops (breaker tripped, paused)


class FleetView(Protocol):
    """The scheduler's view of the fleet: one query per ``census``.

    An *exclusive* view keeps the budget itself in one object the scheduler updates
    atomically (Kubernetes: a Lease written with its resourceVersion): ``reserve`` takes a
    place before the drain, ``release`` gives it back after the resume. A view that is not
    exclusive (Slurm) keeps claims: ``write_claim`` puts this node's claim (None: takes it
    off), ``census(full=True)`` reads every node's, ``census(full=False)`` only the drains."""

    exclusive: bool

    def census(self, full: bool = True) -> Census: ...

    def reserve(
        self, node: str, limit: int, census: Census, reason: str
    ) -> tuple[bool, tuple[FleetDrain, ...]]:
        """Take a place for ``node`` (draining for ``reason``) if fewer than ``limit`` are
        taken: (taken, the places in use, as drains)."""
        ...

    def release(self, node: str) -> None: ...

    def write_claim(self, node: str, claim: Claim | None) -> None: ...

    def write_mark(self, node: str, mark: Mark | None) -> None: ...


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    count: int  # gpuwatchd's drains (and claims) ahead of ours
    limit: int
    nodes: int
    census: Census
    tripped: bool = False  # this check tripped the breaker and is the one to page

    @property
    def stopped(self) -> str | None:
        """Why draining is stopped fleet-wide (None: it is not)."""
        if not self.census.marks:
            return None
        m = min(self.census.marks, key=lambda m: (m.at, m.node))
        how = "paused by an operator" if m.what == "paused" else "stopped by the breaker"
        return f"fleet draining {how} (on {m.node}); `gpuwatchd fleet reset` resumes it"

    @property
    def detail(self) -> str:
        if self.stopped:
            return self.stopped
        return (
            f"{self.count} of a budget of {self.limit} nodes drained or claimed by gpuwatchd "
            f"({self.nodes} nodes known to the scheduler)"
        )


def limit_for(cfg: FleetDrainConfig, nodes: int) -> int:
    """The budget for a fleet of ``nodes``: the smaller of both limits, never below one."""
    limits = []
    if cfg.max_nodes is not None:
        limits.append(cfg.max_nodes)
    if cfg.max_percent is not None:
        limits.append(math.floor(nodes * cfg.max_percent / 100.0 + 1e-9))
    return max(1, min(limits)) if limits else nodes


def counted(drains: Iterable[FleetDrain], cfg: FleetDrainConfig, now: float) -> list[FleetDrain]:
    """The drains the budget counts, in the order every daemon agrees on."""
    out = [
        d for d in drains if cfg.window is None or d.since is None or d.since >= now - cfg.window
    ]
    return sorted(out, key=lambda d: (d.since if d.since is not None else -math.inf, d.node))


def live_claims(census: Census, now: float) -> dict[str, Claim]:
    """The claims that hold: on a node drained by gpuwatchd always, otherwise until they
    are CLAIM_TTL old (a daemon that died mid-claim; a claim stamped far ahead of our clock
    counts as made now, so it expires too)."""
    drained = {d.node for d in census.drains}
    return {
        c.node: c
        for c in census.claims
        if c.node in drained or now - CLAIM_TTL <= c.at <= now + CLAIM_TTL
    }


def ahead_of(
    census: Census, node: str, ticket: int | None, cfg: FleetDrainConfig, now: float
) -> list[str]:
    """The nodes whose drain or claim orders before ``node``'s claim ``ticket`` (None: a
    drain of ``node`` without a claim, which orders with the other drains without one):
    gpuwatchd's drains without a claim first (by time and name), then claims by (ticket,
    node name); a drained node with a claim counts once, by its claim."""
    claims = live_claims(census, now)
    out: list[str] = []
    for d in counted(census.drains, cfg, now):
        if d.node == node:
            if ticket is None:
                return out
            continue
        c = claims.get(d.node)
        if c is None or c.ticket is None:
            out.append(d.node)
    if ticket is None:
        return out
    me = (ticket, node)
    drained = {d.node for d in census.drains}
    counted_drains = {d.node for d in counted(census.drains, cfg, now)}
    for c in claims.values():
        if c.node == node or c.ticket is None or (c.ticket, c.node) >= me:
            continue
        if c.node in drained and c.node not in counted_drains:
            continue  # a drain older than the window
        out.append(c.node)
    return out


def next_ticket(census: Census, now: float) -> int:
    return 1 + max((c.ticket or 0 for c in live_claims(census, now).values()), default=0)


@dataclass(frozen=True)
class Read:
    """Operation: a census (full: with every node's claim)."""

    full: bool


@dataclass(frozen=True)
class Write:
    """Operation: put this node's claim (None: take it off)."""

    claim: Claim | None


@dataclass(frozen=True)
class Wait:
    seconds: float


@dataclass(frozen=True)
class WriteMark:
    """Operation: put a fleet-wide stop on this node."""

    mark: Mark


Op = Read | Write | Wait | WriteMark


def claim_protocol(
    cfg: FleetDrainConfig, node: str, now: Callable[[], float], xid: str | None = None
) -> Generator[Op, Census | None, Verdict]:
    """Claim a place, then say whether the drain may happen (module docstring). Yields
    operations; a ``Read`` is answered with a census, the others with None. A refusal
    leaves no claim behind; an admission leaves the claim, which the drain keeps until
    the resume takes it off (``FleetView.release``)."""
    # with the breaker on, the first census is a full one: it must see a stop on any node
    census = yield Read(full=cfg.breaker)
    assert census is not None
    limit = limit_for(cfg, census.nodes)
    drains = [d for d in counted(census.drains, cfg, now()) if d.node != node]
    if census.marks:  # the fleet is stopped: nothing written
        return Verdict(False, len(drains), limit, census.nodes, census)
    if len(drains) >= limit:  # full already: no claim written, no further read
        if cfg.breaker:  # and one more wants to drain: trip it
            return (yield from _trip(node, xid, now, len(drains), limit))
        return Verdict(False, len(drains), limit, census.nodes, census)
    choosing_at = now()
    yield Write(Claim(node, None, choosing_at, xid))
    census, asked, slowest = yield from _full_read(now)  # slowest: the waits below scale with it
    if census.marks:  # the fleet is stopped: no drain until an operator resets it
        yield Write(None)
        return Verdict(False, 0, limit, census.nodes, census)
    # a claim is judged live or expired at the moment we asked, not when the answer came
    # back: a slow census would otherwise drop claims that were live when it was taken
    ticket = next_ticket(census, asked)
    stamp = now()  # the time our claim carries
    yield Write(Claim(node, ticket, stamp, xid))
    if now() - choosing_at > CLAIM_TTL - CLAIM_MARGIN:
        # our "choosing" may have looked expired meanwhile, so another node may have taken
        # its ticket without waiting for ours: ours is not safe to use
        yield Write(None)
        return Verdict(False, limit, limit, census.nodes, census)
    started = stamp
    census, asked, took = yield from _full_read(now)
    slowest = max(slowest, took)
    waiting = {c.node for c in live_claims(census, asked).values() if c.choosing}
    waiting.discard(node)
    while True:
        choosing = {c.node for c in live_claims(census, asked).values() if c.choosing}
        waiting &= choosing
        if not waiting:
            break
        if now() - started > max(CHOOSING_PATIENCE, PATIENT_READS * slowest):
            yield Write(None)
            return Verdict(False, limit, limit, census.nodes, census)
        # a wait as long as slow censuses make it: renew the claim if it would be older than
        # ADMIT_WITHIN / 2 once the next census is back (slow censuses: before each one)
        if now() - stamp + slowest > ADMIT_WITHIN / 2:
            fresh = yield from _refresh(node, ticket, xid, stamp, now)
            if fresh is None:
                yield Write(None)
                return Verdict(False, limit, limit, census.nodes, census)
            stamp = fresh
        yield Wait(CHOOSING_POLL)
        census, asked, took = yield from _full_read(now)
        slowest = max(slowest, took)
    limit = limit_for(cfg, census.nodes)
    ahead = ahead_of(census, node, ticket, cfg, asked)
    # a breaker tripped after our ticket was taken stops the nodes behind us, not us: those
    # within the budget still drain (an operator's pause stops everyone)
    paused = any(m.what == "paused" for m in census.marks)
    if not paused and len(ahead) < limit:
        if now() - stamp > ADMIT_WITHIN:  # the census came back late: renew the claim first
            fresh = yield from _refresh(node, ticket, xid, stamp, now)
        else:
            fresh = stamp
        if fresh is not None:
            return Verdict(True, len(ahead), limit, census.nodes, census)
    yield Write(None)
    if census.marks or not cfg.breaker or len(ahead) < limit:
        return Verdict(False, len(ahead), limit, census.nodes, census)
    return (yield from _trip(node, xid, now, len(ahead), limit))


def _full_read(
    now: Callable[[], float],
) -> Generator[Op, Census | None, tuple[Census, float, float]]:
    """A full census, with the time we asked for it (claims are judged live as of then)
    and how long it took to come back (our slowest one sets the waits)."""
    asked = now()
    census = yield Read(full=True)
    assert census is not None
    return census, asked, now() - asked


def _refresh(
    node: str, ticket: int, xid: str | None, stamp: float, now: Callable[[], float]
) -> Generator[Op, Census | None, float | None]:
    """Write our ticket again with the time now, so that no reader takes it for a dead
    daemon's: the place in the order (ticket, node) stays the same. Returns the new time,
    or None when the old claim (``stamp``) may already have looked expired to another node
    before the new one landed (then a node may have ordered itself without waiting for it:
    the ticket must not be used)."""
    fresh = now()
    yield Write(Claim(node, ticket, fresh, xid))
    return fresh if now() - stamp <= CLAIM_TTL - CLAIM_MARGIN else None


def _trip(
    node: str, xid: str | None, now: Callable[[], float], ahead: int, limit: int
) -> Generator[Op, Census | None, Verdict]:
    """More nodes want to drain than the budget allows: trip the breaker. Of the nodes
    that trip it together, the first by name pages."""
    yield WriteMark(Mark(node, "tripped", now(), xid))
    yield Wait(TRIP_SETTLE)  # others that read no mark a moment ago write theirs now
    census = yield Read(full=True)
    assert census is not None
    first = min((m.node for m in census.marks if m.what == "tripped"), default=node)
    return Verdict(False, ahead, limit, census.nodes, census, tripped=first == node)


def xid_of_reason(reason: str) -> str | None:
    m = _XID_RE.search(reason)
    return m.group(1) if m else None


def correlated(
    drains: Iterable[FleetDrain], cfg: FleetDrainConfig, now: float, extra: Iterable[str] = ()
) -> list[tuple[str, int]]:
    """XIDs seen on at least CORRELATED_NODES nodes within ``correlate``: (xid, nodes)."""
    seen: dict[str, set[str]] = {}
    for d in drains:
        xid = xid_of_reason(d.reason)
        if xid and (d.since is None or d.since >= now - cfg.correlate):
            seen.setdefault(xid, set()).add(d.node)
    for item in extra:  # "node|xid" of incidents held back, which no scheduler shows yet
        node, _, xid = item.partition("|")
        if xid:
            seen.setdefault(xid, set()).add(node)
    out = [(x, len(n)) for x, n in seen.items() if len(n) >= CORRELATED_NODES]
    return sorted(out, key=lambda p: (-p[1], int(p[0])))


def xid_counts(drains: Iterable[FleetDrain]) -> Counter[str]:
    return Counter(x for x in (xid_of_reason(d.reason) for d in drains) if x)


def claimed_xids(census: Census, now: float, node: str) -> list[str]:
    """ "node|xid" for the other nodes' live claims that name an XID and are not drains."""
    drained = {d.node for d in census.drains}
    return [
        f"{c.node}|{c.xid}"
        for c in live_claims(census, now).values()
        if c.xid and c.node != node and c.node not in drained
    ]


class FleetBudget:
    """The check before a drain (and, after a restart, the re-count of a drain found
    without a record), for one node."""

    def __init__(
        self,
        cfg: FleetDrainConfig,
        view: FleetView,
        node: str,
        *,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cfg = cfg
        self.view = view
        self.node = node
        self.wall = wall  # claims carry wall-clock time (for expiry only)
        self.sleep = sleep
        self.last: Verdict | None = None

    def check(self, reason: str = "") -> Verdict:
        """May this node be drained now (for ``reason``)? On yes, the place is taken."""
        if self.view.exclusive:
            census = self.view.census()
            limit = limit_for(self.cfg, census.nodes)
            taken, places = self.view.reserve(self.node, limit, census, reason)
            # the places include drains whose cordon does not show yet
            seen = {d.node for d in census.drains}
            stop = getattr(self.view, "stop", None)
            both = Census(
                census.nodes,
                census.drains + tuple(p for p in places if p.node not in seen),
                marks=(stop,) if stop is not None and not taken else (),
            )
            tripped = bool(getattr(self.view, "tripped", False))
            self.last = Verdict(taken, len(places), limit, census.nodes, both, tripped=tripped)
            return self.last
        steps = claim_protocol(self.cfg, self.node, self.wall, xid_of_reason(reason))
        answer: Census | None = None
        try:
            while True:
                op = steps.send(answer)
                answer = None
                if isinstance(op, Read):
                    answer = self.view.census(full=op.full)
                elif isinstance(op, Write):
                    self.view.write_claim(self.node, op.claim)
                elif isinstance(op, WriteMark):
                    self.view.write_mark(self.node, op.mark)
                else:
                    self.sleep(op.seconds)
        except StopIteration as done:
            self.last = done.value
        except BaseException:
            self._drop_claim()
            raise
        assert self.last is not None
        return self.last

    def _drop_claim(self) -> None:
        with contextlib.suppress(GpuwatchdError):  # a claim left behind expires (CLAIM_TTL)
            self.view.write_claim(self.node, None)

    def released(self) -> None:
        """gpuwatchd's drain of this node is undone: give its place back."""
        self.view.release(self.node)

    def confirm(self) -> Verdict:
        """A drain of this node by gpuwatchd found without a record of it (the daemon
        stopped between its drain and writing it down, or an older version drained): may
        it stay? Ours stays if fewer than the budget order before it."""
        if self.view.exclusive and self.last is not None:
            return self.last
        census = self.view.census(full=True)
        now = self.wall()
        mine = live_claims(census, now).get(self.node)
        ahead = ahead_of(census, self.node, mine.ticket if mine else None, self.cfg, now)
        limit = limit_for(self.cfg, census.nodes)
        self.last = Verdict(len(ahead) < limit, len(ahead), limit, census.nodes, census)
        return self.last
