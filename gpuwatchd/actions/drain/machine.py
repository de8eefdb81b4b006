"""The drain's per-incident state machine: one step of a due incident.

    pending --(grace over)--> drained | already | kept_admin | noted | dry_run
       |  ^                      \\--> rate_limited (page) | failed after N tries (page)
       |  \\-- over_budget: the fleet budget is spent (page once per window); asks again
       \\--(alert resolved first)--> cancelled

``drain_step(drive, incident, now, held)`` asks the driver, writes the incident's next state
to the repository (``incidents.py``) and returns a ``Step``: what to count and log, the
outcomes for the rule stage, and what the controller keeps between steps (``held``: how
many checks in a row the fleet budget held the incident back). It keeps nothing itself:
the controller (``controller.py``) decides when a step is due, counts, logs and hands the
outcomes over. A drain for an XID is never given up (it pages after ``drain.attempts``
failures and goes on trying); any other drain fails for good after ``drain.attempts``.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver, Gate
from gpuwatchd.actions.drain.incidents import (
    Incident,
    drained_since,
    hold_back,
    mark_done,
    mark_failed,
    mark_owned,
    mark_rate_limited,
    note,
    read_node_drain,
    schedule_retry,
    set_note,
)
from gpuwatchd.actions.drain.pages import OVER_BUDGET, PENDING, budget_page, limit_page, outcome
from gpuwatchd.actions.fleet import FleetBudget
from gpuwatchd.actions.model import xid_of
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.records import DrainOutcome, DrainOutcomeKind

# the logger keeps the name it had as one module (docs/config.md names it)
log = logging.getLogger("gpuwatchd.actions.drain")

# Incident states in which gpuwatchd holds (or may hold) the node drained.
DRAINED_STATES = ("drained", "already")
RESULTS = (
    "drained",
    "already",
    "kept_admin",
    "noted",
    "dry_run",
    "failed",
    "rate_limited",
    "over_budget",
    "cancelled",
)
RETRY_BASE = 5.0
RETRY_MAX = 300.0
RECHECK_MAX_FACTOR = 8.0  # a held-back incident asks at least every 8 x fleet.recheck

__all__ = [
    "DRAINED_STATES",
    "OVER_BUDGET",
    "PENDING",
    "RESULTS",
    "Drive",
    "Step",
    "backoff",
    "drain_step",
    "dry_run_drained",
    "failing_resolved",
    "gate_for",
]


@dataclass(frozen=True)
class Drive:
    """What a step works with: the settings, the node, the repository, the driver, the
    fleet budget (None: none), the random source (backoff, recheck spread) and whether
    drains are only said (``pretend``: dry-run, ``simulate``'s recording driver)."""

    cfg: DrainConfig
    node: str
    store: Store
    driver: Driver
    fleet: FleetBudget | None
    rng: random.Random
    pretend: bool


@dataclass(frozen=True)
class Step:
    """What one step did to ``incident``.

    ``result``/``detail``: the drain action to count and log ("": none, as for a retry or
    a repeated over-budget check); ``error``: the driver's failure, if any; ``outcomes``:
    for the rule stage; ``done``: the incident left ``pending`` for a result; ``held``:
    checks in a row the fleet budget held it back (0: not held back); ``rate_limited``:
    the node's own limit stopped it."""

    incident: Incident
    result: str = ""
    detail: str = ""
    error: str | None = None
    outcomes: tuple[DrainOutcome, ...] = ()
    done: bool = False
    held: int = 0
    rate_limited: bool = False


def backoff(rng: random.Random, attempts: int) -> float:
    """The wait before the next try after ``attempts`` failures (doubling, jittered)."""
    base = min(RETRY_MAX, RETRY_BASE * 2.0 ** max(0, attempts - 1))
    return base * (0.5 + rng.random() / 2)


def gate_for(fleet: FleetBudget | None, reason: str) -> Gate | None:
    """The fleet budget's last word before a driver changes the node (None: no budget)."""
    if fleet is None:
        return None

    def gate() -> str | None:
        verdict = fleet.check(reason)
        return None if verdict.allowed else f"fleet drain budget spent: {verdict.detail}"

    return gate


def dry_run_drained(store: Store, pretend: bool) -> str | None:
    """When drains are only said: the reason of the drain gpuwatchd would hold now (None:
    none). A cascade's later alerts find it "already" drained, as the daemon does."""
    if not pretend:
        return None
    return note(store, "dry_run_drained") or None


def drain_step(d: Drive, inc: Incident, now: float, held: int = 0) -> Step:
    """Drain the node for the due incident ``inc``; ``held``: the checks in a row the
    fleet budget held it back before."""
    owned = read_node_drain(d.store)
    would = dry_run_drained(d.store, d.pretend)
    try:
        if owned.owned and not d.driver.reads_state:
            # The node is drained by gpuwatchd already (a cascade: XID 79, then GPU
            # lost): one drain per node, not one hook call per alert.
            result = DrainResult("already", f"node already drained by gpuwatchd ({owned.reason})")
        elif would is not None:
            # Dry-run counts like the real run: the cascade's first alert "drained" it.
            result = DrainResult("already", f"node would be drained by gpuwatchd ({would})")
        elif drained_since(d.store, now - d.cfg.window) >= d.cfg.max_drains:
            # Over the limit nothing may change; a driver that can read the node may
            # still find there is nothing to do (drained already, or by an admin).
            probe = (
                d.driver.drain(inc.as_mapping(), inc.reason, True) if d.driver.reads_state else None
            )
            if probe is None or probe.counts:
                return _rate_limited(d, inc, now)
            result = probe
        else:
            result = d.driver.drain(
                inc.as_mapping(), inc.reason, d.cfg.dry_run, gate=gate_for(d.fleet, inc.reason)
            )
            # "already" on a node gpuwatchd has no record of draining: it drained, then
            # stopped before writing it down (a crash, a restart); re-count now. A drain
            # made now was admitted by its claim before it was written.
            if result.result == "already" and not owned.owned and d.fleet is not None:
                result = _confirm(d, d.fleet, inc, result)
    except DrainError as exc:
        return _failed(d, inc, now, exc)
    pages = failing_resolved(d.store, d.node, inc, now)
    if result.result == OVER_BUDGET:
        return _over_budget(d, inc, now, result, held, pages)
    with d.store.tx() as conn:
        drained_at = now if result.counts else None
        mark_done(conn, inc.key, result.result, result.detail, drained_at)
        if result.owns:
            mark_owned(conn, inc.reason, now, result.result)
        if d.pretend and result.result == "dry_run":
            set_note(conn, "dry_run_drained", inc.reason)
    return Step(inc, result.result, result.detail, outcomes=tuple(pages), done=True)


def _failed(d: Drive, inc: Incident, now: float, exc: DrainError) -> Step:
    """The driver failed: try again after a backoff, or give up after ``attempts`` (never
    for an XID: the scheduler being unreachable for a while, a restart or an outage, must
    not leave a node with a fatal XID in service; it pages once and goes on trying)."""
    attempts = inc.attempts + 1
    error = str(exc)
    if attempts >= d.cfg.attempts and xid_of(inc.record) is None:
        with d.store.tx() as conn:
            mark_failed(conn, inc.key, attempts, error, now)
        summary = f"gpuwatchd could not drain {d.node}: {exc}"
        page = outcome(d.node, DrainOutcomeKind.FAILED, True, inc, now, summary)
        detail = f"gave up after {attempts} attempts: {exc}"
        return Step(inc, "failed", detail, error=error, outcomes=(page,))
    with d.store.tx() as conn:
        schedule_retry(conn, inc.key, attempts, error, now + backoff(d.rng, attempts))
    if attempts < d.cfg.attempts:
        log.warning("drain %s: attempt %d failed: %s", d.node, attempts, exc)
        return Step(inc, error=error)
    log.warning("drain %s: attempt %d failed (trying again): %s", d.node, attempts, exc)
    if attempts != d.cfg.attempts:
        return Step(inc, error=error)
    with d.store.tx() as conn:
        set_note(conn, f"failing:{inc.key}", "firing")
    summary = (
        f"gpuwatchd could not drain {d.node} after {attempts} attempts and keeps trying: {exc}"
    )
    page = outcome(d.node, DrainOutcomeKind.FAILED, True, inc, now, summary)
    detail = f"{attempts} attempts failed, trying again: {exc}"
    return Step(inc, "failed", detail, error=error, outcomes=(page,))


def failing_resolved(store: Store, node: str, inc: Incident, now: float) -> list[DrainOutcome]:
    """The drain that kept failing went through (or its fault ended): resolve its page."""
    if note(store, f"failing:{inc.key}") != "firing":
        return []
    with store.tx() as conn:
        set_note(conn, f"failing:{inc.key}", "")
    summary = f"the drain of {node} that kept failing is no longer failing"
    return [outcome(node, DrainOutcomeKind.FAILED, False, inc, now, summary)]


def _rate_limited(d: Drive, inc: Incident, now: float) -> Step:
    with d.store.tx() as conn:
        limited = f"{d.cfg.max_drains} drains in {d.cfg.window:g}s already"
        mark_rate_limited(conn, inc.key, limited, now)
    detail = f"limit of {d.cfg.max_drains} drains per {d.cfg.window:g}s reached; not draining"
    pages = limit_page(d.store, d.cfg, d.node, inc, now)
    return Step(inc, "rate_limited", detail, outcomes=tuple(pages), rate_limited=True)


def _over_budget(
    d: Drive,
    inc: Incident,
    now: float,
    result: DrainResult,
    held: int,
    pages: list[DrainOutcome],
) -> Step:
    """Not drained: the incident stays pending and asks again after ``recheck``."""
    first = not str(inc.result or "").startswith(OVER_BUDGET)
    # while the budget stays full, ask again less often (up to 8 times recheck), each
    # at a random moment of its interval, so held-back nodes do not ask in step
    held = 1 if first else max(held, 1) + 1
    wait = d.cfg.fleet.recheck * min(2.0 ** (held - 1), RECHECK_MAX_FACTOR)
    wait *= d.rng.uniform(0.75, 1.0)
    with d.store.tx() as conn:
        hold_back(conn, inc.key, f"{OVER_BUDGET}: {result.detail}", now + wait)
    if not first:
        log.info("drain %s: still over the fleet budget: %s", d.node, result.detail)
    pages = pages + budget_page(d.store, d.cfg, d.node, d.fleet, inc, now)
    name = result.result if first else ""
    return Step(inc, name, result.detail if first else "", outcomes=tuple(pages), held=held)


def _confirm(d: Drive, fleet: FleetBudget, inc: Incident, result: DrainResult) -> DrainResult:
    """A drain of ours found without a record of it (a restart between the drain and
    writing it down): re-count; above the budget, release it at once. A release that
    fails is an error: the incident tries again, and re-counts again."""
    verdict = fleet.confirm()
    if verdict.allowed:
        return result
    try:
        released = d.driver.resume(inc.as_mapping(), False)
    except DrainError as exc:
        raise DrainError(
            f"over the fleet budget ({verdict.detail}), and the release failed: {exc}"
        ) from None
    if released.result == "resumed":
        try:
            fleet.released()
        except DrainError as exc:  # the claim expires by itself (CLAIM_TTL)
            log.warning("fleet budget: could not take %s's claim off: %s", d.node, exc)
    return DrainResult(
        OVER_BUDGET,
        f"fleet drain budget spent: released after the re-count ({released.result}): "
        f"{verdict.detail}",
    )
