"""The outbox: every SQL statement about transitions, alerts, groups and deliveries.

A transition is committed here (with its routing into groups, its silence and its drain
incident) before anything leaves the node; delivery workers then read due deliveries and
mark them sent, retried or dropped. The database itself (WAL, the in-memory fallback) is
``gpuwatchd.actions.store``.

Two clocks: wall-clock times are what payloads and the status API show (when a transition
arrived, when a delivery was done); every timer (group waits, repeats, retry backoff,
expiry) is on the clock's monotonic reading, so that stepping the wall clock never drops
nor holds a page. A monotonic reading only means something within one boot: the outbox
keeps the last reading it wrote, and when the clock restarted below it (a reboot, a new
virtual clock) it shifts every stored timer by the difference at open - the time the
daemon was down counts as no time. An outbox written by an older version (wall-clock
timers) is converted once.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwatchd.actions.grouping import Member, adds_page, next_flush, plan_flush, unsent_page
from gpuwatchd.actions.model import alert_record, dumps, group_key, match_labels
from gpuwatchd.actions.receivers import Receiver
from gpuwatchd.actions.routing import Destination, Router
from gpuwatchd.actions.store import Store, loads
from gpuwatchd.config.actions import RoutingConfig
from gpuwatchd.core.alerts import AlertState, AlertTransition
from gpuwatchd.core.clock import Clock

log = logging.getLogger(__name__)

KEEP_DONE = 7 * 86400.0  # finished deliveries and resolved alerts are kept this long
KEEP_INCIDENTS = 30 * 86400.0
TRIMMED = "trimmed"  # outcome of a pending delivery that is retried with a trimmed payload

Current = Callable[[str, str], "tuple[Mapping[str, str], float | None] | None"]
"""A firing alert's annotations and value now (by rule and fingerprint), or None."""

SilencedBy = Callable[[Mapping[str, Any], float], "str | None"]
"""The id of the silence muting an alert record at a wall-clock time, or None."""


class IncidentBook(Protocol):
    """The drain side of a commit: incidents opened and closed in the same transaction."""

    def admit(
        self, conn: sqlite3.Connection, rec: dict[str, Any], silence: str | None, now: float
    ) -> None: ...

    def resolved(self, conn: sqlite3.Connection, fingerprint: str, now: float) -> None: ...


@dataclass
class Committed:
    new: int = 0
    duplicates: int = 0
    muted: int = 0
    drops: list[tuple[str, str]] = field(default_factory=list)  # (receiver, reason)


class Outbox:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        node: str,
        routing: RoutingConfig,
        receivers: Mapping[str, Receiver],
        busy: Callable[[], set[int]] = set,
    ) -> None:
        self.store = store
        self.clock = clock
        self.node = node
        self.busy = busy  # ids being sent right now: never dropped by the queue bound
        self.current: Current | None = None  # the rule engine's live texts (use_current)
        self.configure(routing, receivers)
        self._rebase()

    def configure(self, routing: RoutingConfig, receivers: Mapping[str, Receiver]) -> None:
        """Routing and receivers (at start and on a reload)."""
        self.routing = routing
        self.receivers = dict(receivers)
        self.router = Router(routing, self.receivers)

    # -- the monotonic timers across restarts ------------------------------------------
    def _rebase(self) -> None:
        mono, wall = self.clock.monotonic(), self.clock.now()
        with self.store.tx() as conn:
            kind = Store.get_meta(conn, "timer_clock")
            if kind != "monotonic":  # written by a version that kept wall-clock timers
                self._convert_wall_timers(conn, mono, wall)
                Store.set_meta(conn, "timer_clock", "monotonic")
            else:
                last = float(Store.get_meta(conn, "mono_last") or 0.0)
                if last > mono:
                    self._shift(conn, mono - last)
                    log.info("outbox: the monotonic clock restarted; timers moved with it")
            Store.set_meta(conn, "mono_last", repr(mono))

    @staticmethod
    def _convert_wall_timers(conn: sqlite3.Connection, mono: float, wall: float) -> None:
        conn.execute(
            "UPDATE deliveries SET created = ? - MAX(0, ? - created), "
            "next_attempt = ? + MAX(0, next_attempt - ?) WHERE status='pending'",
            (mono, wall, mono, wall),
        )
        conn.execute(
            "UPDATE groups SET flush_at = ? + MAX(0, flush_at - ?) WHERE flush_at IS NOT NULL",
            (mono, wall),
        )
        conn.execute(
            "UPDATE groups SET last_flush = ? - MAX(0, ? - last_flush) "
            "WHERE last_flush IS NOT NULL",
            (mono, wall),
        )

    @staticmethod
    def _shift(conn: sqlite3.Connection, delta: float) -> None:
        conn.execute(
            "UPDATE deliveries SET created = created + ?, next_attempt = next_attempt + ? "
            "WHERE status='pending'",
            (delta, delta),
        )
        conn.execute(
            "UPDATE groups SET flush_at = flush_at + ?, last_flush = last_flush + ?",
            (delta, delta),
        )

    @staticmethod
    def _stamp(conn: sqlite3.Connection, mono: float) -> None:
        Store.set_meta(conn, "mono_last", repr(mono))

    # -- committing transitions --------------------------------------------------------
    def commit(
        self,
        transitions: Iterable[AlertTransition],
        silenced_by: SilencedBy,
        incidents: IncidentBook | None,
    ) -> Committed:
        """Write transitions, route them into groups, open or close drain incidents, and
        turn groups that may speak now into deliveries: all in one transaction."""
        now, mono = self.clock.now(), self.clock.monotonic()
        done = Committed()
        with self.store.tx() as conn:
            for t in transitions:
                if t.state not in (AlertState.FIRING, AlertState.RESOLVED):
                    continue
                rec = alert_record(t, now)
                cur = conn.execute(
                    "INSERT OR IGNORE INTO transitions(key, fingerprint, state, received, record) "
                    "VALUES(?, ?, ?, ?, ?)",
                    (t.idempotency_key, t.fingerprint, t.state.value, now, dumps(rec)),
                )
                if not cur.rowcount:
                    done.duplicates += 1
                    continue
                done.new += 1
                tid = int(cur.lastrowid or 0)
                if t.state is AlertState.FIRING:
                    silence = silenced_by(rec, now)
                    conn.execute(
                        "INSERT INTO alerts(fingerprint, transition_id, state, silenced, updated) "
                        "VALUES(?, ?, 'firing', ?, ?) ON CONFLICT(fingerprint) DO UPDATE SET "
                        "transition_id=excluded.transition_id, state='firing', "
                        "silenced=excluded.silenced, updated=excluded.updated",
                        (t.fingerprint, tid, silence, now),
                    )
                    if silence is None:
                        self._route_in(conn, rec, tid, mono)
                    else:
                        done.muted += 1
                        log.info("%s %s silenced by %s", t.rule, dict(t.labels), silence)
                    if t.drain and incidents is not None:
                        incidents.admit(conn, rec, silence, now)
                else:
                    conn.execute(
                        "INSERT INTO alerts(fingerprint, transition_id, state, silenced, updated) "
                        "VALUES(?, ?, 'resolved', NULL, ?) ON CONFLICT(fingerprint) DO UPDATE SET "
                        "transition_id=excluded.transition_id, state='resolved', silenced=NULL, "
                        "updated=excluded.updated",
                        (t.fingerprint, tid, now),
                    )
                    self._resolve_in(conn, t.fingerprint, tid, mono, now, silenced_by)
                    if incidents is not None:
                        incidents.resolved(conn, t.fingerprint, now)
            if done.new:
                done.drops = self._flush_due(conn, mono, now, silenced_by)
                self._stamp(conn, mono)
        return done

    def _route_in(
        self, conn: sqlite3.Connection, rec: dict[str, Any], tid: int, mono: float
    ) -> None:
        labels = match_labels(rec)
        for dest in self.router.route(rec):
            glabels = {k: labels.get(k, "") for k in dest.group_by}
            gkey = group_key(dest.receiver, glabels)
            prior = conn.execute(
                "SELECT state FROM group_alerts WHERE receiver=? AND gkey=? AND fingerprint=?",
                (dest.receiver, gkey, rec["fingerprint"]),
            ).fetchone()
            urgent = adds_page(rec, None if prior is None else str(prior["state"]))
            self._touch_group(conn, dest, gkey, glabels, mono, urgent)
            conn.execute(
                "INSERT INTO group_alerts(receiver, gkey, fingerprint, transition_id, state, "
                "changed) VALUES(?, ?, ?, ?, 'firing', 1) "
                "ON CONFLICT(receiver, gkey, fingerprint) DO UPDATE "
                "SET transition_id=excluded.transition_id, state='firing', changed=1",
                (dest.receiver, gkey, rec["fingerprint"], tid),
            )

    @staticmethod
    def _touch_group(
        conn: sqlite3.Connection,
        dest: Destination,
        gkey: str,
        glabels: dict[str, str],
        mono: float,
        urgent: bool,
    ) -> None:
        """Plan the flush of a group that changed (``urgent``: the change adds a page)."""
        row = conn.execute(
            "SELECT flush_at, last_flush FROM groups WHERE receiver=? AND gkey=?",
            (dest.receiver, gkey),
        ).fetchone()
        if row is None:
            conn.execute(
                "INSERT INTO groups(receiver, gkey, labels, flush_at, last_flush, group_wait, "
                "repeat_interval) VALUES(?, ?, ?, ?, NULL, ?, ?)",
                (
                    dest.receiver,
                    gkey,
                    dumps(glabels),
                    mono,
                    dest.group_wait,
                    dest.repeat_interval,
                ),
            )
            return
        last = None if row["last_flush"] is None else float(row["last_flush"])
        pending = None if row["flush_at"] is None else float(row["flush_at"])
        flush_at = next_flush(mono, last, dest.group_wait, pending=pending, urgent=urgent)
        conn.execute(
            "UPDATE groups SET flush_at=?, group_wait=?, repeat_interval=? "
            "WHERE receiver=? AND gkey=?",
            (flush_at, dest.group_wait, dest.repeat_interval, dest.receiver, gkey),
        )

    def _resolve_in(
        self,
        conn: sqlite3.Connection,
        fingerprint: str,
        tid: int,
        mono: float,
        now: float,
        silenced_by: SilencedBy,
    ) -> None:
        rows = conn.execute(
            "SELECT ga.receiver, ga.gkey, ga.state, ga.changed, t.record "
            "FROM group_alerts ga JOIN transitions t ON t.id = ga.transition_id "
            "WHERE ga.fingerprint=?",
            (fingerprint,),
        ).fetchall()
        for ga in rows:
            where = (ga["receiver"], ga["gkey"])
            firing = loads(ga["record"])
            if unsent_page(firing, ga["state"], bool(ga["changed"])) and (
                silenced_by(firing, now) is None
            ):  # the page resolves before its message was built: send it firing first
                g = conn.execute("SELECT * FROM groups WHERE receiver=? AND gkey=?", where)
                self._flush_group(conn, g.fetchone(), mono, now, silenced_by, repeat=False)
            r = conn.execute(
                "SELECT flush_at, last_flush, group_wait FROM groups WHERE receiver=? AND gkey=?",
                where,
            ).fetchone()
            if r is None:  # the receiver left the config: the group went with it
                continue
            conn.execute(
                "UPDATE group_alerts SET transition_id=?, state='resolved', changed=1 "
                "WHERE receiver=? AND gkey=? AND fingerprint=?",
                (tid, *where, fingerprint),
            )
            if r["flush_at"] is None:
                last = None if r["last_flush"] is None else float(r["last_flush"])
                conn.execute(
                    "UPDATE groups SET flush_at=? WHERE receiver=? AND gkey=?",
                    (next_flush(mono, last, float(r["group_wait"])), *where),
                )

    # -- group flushes -----------------------------------------------------------------
    def flush_due(self, silenced_by: SilencedBy) -> list[tuple[str, str]]:
        """Turn every group whose time has come into deliveries (the scheduler)."""
        now, mono = self.clock.now(), self.clock.monotonic()
        due = self.store.query(
            "SELECT 1 FROM groups WHERE (flush_at IS NOT NULL AND flush_at <= ?) OR "
            "(flush_at IS NULL AND last_flush IS NOT NULL AND last_flush + repeat_interval <= ?) "
            "LIMIT 1",
            (mono, mono),
        )
        if not due:
            return []
        with self.store.tx() as conn:
            drops = self._flush_due(conn, mono, now, silenced_by)
            self._stamp(conn, mono)
        return drops

    def _flush_due(
        self, conn: sqlite3.Connection, mono: float, now: float, silenced_by: SilencedBy
    ) -> list[tuple[str, str]]:
        groups = conn.execute(
            "SELECT * FROM groups WHERE (flush_at IS NOT NULL AND flush_at <= ?) OR "
            "(flush_at IS NULL AND last_flush IS NOT NULL AND last_flush + repeat_interval <= ?) "
            "ORDER BY COALESCE(flush_at, last_flush + repeat_interval), receiver, gkey",
            (mono, mono),
        ).fetchall()
        for g in groups:
            self._flush_group(conn, g, mono, now, silenced_by)
        return self._enforce_bound(conn, now)

    def _flush_group(
        self,
        conn: sqlite3.Connection,
        g: sqlite3.Row,
        mono: float,
        now: float,
        silenced_by: SilencedBy,
        *,
        repeat: bool | None = None,
    ) -> None:
        """Turn one group into deliveries (``repeat``: a repeat of its firing alerts; by
        default, when it has no flush planned)."""
        receiver, gkey = g["receiver"], g["gkey"]
        where = (receiver, gkey)
        rcv = self.receivers.get(receiver)
        if rcv is None:  # the receiver left the config
            conn.execute("DELETE FROM group_alerts WHERE receiver=? AND gkey=?", where)
            conn.execute("DELETE FROM groups WHERE receiver=? AND gkey=?", where)
            return
        rows = conn.execute(
            "SELECT ga.fingerprint, ga.state, ga.changed, t.key, t.received, t.record "
            "FROM group_alerts ga JOIN transitions t ON t.id = ga.transition_id "
            "WHERE ga.receiver=? AND ga.gkey=? ORDER BY t.id",
            where,
        ).fetchall()
        members = [
            Member(
                r["fingerprint"],
                r["state"],
                bool(r["changed"]),
                r["key"],
                float(r["received"]),
                self._live(loads(r["record"]), r["state"]),
            )
            for r in rows
        ]
        if repeat is None:
            repeat = g["flush_at"] is None
        targets = list(range(len(rcv.targets)))
        if repeat:  # a target still working through this group's queue gets no repeat on top
            busy = {
                int(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT target FROM deliveries WHERE receiver=? AND gkey=? "
                    "AND status='pending'",
                    where,
                )
            }
            targets = [t for t in targets if t not in busy]
        message = plan_flush(
            receiver=receiver,
            gkey=gkey,
            group_labels=loads(g["labels"]),
            node=self.node,
            members=members,
            repeat=repeat,
            first=g["last_flush"] is None,
            send_resolved=rcv.send_resolved,
            muted=lambda rec: silenced_by(rec, now) is not None,
            now=mono,
            wall_now=now,
        )
        sent = message is not None and bool(targets)
        if message is not None:
            body = dumps(message.note)
            for target in targets:
                conn.execute(
                    "INSERT INTO deliveries(receiver, target, gkey, key, kind, status, severity, "
                    "created, received, next_attempt, body) VALUES(?, ?, ?, ?, ?, 'pending', ?, "
                    "?, ?, ?, ?)",
                    (
                        receiver,
                        target,
                        gkey,
                        message.key,
                        message.note["kind"],
                        message.severity_rank,
                        mono,
                        message.received,
                        mono,
                        body,
                    ),
                )
        conn.execute(
            "DELETE FROM group_alerts WHERE receiver=? AND gkey=? AND state='resolved'", where
        )
        conn.execute("UPDATE group_alerts SET changed=0 WHERE receiver=? AND gkey=?", where)
        left = conn.execute(
            "SELECT COUNT(*) FROM group_alerts WHERE receiver=? AND gkey=?", where
        ).fetchone()[0]
        if not left:
            conn.execute("DELETE FROM groups WHERE receiver=? AND gkey=?", where)
        elif sent or repeat:
            conn.execute(
                "UPDATE groups SET flush_at=NULL, last_flush=?, "
                "repeat_interval=COALESCE(?, repeat_interval) WHERE receiver=? AND gkey=?",
                (mono, self._repeat_every(receiver, members), *where),
            )
        else:
            conn.execute("UPDATE groups SET flush_at=NULL WHERE receiver=? AND gkey=?", where)

    def _repeat_every(self, receiver: str, members: list[Member]) -> float | None:
        """How often the group is repeated from now on: as its most urgent firing alert
        asks (a page every ``repeat_interval``, a ticket at most daily; ``Router``)."""
        every = [
            d.repeat_interval
            for m in members
            if m.state == "firing"
            for d in self.router.route(m.record)
            if d.receiver == receiver
        ]
        return min(every, default=None)

    def _live(self, record: dict[str, Any], state: str) -> dict[str, Any]:
        """A firing alert's record with the annotations and value of the engine's last
        evaluation: a repeat (or an update) says what holds now, not what held when the
        transition was written."""
        if state != "firing" or self.current is None:
            return record
        found = self.current(str(record.get("rule")), str(record.get("fingerprint")))
        if found is not None:
            annotations, value = found
            record["annotations"] = dict(sorted(annotations.items()))
            record["value"] = value
        return record

    def _enforce_bound(self, conn: sqlite3.Connection, now: float) -> list[tuple[str, str]]:
        """Keep at most routing.queue_size pending deliveries: drop the least severe,
        oldest first (never one being sent right now)."""
        pending = int(
            conn.execute("SELECT COUNT(*) FROM deliveries WHERE status='pending'").fetchone()[0]
        )
        excess = pending - self.routing.queue_size
        if excess <= 0:
            return []
        busy = sorted(self.busy())
        spare = f"AND id NOT IN ({','.join('?' * len(busy))}) " if busy else ""
        victims = conn.execute(
            f"SELECT id, receiver FROM deliveries WHERE status='pending' {spare}"
            "ORDER BY severity, id LIMIT ?",
            (*busy, excess),
        ).fetchall()
        conn.executemany(
            "UPDATE deliveries SET status='dropped', outcome='queue_full', done_at=? WHERE id=?",
            [(now, v["id"]) for v in victims],
        )
        if victims:
            log.warning(
                "outbox full (%d pending): dropped %d least severe, oldest deliveries",
                pending,
                len(victims),
            )
        return [(v["receiver"], "queue_full") for v in victims]

    def next_flush_at(self) -> float | None:
        """The monotonic time of the next group flush or repeat, if any."""
        row = self.store.query(
            "SELECT MIN(COALESCE(flush_at, last_flush + repeat_interval)) FROM groups"
        )
        return None if not row or row[0][0] is None else float(row[0][0])

    # -- silences that end -------------------------------------------------------------
    def unmute(self, silenced_by: SilencedBy) -> list[str]:
        """Route firing alerts whose silence has ended (as Alertmanager does); the rules."""
        rows = self.store.query(
            "SELECT a.fingerprint, t.id, t.record FROM alerts a JOIN transitions t "
            "ON t.id = a.transition_id WHERE a.state='firing' AND a.silenced IS NOT NULL"
        )
        if not rows:
            return []
        now, mono = self.clock.now(), self.clock.monotonic()
        out: list[str] = []
        with self.store.tx() as conn:
            for r in rows:
                rec = loads(r["record"])
                if silenced_by(rec, now) is None:
                    conn.execute(
                        "UPDATE alerts SET silenced=NULL WHERE fingerprint=?", (r["fingerprint"],)
                    )
                    self._route_in(conn, rec, int(r["id"]), mono)
                    out.append(str(rec["rule"]))
        return out

    # -- deliveries --------------------------------------------------------------------
    def heads(self, receiver: str, target: int) -> list[sqlite3.Row]:
        """The oldest pending delivery of each group of one receiver target."""
        return self.store.query(
            "SELECT * FROM deliveries d WHERE receiver=? AND target=? AND status='pending' AND "
            "id = (SELECT MIN(id) FROM deliveries e WHERE e.receiver=d.receiver AND "
            "e.target=d.target AND e.gkey=d.gkey AND e.status='pending') ORDER BY id",
            (receiver, target),
        )

    def batch(self, receiver: str, target: int, limit: int) -> list[sqlite3.Row]:
        """The oldest pending deliveries of one receiver target (a coalescing receiver)."""
        return self.store.query(
            "SELECT * FROM deliveries WHERE receiver=? AND target=? AND status='pending' "
            "ORDER BY id LIMIT ?",
            (receiver, target, limit),
        )

    def mark_sent(self, ids: list[int], done: float) -> None:
        with self.store.tx() as conn:
            conn.executemany(
                "UPDATE deliveries SET status='sent', outcome='ok', done_at=?, "
                "attempts=attempts+1, last_error=NULL WHERE id=?",
                [(done, i) for i in ids],
            )

    def mark_retry(self, ids: list[int], due: float, detail: str, *, trim: bool = False) -> None:
        """Another attempt at monotonic time ``due`` (``trim``: with a trimmed payload)."""
        with self.store.tx() as conn:
            conn.executemany(
                "UPDATE deliveries SET attempts=attempts+1, next_attempt=?, last_error=?, "
                "outcome=CASE WHEN ? THEN ? ELSE outcome END WHERE id=?",
                [(due, detail, trim, TRIMMED, i) for i in ids],
            )
            self._stamp(conn, self.clock.monotonic())

    def drop(self, ids: list[int], reason: str, detail: str, done: float) -> None:
        with self.store.tx() as conn:
            conn.executemany(
                "UPDATE deliveries SET status='dropped', outcome=?, done_at=?, last_error=? "
                "WHERE id=?",
                [(reason, done, detail, i) for i in ids],
            )

    def drop_receiver(self, receiver: str, done: float) -> int:
        """Drop what waits for a receiver that left the config; how many were dropped."""
        with self.store.tx() as conn:
            cur = conn.execute(
                "UPDATE deliveries SET status='dropped', outcome='unconfigured', done_at=? "
                "WHERE receiver=? AND status='pending'",
                (done, receiver),
            )
            return int(cur.rowcount or 0)

    # -- counts, status, pruning -------------------------------------------------------
    def queued(self) -> dict[str, int]:
        rows = self.store.query(
            "SELECT receiver, COUNT(*) AS n FROM deliveries WHERE status='pending' "
            "GROUP BY receiver"
        )
        return {r["receiver"]: int(r["n"]) for r in rows}

    def pending(self) -> int:
        return int(self.store.query("SELECT COUNT(*) FROM deliveries WHERE status='pending'")[0][0])

    def oldest(self, receiver: str) -> tuple[int, float | None]:
        """How many deliveries wait for ``receiver``, and the monotonic time of the oldest."""
        row = self.store.query(
            "SELECT COUNT(*) AS n, MIN(created) AS oldest FROM deliveries WHERE receiver=? "
            "AND status='pending'",
            (receiver,),
        )[0]
        return int(row["n"]), None if row["oldest"] is None else float(row["oldest"])

    def queue(self, limit: int) -> list[sqlite3.Row]:
        return self.store.query(
            "SELECT id, receiver, target, kind, attempts, next_attempt, created, last_error, body "
            "FROM deliveries WHERE status='pending' ORDER BY id LIMIT ?",
            (limit,),
        )

    def firing(self) -> list[sqlite3.Row]:
        return self.store.query(
            "SELECT a.fingerprint, a.silenced, t.record FROM alerts a JOIN transitions t "
            "ON t.id = a.transition_id WHERE a.state='firing' ORDER BY t.id"
        )

    def prune(self) -> None:
        now = self.clock.now()
        cutoff = now - KEEP_DONE
        with self.store.tx() as conn:
            conn.execute(
                "DELETE FROM deliveries WHERE status != 'pending' AND done_at < ?", (cutoff,)
            )
            conn.execute("DELETE FROM alerts WHERE state='resolved' AND updated < ?", (cutoff,))
            conn.execute(
                "DELETE FROM transitions WHERE received < ? AND id NOT IN (SELECT transition_id "
                "FROM alerts) AND id NOT IN (SELECT transition_id FROM group_alerts)",
                (cutoff,),
            )
            conn.execute(
                "DELETE FROM incidents WHERE closed IS NOT NULL AND closed < ?",
                (now - KEEP_INCIDENTS,),
            )
