"""The drain's outcomes for the rule stage: one constructor (``outcome``) and the fleet
budget's pages (over budget, the breaker, and their ends).

The rule stage decides whether an outcome pages (``rules/drain.yaml``); these functions
only say what happened, and mark in the repository's notes that a page is firing so it
is sent once per window, not once per check.
"""

from __future__ import annotations

from types import MappingProxyType

from gpuwatchd.actions.drain.incidents import (
    Incident,
    drained_since,
    note,
    pending_with_result,
    set_note,
)
from gpuwatchd.actions.fleet import (
    FleetBudget,
    claimed_xids,
    correlated,
    xid_counts,
    xid_of_reason,
)
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.records import DrainOutcome, DrainOutcomeKind

PENDING = "pending"
OVER_BUDGET = "over_budget"


def outcome(
    node: str,
    kind: DrainOutcomeKind,
    holds: bool,
    inc: Incident | None,
    now: float,
    summary: str,
    notes: dict[str, str] | None = None,
) -> DrainOutcome:
    """An outcome (or its end) of ``node``'s drain. A failed drain is one per incident
    and names its GPU."""
    gpu: int | None = None
    uuid = pci = None
    if inc is not None:
        src = inc.record.get("labels") or {}
        text = str(src.get("gpu", ""))
        gpu = int(text) if text.isdigit() else None
        uuid = str(src["uuid"]) if src.get("uuid") else None
        pci = str(src["pci_bus_id"]) if src.get("pci_bus_id") else None
    return DrainOutcome(
        timestamp=now,
        kind=kind,
        node=node,
        holds=holds,
        key=inc.key if inc is not None and kind is DrainOutcomeKind.FAILED else "",
        reason=inc.reason if inc is not None else "",
        summary=summary,
        counts=MappingProxyType(dict(notes or {})),
        gpu=gpu,
        uuid=uuid,
        pci_bus_id=pci,
    )


def limit_page(
    store: Store, cfg: DrainConfig, node: str, inc: Incident, now: float
) -> list[DrainOutcome]:
    """The node's own limit (``drain.max_drains`` per ``drain.window``) stopped a drain:
    page once until it has room again."""
    if note(store, "limit_alert") == "firing":
        return []
    summary = (
        f"drain limit reached on {node}: {cfg.max_drains} drains within "
        f"{cfg.window:g}s; not draining for {inc.reason}"
    )
    with store.tx() as conn:
        set_note(conn, "limit_alert", "firing")
    return [outcome(node, DrainOutcomeKind.LIMIT_REACHED, True, None, now, summary)]


def limit_room(store: Store, cfg: DrainConfig, node: str, now: float) -> list[DrainOutcome]:
    """The end of the limit's page once the window has room again."""
    if note(store, "limit_alert") != "firing":
        return []
    if drained_since(store, now - cfg.window) >= cfg.max_drains:
        return []
    with store.tx() as conn:
        set_note(conn, "limit_alert", "")
    summary = f"drain limit on {node} has room again"
    return [outcome(node, DrainOutcomeKind.LIMIT_REACHED, False, None, now, summary)]


def held_back(store: Store) -> int:
    """The pending incidents waiting for a place in the fleet budget."""
    return pending_with_result(store, PENDING, OVER_BUDGET)


def budget_page(
    store: Store,
    cfg: DrainConfig,
    node: str,
    fleet: FleetBudget | None,
    inc: Incident,
    now: float,
) -> list[DrainOutcome]:
    """``inc`` is held back by the fleet budget: page once per window (or once for the
    breaker), naming the XIDs the fleet wants to drain for and a likely common cause."""
    if fleet is None or fleet.last is None:
        return []
    if fleet.last.tripped and note(store, "breaker_alert") != "firing":
        return breaker_page(store, node, fleet, inc, now)
    if fleet.last.stopped:
        return []  # the fleet is stopped: one page says so (the breaker's), not each node
    if note(store, "fleet_alert") == "firing":
        return []
    last = note(store, "fleet_page_at")
    every = cfg.fleet.window or cfg.window
    if last and now - float(last) < every:
        return []
    verdict = fleet.last
    drains = verdict.census.drains
    mine = xid_of_reason(inc.reason)
    # other nodes waiting for a place say which XID they want to drain for
    extra = claimed_xids(verdict.census, fleet.wall(), node)
    extra += [f"{node}|{mine}"] if mine else []
    xids = xid_counts(drains)
    xids.update(item.partition("|")[2] for item in extra)
    seen = ", ".join(f"XID {x} on {n}" for x, n in sorted(xids.items(), key=lambda p: -p[1]))
    drained = len([d for d in drains if d.node != node])
    summary = (
        f"fleet drain budget of {verdict.limit} nodes reached: {drained} drained by "
        f"gpuwatchd at the last count ({verdict.nodes} nodes known); not draining "
        f"{node} for {inc.reason}" + (f" (XIDs: {seen})" if seen else "")
    )
    notes: dict[str, str] = {"xids": seen, "drained_nodes": str(drained)}
    common = correlated(drains, cfg.fleet, fleet.wall(), extra)
    if common:
        xid, nodes = common[0]
        window = f"{cfg.fleet.correlate / 60:g}m"
        cause = (
            f"XID {xid} on {nodes} nodes within {window}: likely a software or driver event "
            f"(a driver or firmware roll-out, a shared job), not {nodes} hardware faults"
        )
        notes["likely_cause"] = cause
        summary += ". " + cause
    with store.tx() as conn:
        set_note(conn, "fleet_alert", "firing")
        set_note(conn, "fleet_page_at", repr(now))
    return [outcome(node, DrainOutcomeKind.OVER_BUDGET, True, None, now, summary, notes)]


def breaker_page(
    store: Store, node: str, fleet: FleetBudget, inc: Incident, now: float
) -> list[DrainOutcome]:
    """This node tripped the breaker (first of those that did): one page for the fleet,
    naming the XIDs and the share of nodes that wanted to drain."""
    assert fleet.last is not None
    verdict = fleet.last
    census = verdict.census
    mine = xid_of_reason(inc.reason)
    extra = claimed_xids(census, fleet.wall(), node)
    extra += [f"{node}|{mine}"] if mine else []
    xids = xid_counts(d for d in census.drains if d.node != node)
    xids.update(item.partition("|")[2] for item in extra)
    wanting = len({d.node for d in census.drains} | {i.partition("|")[0] for i in extra})
    share = 100.0 * wanting / max(1, verdict.nodes)
    seen = ", ".join(f"XID {x} on {n}" for x, n in sorted(xids.items(), key=lambda p: -p[1]))
    summary = (
        f"fleet drain breaker tripped: {wanting} of {verdict.nodes} nodes ({share:.0f} %) "
        f"want to drain at once, above the budget of {verdict.limit}"
        + (f" ({seen})" if seen else "")
        + "; gpuwatchd drains no more nodes until an operator runs `gpuwatchd fleet reset`"
    )
    notes = {"xids": seen, "nodes_wanting": str(wanting), "share_percent": f"{share:.1f}"}
    with store.tx() as conn:
        set_note(conn, "breaker_alert", "firing")
    return [outcome(node, DrainOutcomeKind.BREAKER_OPEN, True, None, now, summary, notes)]


def budget_resolved(
    store: Store, node: str, fleet: FleetBudget | None, now: float
) -> list[DrainOutcome]:
    """The ends of the breaker's and the budget's pages, once they no longer hold."""
    out: list[DrainOutcome] = []
    if note(store, "breaker_alert") == "firing" and (
        not held_back(store) or (fleet and fleet.last and not fleet.last.stopped)
    ):
        with store.tx() as conn:
            set_note(conn, "breaker_alert", "")
        summary = "the fleet drain breaker was reset: gpuwatchd drains again"
        out.append(outcome(node, DrainOutcomeKind.BREAKER_OPEN, False, None, now, summary))
    if note(store, "fleet_alert") != "firing" or held_back(store):
        return out
    with store.tx() as conn:
        set_note(conn, "fleet_alert", "")
    summary = f"no drain of {node} waits for the fleet drain budget any more"
    return [*out, outcome(node, DrainOutcomeKind.OVER_BUDGET, False, None, now, summary)]
