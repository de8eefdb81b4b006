"""The drain's repository: every statement on the outbox database's ``incidents``,
``node_drain`` and drain notes in ``meta`` (``actions/store.py`` holds their schema).

The controller reads frozen values only: ``Incident`` (one per row; ``record`` is the
firing transition's record, decoded) through named readers (``due``, ``to_announce``,
``active_in``, ...; ``_load`` is the one place that reads incident rows), ``NodeDrain``
(whether gpuwatchd owns the node's drain) and notes (``note``). Writes take the caller's
connection so they join its transaction: ``open_incident``, ``cancel_pending`` and
``mark_resolved`` when an alert fires or resolves, the others as the drain steps.
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


def _load(store: Store, where: str, args: tuple[Any, ...] = ()) -> list[Incident]:
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


# -- the incidents the controller steps through ------------------------------------------
def to_announce(store: Store, pending: str) -> list[Incident]:
    """Pending incidents with a grace whose ``drain_pending`` notice has not run."""
    return _load(store, "state=? AND notified=0 AND drain_at > opened", (pending,))


def due(store: Store, pending: str, now: float) -> list[Incident]:
    """Pending incidents whose grace is over and whose retry time has come."""
    return _load(store, "state=? AND drain_at <= ? AND next_attempt <= ?", (pending, now, now))


def gave_up_since(store: Store, attempts: int, since: float) -> list[Incident]:
    """Cancelled incidents closed after ``since`` that had failed ``attempts`` times."""
    return _load(store, "state='cancelled' AND attempts >= ? AND closed > ?", (attempts, since))


def failed_and_resolved(store: Store) -> list[Incident]:
    """Failed incidents whose fault resolved and whose page has not been told so."""
    return _load(store, "state='failed' AND resolved IS NOT NULL AND notified < 2")


def silenced_active(store: Store) -> list[Incident]:
    """Incidents a silence held back whose alert still fires."""
    return _load(store, "state='silenced' AND resolved IS NULL")


def active_in(store: Store, states: tuple[str, ...]) -> list[Incident]:
    """Incidents in one of ``states`` whose alert has not resolved."""
    marks = ",".join("?" * len(states))
    return _load(store, f"state IN ({marks}) AND resolved IS NULL", states)


def in_states(store: Store, states: tuple[str, ...]) -> list[Incident]:
    """Incidents in one of ``states``, oldest first."""
    marks = ",".join("?" * len(states))
    return _load(store, f"state IN ({marks})", states)


def open_or_closed_since(store: Store, since: float) -> list[Incident]:
    """Incidents still open, or closed after ``since`` (what status shows)."""
    return _load(store, "closed IS NULL OR closed > ?", (since,))


def others_announced(conn: sqlite3.Connection, pending: str, key: str) -> int:
    """How many other pending incidents had their ``drain_pending`` notice run."""
    sql = "SELECT COUNT(*) FROM incidents WHERE state=? AND notified=1 AND key<>?"
    return int(conn.execute(sql, (pending, key)).fetchone()[0])


# -- incident writes (in the caller's transaction) ---------------------------------------
def unsilence(conn: sqlite3.Connection, key: str, pending: str, drain_at: float) -> None:
    """A silenced incident whose alert still fires is pending again, due at ``drain_at``."""
    conn.execute(
        "UPDATE incidents SET state=?, closed=NULL, drain_at=?, next_attempt=0 "
        "WHERE key=? AND state='silenced'",
        (pending, drain_at, key),
    )


def mark_done(
    conn: sqlite3.Connection, key: str, state: str, detail: str, drained_at: float | None
) -> None:
    """The driver answered: the incident takes its result (``drained_at`` if it counts)."""
    conn.execute(
        "UPDATE incidents SET state=?, result=?, attempts=0, next_attempt=0, drained_at=?, "
        "last_error=NULL WHERE key=?",
        (state, detail, drained_at, key),
    )


def hold_back(conn: sqlite3.Connection, key: str, result: str, next_attempt: float) -> None:
    """Not drained (over the fleet budget): stays pending and asks again at ``next_attempt``."""
    conn.execute(
        "UPDATE incidents SET result=?, attempts=0, next_attempt=? WHERE key=?",
        (result, next_attempt, key),
    )


def reopen(conn: sqlite3.Connection, key: str, pending: str, result: str, now: float) -> None:
    """A held incident whose node is back in service and could not be drained again (the
    fleet budget is spent): it is pending again, due at once, like a new drain (its first
    drain's time stays: it still counts against ``drain.max_drains``)."""
    conn.execute(
        "UPDATE incidents SET state=?, result=?, attempts=0, next_attempt=? WHERE key=?",
        (pending, result, now, key),
    )


def mark_resumed(conn: sqlite3.Connection, now: float) -> None:
    """The node was resumed: the drained incidents whose alerts resolved are over."""
    conn.execute(
        "UPDATE incidents SET state='resumed', closed=COALESCE(closed, ?) "
        "WHERE state IN ('drained', 'already', 'noted') AND resolved IS NOT NULL",
        (now,),
    )


# -- the node's drain (one row) ----------------------------------------------------------
@dataclass(frozen=True)
class NodeDrain:
    """Whether gpuwatchd owns the node's drain in the scheduler, and its resume's retries."""

    owned: bool
    reason: str | None
    drained_at: float | None
    resume_attempts: int
    next_attempt: float
    last_error: str | None
    last_result: str | None


def ensure_node_drain(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT OR IGNORE INTO node_drain(id) VALUES(1)")


def read_node_drain(store: Store) -> NodeDrain:
    row = dict(store.query("SELECT * FROM node_drain WHERE id=1")[0])
    row.pop("id")
    row["owned"] = bool(row["owned"])
    return NodeDrain(**row)


def node_owned(conn: sqlite3.Connection) -> bool:
    """Whether gpuwatchd owns the node's drain (inside a transaction)."""
    return bool(conn.execute("SELECT owned FROM node_drain WHERE id=1").fetchone()[0])


def mark_owned(conn: sqlite3.Connection, reason: str, now: float, result: str) -> None:
    """gpuwatchd drained the node (or holds it): it owns the drain; a first drain's reason
    and time stay."""
    conn.execute(
        "UPDATE node_drain SET owned=1, reason=COALESCE(reason, ?), "
        "drained_at=COALESCE(drained_at, ?), resume_attempts=0, next_attempt=0, "
        "last_result=? WHERE id=1",
        (reason, now, result),
    )


def resume_failed(conn: sqlite3.Connection, attempts: int, next_attempt: float, error: str) -> None:
    conn.execute(
        "UPDATE node_drain SET resume_attempts=?, next_attempt=?, last_error=? WHERE id=1",
        (attempts, next_attempt, error),
    )


def released(conn: sqlite3.Connection, result: str) -> None:
    """The node was resumed: gpuwatchd owns no drain of it."""
    conn.execute(
        "UPDATE node_drain SET owned=0, reason=NULL, drained_at=NULL, last_result=?, "
        "last_error=NULL WHERE id=1",
        (result,),
    )


# -- the drain's notes in ``meta`` (pages told, dry-run state) ---------------------------
def note(store: Store, name: str) -> str | None:
    row = store.query("SELECT value FROM meta WHERE key=?", (name,))
    return str(row[0][0]) if row and row[0][0] is not None else None


def has_note(store: Store, name: str) -> bool:
    """Whether the note was ever written (even empty)."""
    return bool(store.query("SELECT value FROM meta WHERE key=?", (name,)))


def set_note(conn: sqlite3.Connection, name: str, value: str) -> None:
    Store.set_meta(conn, name, value)
