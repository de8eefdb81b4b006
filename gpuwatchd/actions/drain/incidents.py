"""Drain incidents as the outbox database keeps them: one frozen ``Incident`` per row.

The columns are those of ``incidents`` in ``actions/store.py``; ``record`` is the firing
transition's record, decoded. ``load_incidents`` is the one place that reads incident rows;
``open_incident``, ``cancel_pending`` and ``mark_resolved`` write them when an alert fires
or resolves (in the caller's transaction).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, fields
from typing import Any

from gpuwatchd.actions.model import dumps
from gpuwatchd.actions.store import Store, loads


@dataclass(frozen=True)
class Incident:
    """One drain incident (a firing transition of a rule with ``drain=True``)."""

    key: str
    fingerprint: str
    record: dict[str, Any]
    reason: str
    state: str
    opened: float
    drain_at: float
    notified: int
    resolved: float | None
    attempts: int
    next_attempt: float
    last_error: str | None
    drained_at: float | None
    result: str | None
    closed: float | None

    def as_mapping(self) -> dict[str, Any]:
        """The incident as the drivers read it (``key``, ``reason``, ``record``, ...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def load_incidents(store: Store, where: str, args: tuple[Any, ...] = ()) -> list[Incident]:
    """The incidents matching ``where``, oldest first (ties by key)."""
    rows = store.query(f"SELECT * FROM incidents WHERE {where} ORDER BY opened, key", args)
    out = []
    for r in rows:
        d = dict(r)
        d["record"] = loads(d["record"])
        out.append(Incident(**d))
    return out


def open_incident(
    conn: sqlite3.Connection,
    rec: dict[str, Any],
    reason: str,
    state: str,
    now: float,
    drain_at: float,
    closed: float | None,
    next_attempt: float,
) -> bool:
    """Open the incident of a firing record once; False when its key is already known."""
    cur = conn.execute(
        "INSERT OR IGNORE INTO incidents(key, fingerprint, record, reason, state, opened, "
        "drain_at, closed, next_attempt) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            rec["idempotency_key"],
            rec["fingerprint"],
            dumps(rec),
            reason,
            state,
            now,
            drain_at,
            closed,
            next_attempt,
        ),
    )
    return bool(cur.rowcount)


def cancel_pending(conn: sqlite3.Connection, fingerprint: str, pending: str, now: float) -> int:
    """Cancel the alert's incidents still in ``pending``; how many were."""
    cur = conn.execute(
        "UPDATE incidents SET state='cancelled', closed=? WHERE fingerprint=? AND state=?",
        (now, fingerprint, pending),
    )
    return cur.rowcount


def mark_resolved(conn: sqlite3.Connection, fingerprint: str, now: float) -> None:
    """The alert resolved: its open incidents are resolved (and closed, if they were not)."""
    conn.execute(
        "UPDATE incidents SET resolved=?, closed=COALESCE(closed, ?) "
        "WHERE fingerprint=? AND resolved IS NULL",
        (now, now, fingerprint),
    )
