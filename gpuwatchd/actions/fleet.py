"""The fleet drain budget: how many nodes gpuwatchd may hold drained across the cluster.

Every gpuwatchd decides alone, per node; a driver bug that makes every node log the same XID
would otherwise drain the whole cluster one correct-looking drain at a time. The budget is
counted in the scheduler itself (Slurm's controller, the Kubernetes API): no coordination
service of our own.

Protocol (Slurm; docs/fleet.md says why it converges):

1. *check*: one census of the scheduler. If gpuwatchd already holds ``limit`` nodes
   drained, do not drain.
2. drain.
3. *confirm*: wait until every drain that the scheduler stamped no later than ours is
   visible (``settled_at``), census again, order gpuwatchd's drains by (time the scheduler
   recorded, node name) and keep ours only if it is among the first ``limit``; otherwise
   release it at once and try again later.

The order is the same for every daemon, and every drain ordered before ours is visible at
the re-count, so exactly ``limit`` drains stay; drains above the budget exist only for the
seconds between step 2 and their release. The rest of this module is pure.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from gpuwatchd.config.actions import FleetDrainConfig

BUDGET_RULE = "GpuwatchdFleetDrainBudget"
CORRELATED_NODES = 3  # the same XID on this many nodes within ``correlate`` is named
_XID_RE = re.compile(r"\bXID (\d+)\b")


@dataclass(frozen=True)
class FleetDrain:
    node: str
    since: float | None  # when the scheduler recorded the drain (epoch seconds), if known
    reason: str


@dataclass(frozen=True)
class Census:
    nodes: int  # nodes the scheduler knows (in the partition or selector)
    drains: tuple[FleetDrain, ...]  # the nodes drained by gpuwatchd


class FleetView(Protocol):
    """The scheduler's view of the fleet: one query per ``census``.

    An *exclusive* view keeps the budget itself in one object the scheduler updates
    atomically (Kubernetes: a Lease written with its resourceVersion): ``reserve`` takes a
    place before the drain, ``release`` gives it back after the resume, and no re-count is
    needed. A view that is not exclusive (Slurm) relies on the re-count."""

    exclusive: bool

    def census(self) -> Census: ...

    def reserve(
        self, node: str, limit: int, census: Census, reason: str
    ) -> tuple[bool, tuple[FleetDrain, ...]]:
        """Take a place for ``node`` (draining for ``reason``) if fewer than ``limit`` are
        taken: (taken, the places in use, as drains)."""
        ...

    def release(self, node: str) -> None: ...

    def settled_at(self, drained_at: float) -> float:
        """Wall-clock time after which every drain ordered before ours is visible."""
        ...


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    count: int  # gpuwatchd's drains counted (ours excluded on a check, included on a confirm)
    limit: int
    nodes: int
    census: Census

    @property
    def detail(self) -> str:
        return (
            f"{self.count} of a budget of {self.limit} nodes drained by gpuwatchd "
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


class FleetBudget:
    """The check before a drain and the confirm after it, for one node."""

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
        self.wall = wall  # the scheduler stamps drains with wall-clock time
        self.sleep = sleep
        self.last: Verdict | None = None

    def check(self, reason: str = "") -> Verdict:
        """May this node be drained now (for ``reason``)? (One scheduler query.)"""
        census = self.view.census()
        drains = [d for d in counted(census.drains, self.cfg, self.wall()) if d.node != self.node]
        limit = limit_for(self.cfg, census.nodes)
        if self.view.exclusive:
            taken, places = self.view.reserve(self.node, limit, census, reason)
            # the places include drains whose cordon does not show yet
            seen = {d.node for d in census.drains}
            both = Census(
                census.nodes, census.drains + tuple(p for p in places if p.node not in seen)
            )
            self.last = Verdict(taken, len(places), limit, census.nodes, both)
            return self.last
        self.last = Verdict(len(drains) < limit, len(drains), limit, census.nodes, census)
        return self.last

    def released(self) -> None:
        """gpuwatchd's drain of this node is undone: give its place back."""
        self.view.release(self.node)

    def confirm(self, drained_at: float) -> Verdict:
        """After our drain at ``drained_at`` (wall clock): may it stay? (One query; none
        for an exclusive view, whose place was taken before the drain.)"""
        if self.view.exclusive and self.last is not None:
            return self.last
        wait = self.view.settled_at(drained_at) - self.wall()
        if wait > 0:
            self.sleep(wait)
        census = self.view.census()
        drains = counted(census.drains, self.cfg, self.wall())
        limit = limit_for(self.cfg, census.nodes)
        names = [d.node for d in drains]
        rank = names.index(self.node) if self.node in names else 0
        self.last = Verdict(rank < limit, len(drains), limit, census.nodes, census)
        return self.last
