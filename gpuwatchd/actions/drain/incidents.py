"""Drain incidents as the outbox database keeps them: one frozen ``Incident`` per row.

The columns are those of ``incidents`` in ``actions/store.py``; ``record`` is the firing
transition's record, decoded. ``load_incidents`` is the one place that reads incident rows;
the counts and times the controller schedules by come from the small readers below;
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


def _scalar(store: Store, sql: str, args: tuple[Any, ...] = ()) -> Any:
    return store.query(sql, args)[0][0]


def drained_since(store: Store, since: float) -> int:
    """How many incidents drained the node after ``since`` (the rate limit's window)."""
    sql = "SELECT COUNT(*) FROM incidents WHERE drained_at IS NOT NULL AND drained_at > ?"
    return int(_scalar(store, sql, (since,)))


def oldest_drain_since(store: Store, since: float) -> float | None:
    """When the oldest drain after ``since`` was made (None: none was)."""
    value = _scalar(store, "SELECT MIN(drained_at) FROM incidents WHERE drained_at > ?", (since,))
    return None if value is None else float(value)


def pending_with_result(store: Store, pending: str, prefix: str) -> int:
    """How many pending incidents carry a result starting with ``prefix``."""
    sql = "SELECT COUNT(*) FROM incidents WHERE state=? AND result LIKE ?"
    return int(_scalar(store, sql, (pending, prefix + "%")))


def unresolved_count(store: Store) -> int:
    """How many incidents' alerts have not resolved yet."""
    return int(_scalar(store, "SELECT COUNT(*) FROM incidents WHERE resolved IS NULL"))


def last_resolved(store: Store) -> float | None:
    """When the last incident's alert resolved (None: none has)."""
    value = _scalar(store, "SELECT MAX(resolved) FROM incidents")
    return None if value is None else float(value)


def next_pending_due(store: Store, pending: str) -> float | None:
    """The earliest moment a pending incident is due (its grace over and its retry time)."""
    sql = "SELECT MIN(MAX(drain_at, next_attempt)) FROM incidents WHERE state=?"
    value = _scalar(store, sql, (pending,))
    return None if value is None else float(value)


def set_notified(conn: sqlite3.Connection, key: str, notified: int) -> None:
    """Note what was told of the incident (1: drain_pending ran; 2: its failure resolved)."""
    conn.execute("UPDATE incidents SET notified=? WHERE key=?", (notified, key))


def schedule_retry(
    conn: sqlite3.Connection, key: str, attempts: int, error: str, next_attempt: float
) -> None:
    """A drain attempt failed: count it and ask again at ``next_attempt``."""
    conn.execute(
        "UPDATE incidents SET attempts=?, last_error=?, next_attempt=? WHERE key=?",
        (attempts, error, next_attempt, key),
    )


def mark_failed(conn: sqlite3.Connection, key: str, attempts: int, error: str, now: float) -> None:
    """The drain was given up after ``attempts`` tries."""
    conn.execute(
        "UPDATE incidents SET state='failed', attempts=?, last_error=?, closed=? WHERE key=?",
        (attempts, error, now, key),
    )


def mark_rate_limited(conn: sqlite3.Connection, key: str, result: str, now: float) -> None:
    """The node's drain limit was reached: this incident drains nothing."""
    conn.execute(
        "UPDATE incidents SET state='rate_limited', result=?, closed=? WHERE key=?",
        (result, now, key),
    )
