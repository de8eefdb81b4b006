"""The drain stage's report: the summary ``status`` shows, the health file
(``drain.state_file``) and the metrics, built from what the controller hands over (the
node's drain, its incidents, its counters). It decides nothing and writes no database."""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuwatchd.actions.drain.incidents import Incident, NodeDrain
from gpuwatchd.actions.fleet import FleetBudget
from gpuwatchd.config.actions import FleetDrainConfig
from gpuwatchd.core.atomicfile import write_atomic
from gpuwatchd.core.families import Families

# the logger keeps the name it had as one module (docs/config.md names it)
log = logging.getLogger("gpuwatchd.actions.drain")


def node_state(node: NodeDrain, pending: list[Incident]) -> str:
    """``drain_pending`` while a drain waits for its grace, ``drained`` while gpuwatchd
    owns the node's drain, else ``ok``."""
    if pending:
        return "drain_pending"
    return "drained" if node.owned else "ok"


def incident_summary(i: Incident) -> dict[str, Any]:
    return {
        "key": i.key,
        "rule": i.record["rule"],
        "gpu": (i.record.get("labels") or {}).get("gpu"),
        "reason": i.reason,
        "state": i.state,
        "opened": i.opened,
        "drain_at": i.drain_at,
        "resolved": i.resolved,
        "result": i.result,
        "attempts": i.attempts,
    }


def fleet_summary(
    cfg: FleetDrainConfig, fleet: FleetBudget | None, held_back: int
) -> dict[str, Any] | None:
    """The fleet budget's part of the summary (None: no fleet budget)."""
    if fleet is None:
        return None
    last = fleet.last
    return {
        "max_nodes": cfg.max_nodes,
        "max_percent": cfg.max_percent,
        "held_back": held_back,
        "budget": last.limit if last else None,
        "drained": last.count if last else None,
        "nodes": last.nodes if last else None,
    }


class HealthFile:
    """``drain.state_file``: rewritten (atomically) only when what it says changed; a
    write that fails is logged once."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._written: str | None = None
        self._warned = False

    def write(self, s: dict[str, Any], now: float) -> None:
        path = self.path
        if path is None:
            return
        doc = {
            "version": 1,
            "node": s["node"],
            "state": s["state"],
            "drain_pending": s["state"] == "drain_pending",
            "drain_at": s["drain_at"],
            "reason": s["reason"],
            "mode": s["mode"],
            "dry_run": s["dry_run"],
            "incidents": [i for i in s["incidents"] if i["resolved"] is None],
        }
        text = json.dumps(doc, sort_keys=True)
        if text == self._written:
            return
        doc["updated"] = now
        try:
            write_atomic(path, json.dumps(doc, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            if not self._warned:
                log.warning("cannot write the health file %s: %s", path, exc.strerror or exc)
                self._warned = True
            return
        self._written = text


def drain_families(
    fams: Families,
    s: dict[str, Any],
    counts: list[tuple[tuple[str, str], int]],
    rate_limited: int,
) -> None:
    """The drain metrics from a summary ``s``, the action counts and the rate-limited count."""
    fams.get(
        "gpuwatchd_drain_pending",
        "gauge",
        "1 while a drain of this node waits for its grace period to end.",
        [],
    ).add([], 1.0 if s["state"] == "drain_pending" else 0.0)
    fams.get(
        "gpuwatchd_drained",
        "gauge",
        "1 while the node is drained by gpuwatchd (or, for exec hooks, a drain hook ran).",
        [],
    ).add([], 1.0 if s["state"] == "drained" else 0.0)
    actions = fams.get(
        "gpuwatchd_drain_actions_total",
        "counter",
        "Drain and resume attempts by result (drained, already, kept_admin, dry_run, ...).",
        ["action", "result"],
    )
    for (action, result), n in counts:
        actions.add([action, result], float(n))
    fams.get(
        "gpuwatchd_drain_rate_limited_total",
        "counter",
        "Drains not done because drain.max_drains was reached within drain.window.",
        [],
    ).add([], float(rate_limited))
    fams.get(
        "gpuwatchd_drains_in_window",
        "gauge",
        "Drains done (or, in dry-run, that would have been) within the current drain.window.",
        [],
    ).add([], float(s["drains_in_window"]))
    fleet = s["fleet"]
    if fleet is None:
        return
    fams.get(
        "gpuwatchd_fleet_drain_held",
        "gauge",
        "Drain incidents of this node waiting because the fleet drain budget is spent.",
        [],
    ).add([], float(fleet["held_back"]))
    for name, key, text in (
        ("budget_nodes", "budget", "The fleet drain budget at the last count (nodes)."),
        ("drained_nodes", "drained", "Nodes drained by gpuwatchd at the last count."),
    ):
        fam = fams.get(f"gpuwatchd_fleet_{name}", "gauge", text, [])
        if fleet[key] is not None:
            fam.add([], float(fleet[key]))
