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
from typing import Any, cast

from gpuwatchd.core.sqlitecopy import copy_read_only, damaged, storage_error
from gpuwatchd.core.sqlitestate import (
    file_identity,
    memory_copy,
    move_aside,
    open_files_safely,
    verify,
    write_back,
)
from gpuwatchd.core.statefile import check_sqlite_files
from gpuwatchd.core.statehealth import StoreHealth

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


CHECK_EVERY = 5.0  # seconds between checks that the file on disk is still the database
RETRY_DISK_EVERY = 5.0  # seconds between attempts to move an in-memory outbox back to disk


class _Recording:
    """The connection a transaction body sees. It records each statement, so that when the
    disk fails mid-transaction the store can move to memory and replay them there: the
    body never sees the storage error (see ``Store.tx``)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.statements: list[tuple[bool, str, Any]] = []

    def _run(self, many: bool, sql: str, args: Any) -> sqlite3.Cursor:
        self.statements.append((many, sql, args))
        while True:
            conn = self._store.conn
            try:
                return conn.executemany(sql, args) if many else conn.execute(sql, args)
            except sqlite3.Error as exc:
                if not self._store.fail_over(exc, self.statements[:-1]):
                    raise

    def execute(self, sql: str, args: Any = ()) -> sqlite3.Cursor:
        return self._run(False, sql, args)

    def executemany(self, sql: str, args: Any) -> sqlite3.Cursor:
        return self._run(True, sql, list(args))


class Store:
    """The SQLite database behind the outbox and the drain hook.

    When the disk fails under it (full, read-only, I/O errors, the file deleted, replaced
    or damaged), the store moves its contents into memory and carries on, so that pages
    and drains still go out; ``degraded`` says why, the daemon logs it as an error and
    exports ``gpuwatchd_state_durable{store="outbox"} 0``. Every ``RETRY_DISK_EVERY``
    seconds it tries to write itself back to disk, and is durable again once that works.
    Only a damaged file whose contents cannot be read loses what it held (logged)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.degraded: str | None = None  # why the outbox is in memory only
        self.write_errors = 0
        self.recoveries = 0
        self.set_aside = 0  # files moved aside unopened (a link, FIFO or directory)
        self._ident: tuple[int, int] | None = None
        self._next_check = 0.0
        self._next_retry = 0.0
        if path == ":memory:":
            self.conn = self._connect(path)
            return
        try:
            self.conn = self._open(path)
            self._ident = self._identity()
        except (OSError, sqlite3.Error) as exc:
            self.conn, loaded = self._memory_from(path)
            self._degrade(
                f"cannot open {path} for writing: {getattr(exc, 'strerror', None) or exc}"
                + ("; started from its last saved contents" if loaded else "")
            )

    @classmethod
    def _memory_from(cls, path: str) -> tuple[sqlite3.Connection, bool]:
        """An in-memory outbox that starts from what the file holds (drain ownership,
        rate-limit window, pending deliveries, idempotency keys) when it can be read and
        is an outbox of this version; else an empty one. Never fails on the file: an
        empty or half-created file (a full disk), or a WAL that cannot be opened, give
        an empty outbox."""
        conn = cls._connect(":memory:")
        try:
            if copy_read_only(path, conn):
                conn.executescript(_SCHEMA)  # a file created but never written has none
                row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO meta(key, value) VALUES('schema', ?)", (str(SCHEMA_VERSION),)
                    )
                    return conn, False
                if int(row[0]) == SCHEMA_VERSION:
                    return conn, True
        except (sqlite3.Error, ValueError) as exc:
            log.warning("outbox: cannot start from the contents of %s: %s", path, exc)
        conn.close()
        return cls._connect(":memory:"), False

    @property
    def durable(self) -> bool:
        return self.path == ":memory:" or self.degraded is None

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        check_sqlite_files(path)  # a FIFO or link here would hang or redirect SQLite
        conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10.0)
        try:
            conn.row_factory = sqlite3.Row
            if path != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO meta(key, value) VALUES('schema', ?)", (str(SCHEMA_VERSION),)
                )
            elif int(row[0]) != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {row[0]}, expected {SCHEMA_VERSION}")
            check = conn.execute("PRAGMA quick_check(1)").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else 'no answer'}")
        except BaseException:
            conn.close()
            raise
        return conn

    def _open(self, path: str) -> sqlite3.Connection:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        # a FIFO or link would hang or redirect SQLite: moved aside unopened
        self.set_aside += open_files_safely(path, "outbox", "starting with an empty outbox")
        try:
            return self._connect(path)
        except sqlite3.DatabaseError as exc:
            if not os.path.exists(path) or (storage_error(exc) and not damaged(exc)):
                raise
            self._move_aside(str(exc))
            return self._connect(path)

    def _move_aside(self, problem: str) -> None:
        moved = move_aside(self.path)
        log.error(
            "outbox %s is unusable (%s); moved aside to %s, starting empty",
            self.path,
            problem,
            moved,
        )

    def _identity(self) -> tuple[int, int] | None:
        return file_identity(self.path)

    def health(self) -> StoreHealth:
        """The store's health in the vocabulary every state store reports."""
        return StoreHealth(
            "outbox", self.durable, self.write_errors, self.degraded or "", self.set_aside
        )

    # -- transactions ----------------------------------------------------------------
    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE ... COMMIT), rolled back on error.

        A storage error (in a statement or at COMMIT) moves the store to memory and
        replays the transaction there; other errors roll back and propagate."""
        with self.lock:
            if self._check_file():
                self._try_disk()
            rec = _Recording(self)
            self._begin(rec.statements)
            try:
                yield cast(sqlite3.Connection, rec)
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
                raise
            while True:
                try:
                    self.conn.execute("COMMIT")
                    return
                except sqlite3.Error as exc:
                    if not self.fail_over(exc, rec.statements):
                        raise

    def _begin(self, replay: list[tuple[bool, str, Any]]) -> None:
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.Error as exc:
                if not self.fail_over(exc, replay, begin=False):
                    raise

    def fail_over(
        self, exc: sqlite3.Error, replay: list[tuple[bool, str, Any]], begin: bool = True
    ) -> bool:
        """After a storage error: move to memory, open a transaction there and replay
        ``replay`` in it. False when the error is not one the memory store can fix."""
        if not storage_error(exc) or self.degraded is not None:
            return False
        self.write_errors += 1
        self._to_memory(f"{exc} ({getattr(exc, 'sqlite_errorname', 'error')})")
        if begin:
            self.conn.execute("BEGIN IMMEDIATE")
            for many, sql, args in replay:
                if many:
                    self.conn.executemany(sql, args)
                else:
                    self.conn.execute(sql, args)
        return True

    def query(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self.lock:
            try:
                return self.conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                if not self.fail_over(exc, [], begin=False):
                    raise
                return self.conn.execute(sql, args).fetchall()

    def close(self) -> None:
        with self.lock:
            self.conn.close()

    # -- disk trouble ----------------------------------------------------------------
    def _degrade(self, reason: str) -> None:
        self.degraded = reason
        self._next_retry = time.monotonic() + RETRY_DISK_EVERY
        log.error(
            "outbox: %s: keeping deliveries and drain state IN MEMORY (lost if the daemon "
            "stops); trying to write them back to %s every %gs",
            reason,
            self.path,
            RETRY_DISK_EVERY,
        )

    def _to_memory(self, reason: str) -> None:
        """Copy what the open connection holds into memory and switch to that."""
        old = self.conn
        mem, unread = memory_copy(old)
        lost = f"; its contents could not be read ({unread}): pending deliveries were lost"
        lost = lost if unread else ""
        mem.row_factory = sqlite3.Row
        mem.execute("PRAGMA foreign_keys=ON")
        mem.executescript(_SCHEMA)
        mem.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES('schema', ?)", (str(SCHEMA_VERSION),)
        )
        with contextlib.suppress(sqlite3.Error):
            old.close()
        self.conn = mem
        self._degrade(reason + lost)

    def _check_file(self) -> bool:
        """On disk: is the file still ours? When it was deleted or replaced, move to
        memory (the open connection still holds everything) and return True."""
        if self.path == ":memory:" or self.degraded is not None:
            return False
        ident = self._identity()
        if ident == self._ident:
            return False
        what = "deleted" if ident is None else "replaced"
        self.write_errors += 1
        self._to_memory(f"the database file was {what} under the running daemon")
        return True

    def _verify_on_disk(self) -> str | None:
        """Read the file with a fresh connection: None when it is sound. Its files are
        checked to be regular files first: SQLite would open a FIFO put there while the
        daemon runs, and wait on it for ever with the outbox's lock held (issue 26)."""
        return verify(self.path)

    def maintain(self) -> None:
        """Called about once a second (the actions scheduler): now and then check the file
        on disk with a fresh connection; while in memory, try to go back to disk."""
        if self.path == ":memory:":
            return
        now = time.monotonic()
        with self.lock:
            force = self._check_file()
            if self.degraded is None and now >= self._next_check:
                self._next_check = now + CHECK_EVERY
                problem = self._verify_on_disk()
                if problem is not None:
                    self.write_errors += 1
                    self._to_memory(f"the database file is damaged ({problem})")
                    force = True
            if self.degraded is not None and (force or now >= self._next_retry):
                self._try_disk()

    def _try_disk(self) -> None:
        self._next_retry = time.monotonic() + RETRY_DISK_EVERY
        try:
            self._write_back()
        except (OSError, sqlite3.Error) as exc:
            log.debug("outbox: still cannot write %s: %s", self.path, exc)
            return
        log.warning(
            "outbox: back on disk in %s (was: %s); deliveries are durable again",
            self.path,
            self.degraded,
        )
        self.degraded = None
        self.recoveries += 1

    def _write_back(self) -> None:
        """Write the in-memory outbox to a new file and switch to it."""
        write_back(self.conn, self.path)
        new = self._connect(self.path)
        with contextlib.suppress(sqlite3.Error):
            self.conn.close()
        self.conn = new
        self._ident = self._identity()

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
