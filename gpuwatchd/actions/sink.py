"""``ActionsSink``: the pipeline's sink for alert transitions - outbox, receivers, drain.

``deliver`` commits each transition to the outbox (and opens drain incidents) before
anything leaves the node, routes it into aggregation groups, and wakes the workers:

- one sender thread per receiver target (an Alertmanager receiver has one per URL) sends
  the pending deliveries of its target in order, with timeouts, exponential backoff with
  jitter and ``Retry-After``; a slow receiver never holds up another;
- a scheduler thread flushes groups when their window ends, repeats still-firing
  notifications, looks at silences again when one starts or ends, and prunes old rows;
- a drain thread runs the drain controller.

``threaded=False`` runs nothing in the background: ``run_pending(now)`` does the due work
in the caller (``simulate``, deterministic tests). Everything takes time from the clock.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from gpuwatchd.actions.drain import DrainController
from gpuwatchd.actions.drivers import Driver, ExecDriver, RecordDriver, SlurmDriver
from gpuwatchd.actions.metrics import ActionMetrics
from gpuwatchd.actions.model import (
    SEVERITY_RANK,
    alert_record,
    dumps,
    group_key,
    match_labels,
    notification_key,
    short_hash,
)
from gpuwatchd.actions.receivers import Outcome, Receiver, build_receiver
from gpuwatchd.actions.routing import Destination, Router
from gpuwatchd.actions.secrets import redact
from gpuwatchd.actions.silences import SilenceView, path_in
from gpuwatchd.actions.store import DB_NAME, Store, loads
from gpuwatchd.config.loader import Config
from gpuwatchd.core.alerts import AlertState, AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.eventlog import log_delivery
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.statehealth import StoreHealth, state_families

log = logging.getLogger(__name__)

COALESCE_MAX = 20  # notifications merged into one message by a coalescing receiver
PRUNE_EVERY = 3600.0
KEEP_DONE = 7 * 86400.0
MAX_IDLE_WAIT = 5.0
SCHEDULER_WAIT = 1.0  # how often the scheduler looks at the silences file, at least
CLOSE_TIMEOUT = 5.0

Record = Callable[[dict[str, Any]], None]


class HttpSender:
    """Sends rendered requests; one ``httpx.Client`` (keep-alive) per receiver target."""

    def __init__(self, transport: httpx.BaseTransport | None = None) -> None:
        self.transport = transport
        self._clients: dict[tuple[str, int], httpx.Client] = {}
        self._lock = threading.Lock()

    def client(self, rcv: Receiver, target: int) -> httpx.Client:
        with self._lock:
            c = self._clients.get((rcv.name, target))
            if c is None:
                c = httpx.Client(
                    transport=self.transport,
                    timeout=httpx.Timeout(rcv.timeout),
                    follow_redirects=False,
                    trust_env=False,
                )
                self._clients[(rcv.name, target)] = c
            return c

    def close(self) -> None:
        with self._lock:
            for c in self._clients.values():
                c.close()
            self._clients.clear()


class ActionsSink:
    def __init__(
        self,
        config: Config,
        clock: Clock,
        *,
        transport: httpx.BaseTransport | None = None,
        rng: random.Random | None = None,
        environ: Mapping[str, str] | None = None,
        threaded: bool = True,
        record: Record | None = None,
        db_path: str | None = None,
        driver: Driver | None = None,
        simulate: bool = False,
        on_drain: Record | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.node = config.node_name
        self.routing = config.routing
        self.rng = rng or random.Random()
        self.record = record
        for name in ("httpx", "httpcore"):  # their INFO/DEBUG lines carry URLs (secrets)
            logging.getLogger(name).setLevel(logging.WARNING)
        self.receivers: dict[str, Receiver] = {}
        for rc in config.receivers:
            self.receivers[rc.name] = build_receiver(
                rc, environ, load_secrets=not (simulate and record is not None)
            )
        self.router = Router(config.routing, self.receivers)
        self.metrics = ActionMetrics(self.receivers)
        self.store = Store(db_path or os.path.join(config.state_dir, DB_NAME))
        self.silences = SilenceView(None if simulate else path_in(config.state_dir))
        self.silences.refresh()
        self._secrets = tuple(s for r in self.receivers.values() for s in r.secrets)
        self.sender = HttpSender(transport)
        self.drain: DrainController | None = None
        if config.drain.mode != "none":
            self.drain = DrainController(
                config.drain,
                config.drain.node or config.node_name,
                self.store,
                clock,
                driver or self._driver(simulate),
                page=self.submit,
                rng=self.rng,
                on_record=on_drain or record,
                run_notify=not simulate,
            )
        self._targets = [
            (name, i) for name, r in self.receivers.items() for i in range(len(r.targets))
        ]
        self._blocked: dict[tuple[str, int], float] = dict.fromkeys(self._targets, 0.0)
        self._last: dict[str, dict[str, Any]] = {n: {} for n in self.receivers}
        self._inflight: set[int] = set()
        self._inflight_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_sched = threading.Event()
        self._wake_drain = threading.Event()
        self._wake_target = {t: threading.Event() for t in self._targets}
        self._threads: list[threading.Thread] = []
        self._last_prune = 0.0
        self._silence_next: float | None = None
        self._refresh_queued()
        if threaded:
            self.start()

    def _driver(self, record_only: bool) -> Driver:
        d = self.config.drain
        node = d.node or self.config.node_name
        if record_only:
            return RecordDriver(d.mode)
        if d.mode == "exec":
            return ExecDriver(d.exec.command, node, d.timeout)
        if d.mode == "slurm":
            return SlurmDriver(node, d.timeout, d.slurm.scontrol, d.slurm.sinfo)
        from gpuwatchd.actions.kube import KubeClient, KubernetesDriver

        client = KubeClient.from_config(d.kubernetes, d.timeout)
        return KubernetesDriver(client, node, d.kubernetes, self.clock.now)

    # -- threads ---------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._threads.append(
            threading.Thread(target=self._scheduler_loop, name="actions-sched", daemon=True)
        )
        for t in self._targets:
            self._threads.append(
                threading.Thread(
                    target=self._sender_loop, args=(t,), name=f"send-{t[0]}-{t[1]}", daemon=True
                )
            )
        if self.drain is not None:
            self._threads.append(
                threading.Thread(target=self._drain_loop, name="actions-drain", daemon=True)
            )
        for th in self._threads:
            th.start()

    def _sleep(
        self, event: threading.Event, until: float | None, most: float = MAX_IDLE_WAIT
    ) -> None:
        now = self.clock.now()
        wait = most if until is None else min(most, max(0.0, until - now))
        if wait > 0:
            self.clock.wait(event, wait)
        event.clear()

    def _scheduler_loop(self) -> None:
        while not self._stop.is_set():
            try:
                until = self._schedule(self.clock.now())
            except Exception:
                log.exception("actions scheduler")
                until = self.clock.now() + 1.0
            self._sleep(self._wake_sched, until, SCHEDULER_WAIT)

    def _sender_loop(self, target: tuple[str, int]) -> None:
        event = self._wake_target[target]
        while not self._stop.is_set():
            try:
                until = self._send_due(target, self.clock.now())
            except Exception:
                log.exception("sender %s", target[0])
                until = self.clock.now() + 1.0
            if until is not None and until <= self.clock.now():
                continue
            self._sleep(event, until)

    def _drain_loop(self) -> None:
        assert self.drain is not None
        while not self._stop.is_set():
            try:
                until = self.drain.step(self.clock.now())
            except Exception:
                log.exception("drain controller")
                until = self.clock.now() + 5.0
            self._sleep(self._wake_drain, until)

    def _wake(self) -> None:
        self._wake_sched.set()
        self._wake_drain.set()
        for e in self._wake_target.values():
            e.set()

    # -- the Sink protocol -----------------------------------------------------------
    def deliver(self, transitions: list[AlertTransition], now: float) -> None:
        self.submit(transitions)

    def submit(self, transitions: list[AlertTransition]) -> None:
        """Commit transitions to the outbox (routing and drain incidents in the same
        transaction), then wake the workers."""
        now = self.clock.now()
        self.silences.refresh()
        new = dup = muted = 0
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
                    dup += 1
                    continue
                new += 1
                tid = int(cur.lastrowid or 0)
                if t.state is AlertState.FIRING:
                    silence = self.silences.match(match_labels(rec), now)
                    conn.execute(
                        "INSERT INTO alerts(fingerprint, transition_id, state, silenced, updated) "
                        "VALUES(?, ?, 'firing', ?, ?) ON CONFLICT(fingerprint) DO UPDATE SET "
                        "transition_id=excluded.transition_id, state='firing', "
                        "silenced=excluded.silenced, updated=excluded.updated",
                        (t.fingerprint, tid, silence.id if silence else None, now),
                    )
                    if silence is None:
                        self._route_in(conn, rec, tid, now)
                    else:
                        muted += 1
                        log.info("%s %s silenced by %s", t.rule, dict(t.labels), silence.id)
                    if t.drain and self.drain is not None:
                        self.drain.admit(conn, rec, silence.id if silence else None, now)
                else:
                    conn.execute(
                        "INSERT INTO alerts(fingerprint, transition_id, state, silenced, updated) "
                        "VALUES(?, ?, 'resolved', NULL, ?) ON CONFLICT(fingerprint) DO UPDATE SET "
                        "transition_id=excluded.transition_id, state='resolved', silenced=NULL, "
                        "updated=excluded.updated",
                        (t.fingerprint, tid, now),
                    )
                    self._resolve_in(conn, t.fingerprint, tid, now)
                    if self.drain is not None:
                        self.drain.resolved(conn, t.fingerprint, now)
            drops = self._flush_due(conn, now) if new else []
        with self.metrics.lock:
            self.metrics.transitions += new
            self.metrics.duplicates += dup
            self.metrics.silenced += muted
        self._count_drops(drops)
        if new:
            self._refresh_queued()
            self._wake()

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret the receivers hold: the service scrubs them from every log line."""
        return self._secrets

    def families(self, view: NodeView, fams: Families) -> None:
        now = self.clock.now()
        with self.metrics.lock:
            self.metrics.silences_active = len(self.silences.active(now))
        self.metrics.families(fams)
        if self.drain is not None:
            self.drain.families(fams, now)
        state_families(fams, [self.state_health()])

    def state_health(self) -> StoreHealth:
        st = self.store
        return StoreHealth("outbox", st.durable, st.write_errors, st.degraded or "")

    def close(self) -> None:
        self._stop.set()
        self._wake()
        deadline = time.monotonic() + CLOSE_TIMEOUT
        for th in self._threads:
            th.join(max(0.0, deadline - time.monotonic()))
        busy = [th.name for th in self._threads if th.is_alive()]
        self._threads.clear()
        if not self.store.durable:
            log.error(
                "outbox in memory at shutdown (%s): %d pending deliveries are lost",
                self.store.degraded,
                self.pending(),
            )
        if busy:  # a send or a drain command still running: leave the outbox to the exit
            log.warning("actions: %s still busy at shutdown; pending work resumes on restart", busy)
            return
        self.sender.close()
        if self.drain is not None:
            self.drain.driver.close()
        self.store.close()

    # -- routing into groups ---------------------------------------------------------
    def _route_in(
        self, conn: sqlite3.Connection, rec: dict[str, Any], tid: int, now: float
    ) -> None:
        labels = match_labels(rec)
        for dest in self.router.route(rec):
            glabels = {k: labels.get(k, "") for k in dest.group_by}
            gkey = group_key(dest.receiver, glabels)
            self._touch_group(conn, dest, gkey, glabels, now)
            conn.execute(
                "INSERT INTO group_alerts(receiver, gkey, fingerprint, transition_id, state, "
                "changed) VALUES(?, ?, ?, ?, 'firing', 1) "
                "ON CONFLICT(receiver, gkey, fingerprint) DO UPDATE "
                "SET transition_id=excluded.transition_id, state='firing', changed=1",
                (dest.receiver, gkey, rec["fingerprint"], tid),
            )

    @staticmethod
    def _touch_group(
        conn: sqlite3.Connection, dest: Destination, gkey: str, glabels: dict[str, str], now: float
    ) -> None:
        conn.execute(
            "INSERT INTO groups(receiver, gkey, labels, flush_at, last_flush, group_wait, "
            "repeat_interval) VALUES(?, ?, ?, ?, NULL, ?, ?) ON CONFLICT(receiver, gkey) DO UPDATE "
            "SET flush_at=COALESCE(groups.flush_at, excluded.flush_at), "
            "group_wait=excluded.group_wait, repeat_interval=excluded.repeat_interval",
            (
                dest.receiver,
                gkey,
                dumps(glabels),
                now + dest.group_wait,
                dest.group_wait,
                dest.repeat_interval,
            ),
        )

    @staticmethod
    def _resolve_in(conn: sqlite3.Connection, fingerprint: str, tid: int, now: float) -> None:
        rows = conn.execute(
            "SELECT receiver, gkey FROM group_alerts WHERE fingerprint=?", (fingerprint,)
        ).fetchall()
        for r in rows:
            conn.execute(
                "UPDATE group_alerts SET transition_id=?, state='resolved', changed=1 "
                "WHERE receiver=? AND gkey=? AND fingerprint=?",
                (tid, r["receiver"], r["gkey"], fingerprint),
            )
            conn.execute(
                "UPDATE groups SET flush_at=COALESCE(flush_at, ? + group_wait) WHERE receiver=? "
                "AND gkey=?",
                (now, r["receiver"], r["gkey"]),
            )

    # -- group flushes ---------------------------------------------------------------
    def _flush_due(self, conn: sqlite3.Connection, now: float) -> list[tuple[str, str]]:
        """Turn groups whose window ended (or whose repeat is due) into deliveries."""
        groups = conn.execute(
            "SELECT * FROM groups WHERE (flush_at IS NOT NULL AND flush_at <= ?) OR "
            "(flush_at IS NULL AND last_flush IS NOT NULL AND last_flush + repeat_interval <= ?) "
            "ORDER BY COALESCE(flush_at, last_flush + repeat_interval), receiver, gkey",
            (now, now),
        ).fetchall()
        for g in groups:
            self._flush_group(conn, g, now)
        return self._enforce_bound(conn, now) if groups else []

    def _flush_group(self, conn: sqlite3.Connection, g: sqlite3.Row, now: float) -> None:
        receiver, gkey = g["receiver"], g["gkey"]
        where = (receiver, gkey)
        rcv = self.receivers.get(receiver)
        if rcv is None:  # the receiver left the config
            conn.execute("DELETE FROM group_alerts WHERE receiver=? AND gkey=?", where)
            conn.execute("DELETE FROM groups WHERE receiver=? AND gkey=?", where)
            return
        members = conn.execute(
            "SELECT ga.fingerprint, ga.state, ga.changed, t.key, t.received, t.record "
            "FROM group_alerts ga JOIN transitions t ON t.id = ga.transition_id "
            "WHERE ga.receiver=? AND ga.gkey=? ORDER BY t.id",
            where,
        ).fetchall()
        repeat = g["flush_at"] is None
        # alerts a silence started to mute after they were sent are left out (Alertmanager
        # does the same); their resolve still goes out
        firing = [
            m
            for m in members
            if m["state"] == "firing" and not self._muted(loads(m["record"]), now)
        ]
        targets = list(range(len(rcv.targets)))
        if repeat:
            chosen = firing
            # a target still working through this group's queue gets no repeat on top
            busy = {
                int(r[0])
                for r in conn.execute(
                    "SELECT DISTINCT target FROM deliveries WHERE receiver=? AND gkey=? "
                    "AND status='pending'",
                    where,
                )
            }
            targets = [t for t in targets if t not in busy]
            changed: list[sqlite3.Row] = []
        else:
            changed = [m for m in members if m["changed"]]
            resolved = [m for m in changed if m["state"] == "resolved" and rcv.send_resolved]
            chosen = firing + resolved
        if chosen and targets:
            alerts = [loads(m["record"]) for m in chosen]
            status = "firing" if any(a["state"] == "firing" for a in alerts) else "resolved"
            note = {
                "receiver": receiver,
                "group_key": gkey,
                "group_labels": loads(g["labels"]),
                "status": status,
                "kind": "repeat" if repeat else "notify",
                "node": self.node,
                "alerts": alerts,
            }
            keys = [m["key"] for m in changed] if changed else [f"repeat@{now:.6f}"]
            key = notification_key(receiver, gkey, keys)
            received = min((float(m["received"]) for m in changed), default=now)
            rank = max(SEVERITY_RANK.get(str(a["severity"]), 0) for a in alerts)
            body = dumps(note)
            for target in targets:
                conn.execute(
                    "INSERT INTO deliveries(receiver, target, gkey, key, kind, status, severity, "
                    "created, received, next_attempt, body) VALUES(?, ?, ?, ?, ?, 'pending', ?, "
                    "?, ?, ?, ?)",
                    (receiver, target, gkey, key, note["kind"], rank, now, received, now, body),
                )
        conn.execute(
            "DELETE FROM group_alerts WHERE receiver=? AND gkey=? AND state='resolved'", where
        )
        conn.execute("UPDATE group_alerts SET changed=0 WHERE receiver=? AND gkey=?", where)
        left = conn.execute(
            "SELECT COUNT(*) FROM group_alerts WHERE receiver=? AND gkey=?", where
        ).fetchone()[0]
        if left:
            conn.execute(
                "UPDATE groups SET flush_at=NULL, last_flush=? WHERE receiver=? AND gkey=?",
                (now, *where),
            )
        else:
            conn.execute("DELETE FROM groups WHERE receiver=? AND gkey=?", where)

    def _muted(self, rec: dict[str, Any], now: float) -> bool:
        return self.silences.match(match_labels(rec), now) is not None

    def _enforce_bound(self, conn: sqlite3.Connection, now: float) -> list[tuple[str, str]]:
        """Keep at most routing.queue_size pending deliveries: drop the least severe,
        oldest first (never one being sent right now)."""
        row = conn.execute("SELECT COUNT(*) FROM deliveries WHERE status='pending'").fetchone()
        pending = int(row[0])
        excess = pending - self.routing.queue_size
        if excess <= 0:
            return []
        with self._inflight_lock:
            busy = sorted(self._inflight)
        spare = f"AND id NOT IN ({','.join('?' * len(busy))}) " if busy else ""
        victims = conn.execute(
            f"SELECT id, receiver FROM deliveries WHERE status='pending' {spare}"
            "ORDER BY severity, id LIMIT ?",
            (*busy, excess),
        ).fetchall()
        for v in victims:
            conn.execute(
                "UPDATE deliveries SET status='dropped', outcome='queue_full', done_at=? WHERE "
                "id=?",
                (now, v["id"]),
            )
        if victims:
            log.warning(
                "outbox full (%d pending): dropped %d least severe, oldest deliveries",
                pending,
                len(victims),
            )
        return [(v["receiver"], "queue_full") for v in victims]

    def _count_drops(self, drops: list[tuple[str, str]]) -> None:
        for receiver, reason in drops:
            self.metrics.add_dropped(receiver, reason)

    # -- the scheduler ---------------------------------------------------------------
    def _schedule(self, now: float) -> float | None:
        drops: list[tuple[str, str]] = []
        self.store.maintain()  # the disk under the outbox: damaged? back after trouble?
        changed = self.silences.refresh()
        if changed or (self._silence_next is not None and now >= self._silence_next):
            self._recheck_silences(now)
        self._silence_next = self.silences.next_change(now)
        with self.store.tx() as conn:
            drops = self._flush_due(conn, now)
        self._count_drops(drops)
        if now - self._last_prune >= PRUNE_EVERY:
            self._prune(now)
            self._last_prune = now
        self._refresh_queued()
        for e in self._wake_target.values():
            e.set()
        row = self.store.query(
            "SELECT MIN(COALESCE(flush_at, last_flush + repeat_interval)) FROM groups"
        )
        times = [t for t in (row[0][0] if row else None, self._silence_next) if t is not None]
        return min(times) if times else None

    def _recheck_silences(self, now: float) -> None:
        """Alerts muted by a silence that has ended are routed now (as Alertmanager does)."""
        rows = self.store.query(
            "SELECT a.fingerprint, t.id, t.record FROM alerts a JOIN transitions t "
            "ON t.id = a.transition_id WHERE a.state='firing' AND a.silenced IS NOT NULL"
        )
        if not rows:
            return
        with self.store.tx() as conn:
            for r in rows:
                rec = loads(r["record"])
                if self.silences.match(match_labels(rec), now) is None:
                    conn.execute(
                        "UPDATE alerts SET silenced=NULL WHERE fingerprint=?", (r["fingerprint"],)
                    )
                    self._route_in(conn, rec, int(r["id"]), now)
                    log.info("silence over for %s: notifying", rec["rule"])

    def _prune(self, now: float) -> None:
        cutoff = now - KEEP_DONE
        with self.store.tx() as conn:
            conn.execute(
                "DELETE FROM deliveries WHERE status != 'pending' AND done_at < ?", (cutoff,)
            )
            conn.execute("DELETE FROM alerts WHERE state='resolved' AND updated < ?", (cutoff,))
            conn.execute(
                "DELETE FROM transitions WHERE received < ? AND id NOT IN (SELECT transition_id "
                "FROM alerts) "
                "AND id NOT IN (SELECT transition_id FROM group_alerts)",
                (cutoff,),
            )
            conn.execute(
                "DELETE FROM incidents WHERE closed IS NOT NULL AND closed < ?",
                (now - 30 * 86400.0,),
            )

    def _refresh_queued(self) -> None:
        rows = self.store.query(
            "SELECT receiver, COUNT(*) AS n FROM deliveries WHERE status='pending' GROUP BY "
            "receiver"
        )
        counts = {r["receiver"]: int(r["n"]) for r in rows}
        with self.metrics.lock:
            for name in self.metrics.queued:
                self.metrics.queued[name] = counts.get(name, 0)

    # -- sending ---------------------------------------------------------------------
    def _backoff(self, attempts: int) -> float:
        r = self.routing
        base = min(r.retry_max, r.retry_initial * 2.0 ** max(0, attempts - 1))
        return base * (0.5 + self.rng.random() / 2)

    def _send_due(self, target: tuple[str, int], now: float) -> float | None:
        """Send the next due delivery of one receiver target; returns when to look again."""
        name, index = target
        rcv = self.receivers[name]
        blocked = self._blocked[target]
        heads = self.store.query(
            "SELECT * FROM deliveries d WHERE receiver=? AND target=? AND status='pending' AND "
            "id = (SELECT MIN(id) FROM deliveries e WHERE e.receiver=d.receiver AND "
            "e.target=d.target AND e.gkey=d.gkey AND e.status='pending') ORDER BY id",
            (name, index),
        )
        if not heads:
            return None
        if now < blocked:
            return blocked
        expired = [h for h in heads if now - float(h["created"]) > self.routing.give_up_after]
        if expired:
            self._give_up(
                rcv, [int(h["id"]) for h in expired], "expired", now, "not delivered in time"
            )
            return now
        due = [h for h in heads if float(h["next_attempt"]) <= now]
        if not due:
            return min(float(h["next_attempt"]) for h in heads)
        rows = [due[0]]
        if rcv.coalesce:
            rows = self.store.query(
                "SELECT * FROM deliveries WHERE receiver=? AND target=? AND status='pending' "
                "ORDER BY id LIMIT ?",
                (name, index, COALESCE_MAX),
            )
        self._attempt(rcv, index, rows, now)
        return self.clock.now()

    def _attempt(self, rcv: Receiver, target: int, rows: list[sqlite3.Row], now: float) -> None:
        ids = [int(r["id"]) for r in rows]
        notes = [loads(r["body"]) for r in rows]
        key = rows[0]["key"] if len(rows) == 1 else short_hash(*(r["key"] for r in rows))
        with self._inflight_lock:
            self._inflight.update(ids)
        try:
            outcome = self._transmit(rcv, target, notes, key, now, ids)
        finally:
            with self._inflight_lock:
                self._inflight.difference_update(ids)
        done = self.clock.now()
        last = self._last[rcv.name]
        if outcome.kind == "ok":
            with self.store.tx() as conn:
                conn.executemany(
                    "UPDATE deliveries SET status='sent', outcome='ok', done_at=?, "
                    "attempts=attempts+1, "
                    "last_error=NULL WHERE id=?",
                    [(done, i) for i in ids],
                )
            self.metrics.add_sent(rcv.name, [done - float(r["received"]) for r in rows])
            log_delivery(rcv.name, rcv.kind, notes, done - now)
            last["last_success"] = done
            if rcv.min_interval:
                self._blocked[(rcv.name, target)] = done + rcv.min_interval
        elif outcome.kind == "reject":
            self.metrics.add_failed(rcv.name)
            last["last_error"] = outcome.detail
            self._give_up(rcv, ids, "rejected", done, outcome.detail)
        else:
            self.metrics.add_failed(rcv.name)
            last["last_error"] = outcome.detail
            attempts = max(int(r["attempts"]) for r in rows) + 1
            delay = (
                outcome.retry_after if outcome.retry_after is not None else self._backoff(attempts)
            )
            with self.store.tx() as conn:
                conn.executemany(
                    "UPDATE deliveries SET attempts=attempts+1, next_attempt=?, last_error=? "
                    "WHERE id=?",
                    [(done + delay, outcome.detail, i) for i in ids],
                )
            if outcome.retry_after is not None:
                self._blocked[(rcv.name, target)] = done + delay
            log.warning(
                "delivery to %s failed (attempt %d): %s; retrying in %.1fs",
                rcv.name,
                attempts,
                outcome.detail,
                delay,
            )
        self._refresh_queued()

    def _transmit(
        self,
        rcv: Receiver,
        target: int,
        notes: list[dict[str, Any]],
        key: str,
        now: float,
        ids: list[int],
    ) -> Outcome:
        try:
            req = rcv.render(notes, target, key, now)
        except Exception as exc:  # a payload we cannot build will never be sent
            log.exception("rendering a notification for %s", rcv.name)
            return Outcome("reject", None, f"cannot render: {type(exc).__name__}")
        if self.record is not None:
            self.record(
                {
                    "record": "notification",
                    "receiver": rcv.name,
                    "type": rcv.kind,
                    "target": target,
                    "status": notes[-1]["status"],
                    "kind": notes[-1]["kind"],
                    "key": key,
                    "alerts": [
                        {
                            "rule": a["rule"],
                            "state": a["state"],
                            "severity": a["severity"],
                            "gpu": (a.get("labels") or {}).get("gpu"),
                        }
                        for n in notes
                        for a in n["alerts"]
                    ],
                }
            )
            return Outcome("ok")
        try:
            resp = self.sender.client(rcv, target).request(
                req.method, req.url, headers=req.headers, content=req.body
            )
            body = resp.text[:2000]
        except (httpx.HTTPError, OSError) as exc:
            return Outcome("retry", None, redact(f"{type(exc).__name__}: {exc}", self._secrets))
        headers = {k.lower(): v for k, v in resp.headers.items()}
        outcome = rcv.classify(resp.status_code, headers, body, now)
        if outcome.kind != "ok":
            snippet = redact(" ".join(body.split())[:200], self._secrets)
            detail = outcome.detail + (f": {snippet}" if snippet else "")
            outcome = Outcome(outcome.kind, outcome.retry_after, detail)
        return outcome

    def _give_up(self, rcv: Receiver, ids: list[int], reason: str, now: float, detail: str) -> None:
        with self.store.tx() as conn:
            conn.executemany(
                "UPDATE deliveries SET status='dropped', outcome=?, done_at=?, last_error=? WHERE "
                "id=?",
                [(reason, now, detail, i) for i in ids],
            )
        self.metrics.add_dropped(rcv.name, reason, len(ids))
        log.error("gave up %d delivery(ies) to %s (%s): %s", len(ids), rcv.name, reason, detail)

    # -- synchronous driving (simulate, tests) ---------------------------------------
    def run_pending(self, now: float | None = None) -> None:
        """Do everything due at ``now`` in this thread: flush, send, drain."""
        now = self.clock.now() if now is None else now
        self._schedule(now)
        for target in self._targets:
            for _ in range(10_000):
                until = self._send_due(target, now)
                if until is None or until > now:
                    break
                now = max(now, self.clock.now())
        if self.drain is not None:
            self.drain.step(now)
            self._schedule(now)
            for target in self._targets:
                for _ in range(10_000):
                    until = self._send_due(target, now)
                    if until is None or until > now:
                        break

    def pending(self) -> int:
        return int(self.store.query("SELECT COUNT(*) FROM deliveries WHERE status='pending'")[0][0])

    def wait_idle(self, timeout: float) -> bool:
        """Real time: wait until nothing is pending (tests, bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pending() == 0:
                return True
            time.sleep(0.005)
        return self.pending() == 0

    # -- status ----------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """Pending deliveries, silences and drain state for /api/v1/status (no secrets)."""
        now = self.clock.now()
        receivers = []
        for name, rcv in self.receivers.items():
            rows = self.store.query(
                "SELECT COUNT(*) AS n, MIN(created) AS oldest FROM deliveries WHERE receiver=? "
                "AND status='pending'",
                (name,),
            )
            last = self._last[name]
            receivers.append(
                {
                    "name": name,
                    "type": rcv.kind,
                    "targets": len(rcv.targets),
                    "pending": int(rows[0]["n"]),
                    "oldest_pending_seconds": None
                    if rows[0]["oldest"] is None
                    else round(now - rows[0]["oldest"], 3),
                    "last_success": last.get("last_success"),
                    "last_error": redact(last["last_error"], self._secrets)
                    if last.get("last_error")
                    else None,
                }
            )
        pending = self.store.query(
            "SELECT id, receiver, target, kind, attempts, next_attempt, created, last_error, body "
            "FROM deliveries WHERE status='pending' ORDER BY id LIMIT 50"
        )
        firing = self.store.query(
            "SELECT a.fingerprint, a.silenced, t.record FROM alerts a JOIN transitions t "
            "ON t.id = a.transition_id WHERE a.state='firing' ORDER BY t.id"
        )
        return {
            "deliveries": {
                "durable": self.store.durable,
                "state_problem": self.store.degraded,
                "pending": self.pending(),
                "receivers": receivers,
                "queue": [
                    {
                        "id": r["id"],
                        "receiver": r["receiver"],
                        "target": r["target"],
                        "kind": r["kind"],
                        "status": loads(r["body"])["status"],
                        "alerts": [a["rule"] for a in loads(r["body"])["alerts"]],
                        "attempts": r["attempts"],
                        "next_attempt": r["next_attempt"],
                        "age_seconds": round(now - r["created"], 3),
                        "last_error": redact(r["last_error"], self._secrets)
                        if r["last_error"]
                        else None,
                    }
                    for r in pending
                ],
                "firing": [
                    {
                        "rule": rec["rule"],
                        "severity": rec["severity"],
                        "labels": rec["labels"],
                        "since": rec["active_since"],
                        "silenced_by": r["silenced"],
                    }
                    for r in firing
                    for rec in [loads(r["record"])]
                ],
            },
            "silences": [
                s.as_dict(now)
                for s in self.silences.all()
                if s.active(now) or now - s.end < 86400.0
            ],
            "drain": self.drain.summary(now) if self.drain is not None else {"mode": "none"},
        }
