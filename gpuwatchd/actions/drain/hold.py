"""Holding the node out of service while a drain incident is active.

If another owner (an operator, a scheduler) resumes the node, the driver drains it again;
if another owner drained it, gpuwatchd's reason is added next to theirs. Only drivers that
read the node's state hold (slurm, kubernetes), never in dry-run. The controller decides
when (every ``drain.hold_interval``) and records the outcome; a hold step itself is the
store, the driver and the time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver, Gate
from gpuwatchd.actions.drain.incidents import Incident, active_in, mark_owned, released, reopen
from gpuwatchd.actions.drain.pages import OVER_BUDGET, PENDING
from gpuwatchd.actions.store import Store

# Incident states in which the node must stay out of service while the fault is active.
HELD_STATES = ("drained", "already", "kept_admin", "noted")
HOLD_RESULTS = ("reasserted", "noted", "over_budget", "failed")


@dataclass(frozen=True)
class HoldStep:
    """What one hold did to ``incident``: the driver's ``result`` (``None``: nothing to
    do), or ``error`` when the driver failed."""

    incident: Incident
    result: DrainResult | None = None
    error: str | None = None


def held(store: Store) -> list[Incident]:
    """The incidents that keep the node out of service, oldest first."""
    return active_in(store, HELD_STATES)


def to_hold(
    store: Store, now: float, silenced_by: Callable[[dict[str, Any], float], str | None] | None
) -> Incident | None:
    """The incident to hold the node for now (a silenced one lets the node back)."""
    incidents = held(store)
    if silenced_by is not None:
        incidents = [i for i in incidents if silenced_by(i.record, now) is None]
    return incidents[0] if incidents else None


def hold(store: Store, driver: Driver, now: float, inc: Incident, gate: Gate | None) -> HoldStep:
    """Keep the node out of service for ``inc``; a drain gpuwatchd now owns is noted.

    A node found back in service that the fleet budget does not let us drain again is not
    held: gpuwatchd no longer owns a drain of it (status and metrics say so at once), and
    the incident is pending again, due now, so the drain's own steps hold it back, page
    and ask again as for any drain over the budget (an admin resumed it, or the scheduler
    lost our drain, and another node took the place)."""
    try:
        result = driver.hold(inc.reason, gate=gate)
    except DrainError as exc:
        return HoldStep(inc, error=str(exc))
    if result is not None and result.owns:
        with store.tx() as conn:
            mark_owned(conn, inc.reason, now, result.result)
    elif result is not None and result.result == OVER_BUDGET:
        with store.tx() as conn:
            released(conn, OVER_BUDGET)
            reopen(conn, inc.key, PENDING, f"back in service: {result.detail}", now)
    return HoldStep(inc, result)
