"""The durable outbox: SQLite (WAL, synchronous=FULL) in the state directory.

Every transition is committed here before anything leaves the node. Tables:

``transitions``   each transition once (unique idempotency key), as JSON
``alerts``        the latest state per alert (fingerprint), and the silence muting it
``groups``        one aggregation group per receiver and group labels: when to flush next
``group_alerts``  the alerts of each group and whether they changed since the last flush
``deliveries``    one row per message per receiver target: pending -> sent | dropped
``incidents``     drain incidents (one per firing transition of a drain rule)
``node_drain``    whether gpuwatchd owns the node's drain in the scheduler
``meta``          schema version, counters

One connection, serialised by a lock; statements are short and never wait on the network.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
DB_NAME = "actions.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS transitions(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  key TEXT NOT NULL UNIQUE,
  fingerprint TEXT NOT NULL,
  state TEXT NOT NULL,
  received REAL NOT NULL,
  record TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts(
  fingerprint TEXT PRIMARY KEY,
  transition_id INTEGER NOT NULL,
  state TEXT NOT NULL,
  silenced TEXT,
  updated REAL NOT NULL);
CREATE TABLE IF NOT EXISTS groups(
  receiver TEXT NOT NULL,
  gkey TEXT NOT NULL,
  labels TEXT NOT NULL,
  flush_at REAL,
  last_flush REAL,
  group_wait REAL NOT NULL,
  repeat_interval REAL NOT NULL,
  PRIMARY KEY(receiver, gkey));
CREATE TABLE IF NOT EXISTS group_alerts(
  receiver TEXT NOT NULL,
  gkey TEXT NOT NULL,
  fingerprint TEXT NOT NULL,
  transition_id INTEGER NOT NULL,
  state TEXT NOT NULL,
  changed INTEGER NOT NULL,
  PRIMARY KEY(receiver, gkey, fingerprint));
CREATE TABLE IF NOT EXISTS deliveries(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  receiver TEXT NOT NULL,
  target INTEGER NOT NULL,
  gkey TEXT NOT NULL,
  key TEXT NOT NULL,
  kind TEXT NOT NULL,
  status TEXT NOT NULL,
  severity INTEGER NOT NULL,
  created REAL NOT NULL,
  received REAL NOT NULL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt REAL NOT NULL,
  last_error TEXT,
  done_at REAL,
  outcome TEXT,
  body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS deliveries_by_status ON deliveries(status, receiver, target, id);
CREATE TABLE IF NOT EXISTS incidents(
  key TEXT PRIMARY KEY,
  fingerprint TEXT NOT NULL,
  record TEXT NOT NULL,
  reason TEXT NOT NULL,
  state TEXT NOT NULL,
  opened REAL NOT NULL,
  drain_at REAL NOT NULL,
  notified INTEGER NOT NULL DEFAULT 0,
  resolved REAL,
  attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt REAL NOT NULL DEFAULT 0,
  last_error TEXT,
  drained_at REAL,
  result TEXT,
  closed REAL);
CREATE INDEX IF NOT EXISTS incidents_by_fp ON incidents(fingerprint);
CREATE TABLE IF NOT EXISTS node_drain(
  id INTEGER PRIMARY KEY CHECK (id = 1),
  owned INTEGER NOT NULL DEFAULT 0,
  reason TEXT,
  drained_at REAL,
  resume_attempts INTEGER NOT NULL DEFAULT 0,
  next_attempt REAL NOT NULL DEFAULT 0,
  last_error TEXT,
  last_result TEXT);
"""


class Store:
    """The SQLite database behind the outbox and the drain hook."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.conn = self._open(path)

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        conn.row_factory = sqlite3.Row
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.executescript(_SCHEMA)
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            conn.execute("INSERT INTO meta(key, value) VALUES('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {row[0]}, expected {SCHEMA_VERSION}")
        check = conn.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            conn.close()
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        return conn

    def _open(self, path: str) -> sqlite3.Connection:
        if path != ":memory:":
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            return self._connect(path)
        except sqlite3.DatabaseError as exc:
            if path == ":memory:" or not os.path.exists(path) or "unable to open" in str(exc):
                raise
            moved = f"{path}.corrupt-{int(time.time())}"
            log.error(
                "outbox %s is unusable (%s); moved aside to %s, starting empty", path, exc, moved
            )
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(path + suffix, moved + suffix)
            return self._connect(path)

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on error."""
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                yield self.conn
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
            self.conn.execute("COMMIT")

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self.lock:
            return self.conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # -- meta counters ---------------------------------------------------------------
    @staticmethod
    def next_counter(conn: sqlite3.Connection, name: str) -> int:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (name,)).fetchone()
        value = (int(row[0]) if row else 0) + 1
        conn.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (name, str(value)),
        )
        return value

    @staticmethod
    def get_meta(conn: sqlite3.Connection, name: str) -> str | None:
        row = conn.execute("SELECT value FROM meta WHERE key=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    @staticmethod
    def set_meta(conn: sqlite3.Connection, name: str, value: str) -> None:
        conn.execute(
            "INSERT INTO meta(key, value) VALUES(?, ?) "
            "ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (name, value),
        )


def loads(text: str) -> Any:
    return json.loads(text)
