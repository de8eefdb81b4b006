"""The rule engine's durable state: SQLite in the state directory.

What survives a restart (and a reboot):

- **alert states**: a firing alert stays firing without a second page, and its resolve is
  still sent later; sequence numbers continue, so receivers can drop repeats;
- **counter history**, downsampled to one point per 5 minutes, for 30 days, with each
  counter's reset bookkeeping (last raw value, offset), so trends and windows that span a
  restart stay exact;
- **fault history**: in which boots each alert fired, for reboot-aware escalation;
- **XID episodes** of ``xid_recurrence`` rules (per rule, GPU UUID and code: start, end,
  processes, whether independent, part of a node event, the open one, recent), for 36
  days and at most 1024 per GPU and rule, so a weekly -> daily -> hourly history spans
  restarts; a rule whose grouping parameters changed starts afresh;
- the **memory ledger** (``rules/ledger.py``): one row per memory-relevant firing (time,
  series, GPU index and UUID, rule, kind, severity, drain), written with the alert state
  that fired, for 190 days (two 90-day windows and a margin) and at most 10,000 rows (the
  oldest dropped first); ``meta`` keeps when it started (``ledger_since``) and the newest
  time it dropped (``ledger_cut``), so the field report knows what it may count. A state
  file of an older version gains the empty table on open (same schema version: an older
  daemon ignores the table).

Every write is one transaction (WAL journal, ``synchronous=FULL``). A database that is
missing is created; one that is corrupt or from another schema is moved aside
(``rules.sqlite3.corrupt-<time>``) and rebuilt, with a logged warning, never a crash
loop. After a write error the store keeps the engine running and retries on the next
write. ``simulate`` and rule tests use the same code on an in-memory database.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.core.sqlitecopy import copy_read_only, damaged, storage_error
from gpuwatchd.core.sqlitestate import file_identity, move_aside, open_files_safely, write_back
from gpuwatchd.core.statehealth import StoreHealth

log = logging.getLogger(__name__)

SCHEMA_VERSION = "1"
DB_NAME = "rules.sqlite3"
PERSIST_RESOLUTION = 300.0
HISTORY_RETENTION = 30 * 86400.0
INACTIVE_RETENTION = 90 * 86400.0
EPISODE_RETENTION = 36 * 86400.0  # the longest xid_recurrence history (30d) and a margin
EPISODES_PER_GPU = 1024  # per rule: the newest are kept
LEDGER_RETENTION = 190 * 86400.0  # a UE's 90-day look back from a page 100 days old
LEDGER_MAX_ROWS = 10_000  # per node (per state file): the oldest are dropped first
LEDGER_KINDS = frozenset({"ue", "memory"})
LEDGER_SEVERITIES = frozenset({"page", "ticket", "info"})
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
RETRY_DISK_EVERY = 5.0  # seconds between attempts to write an in-memory state back to disk

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS alerts (
    fingerprint TEXT PRIMARY KEY,
    rule TEXT NOT NULL,
    labels TEXT NOT NULL,
    state TEXT NOT NULL,
    severity TEXT NOT NULL,
    active_since REAL NOT NULL,
    last_true REAL NOT NULL,
    fired_at REAL,
    sequence INTEGER NOT NULL,
    value REAL,
    annotations TEXT NOT NULL,
    boot_id TEXT NOT NULL,
    escalated INTEGER NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    key TEXT PRIMARY KEY, last_raw REAL, "offset" REAL NOT NULL, last_t REAL
);
CREATE TABLE IF NOT EXISTS history (
    key TEXT NOT NULL, t REAL NOT NULL, v REAL NOT NULL, PRIMARY KEY (key, t)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xid_episodes (
    rule TEXT NOT NULL, signature TEXT NOT NULL, uuid TEXT NOT NULL, xid INTEGER NOT NULL,
    start REAL NOT NULL, "end" REAL NOT NULL, pids TEXT NOT NULL, flags INTEGER NOT NULL,
    PRIMARY KEY (rule, uuid, xid, start)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS xid_recoveries (
    rule TEXT NOT NULL, uuid TEXT NOT NULL, xid INTEGER NOT NULL, codes TEXT NOT NULL,
    last REAL NOT NULL, boot_id TEXT NOT NULL, step INTEGER NOT NULL, returns INTEGER NOT NULL,
    recovered REAL, proof TEXT NOT NULL, flags INTEGER NOT NULL, ecc REAL,
    PRIMARY KEY (rule, uuid, xid)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS memory_ledger (
    t REAL NOT NULL, fingerprint TEXT NOT NULL, rule TEXT NOT NULL, gpu TEXT NOT NULL,
    uuid TEXT NOT NULL, kind TEXT NOT NULL, severity TEXT NOT NULL, drain INTEGER NOT NULL,
    UNIQUE (fingerprint, t)
);
CREATE INDEX IF NOT EXISTS memory_ledger_t ON memory_ledger(t);
CREATE TABLE IF NOT EXISTS faults (
    fingerprint TEXT NOT NULL, boot_id TEXT NOT NULL, first REAL NOT NULL, last REAL NOT NULL,
    PRIMARY KEY (fingerprint, boot_id)
) WITHOUT ROWID;
"""


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    """The kernel's id of this boot (changes at every reboot); "unknown" if unreadable."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip() or "unknown"
    except OSError:
        return "unknown"


@dataclass
class AlertRecord:
    fingerprint: str
    rule: str
    labels: Mapping[str, str]
    state: str  # inactive | pending | firing
    severity: str
    active_since: float
    last_true: float
    fired_at: float | None
    sequence: int
    value: float | None
    annotations: Mapping[str, str]
    boot_id: str
    escalated: bool = False


@dataclass
class CounterRecord:
    last_raw: float | None
    offset: float
    last_t: float | None
    points: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class EpisodeRecord:
    """One saved XID episode of an ``xid_recurrence`` rule (``flags``: its evaluator's)."""

    uuid: str
    xid: int
    start: float
    end: float
    pids: tuple[int, ...]
    flags: int


@dataclass(frozen=True)
class RecoveryRecord:
    """One XID fault an ``xid`` rule with ``recovery: evidence`` follows to its recovery.

    ``uuid`` (or ``pci:<bus id>``) and ``xid`` (-1 unless the rule is ``by_code``) name the
    series; ``codes`` the XIDs of the fault; ``last`` its newest XID and ``boot_id`` the boot
    it came in; ``step`` the rung of the ladder it needs (0 GPU reset, 1 node reboot, 2
    hardware inspection); ``returns`` how often it came back after a recovery at this step;
    ``recovered`` when evidence of the recovery was seen (None: still waiting) and ``proof``
    what it was; ``flags`` and ``ecc`` what NVML showed since the XID (the evaluator's)."""

    uuid: str
    xid: int
    codes: tuple[int, ...]
    last: float
    boot_id: str
    step: int
    returns: int
    recovered: float | None
    proof: str
    flags: int
    ecc: float | None


@dataclass(frozen=True)
class LedgerEntry:
    """One memory-relevant firing (``rules/ledger.py``): when, which series and GPU, what
    it did."""

    t: float
    fingerprint: str
    rule: str
    gpu: str  # the GPU's index label ("" for a node-level alert)
    uuid: str  # its UUID label ("" when unknown)
    kind: str  # "ue" (uncorrectable memory error) | "memory" (a memory rule's warning)
    severity: str  # page | ticket | info, as it fired (an escalation's included)
    drain: bool


@dataclass
class Ledger:
    """The memory ledger as read back: ``since`` is None when the file never had one (a
    state of an older version); rows that did not read are in ``bad`` as (rowid, why)."""

    entries: list[LedgerEntry]
    since: float | None
    cut: float | None
    bad: list[tuple[int, str]] = field(default_factory=list)
    truncated: bool = False


def _ledger_entry(row: tuple[Any, ...]) -> LedgerEntry:
    """One ledger row, every column checked (``ValueError`` naming the field)."""
    t, fp, rule, gpu, uuid, kind, severity, drain = row
    if not _number(t) or t != t or t in (float("inf"), float("-inf")):
        raise ValueError(f"t: not a time: {str(t)[:40]!r}")
    for name, v in (("fingerprint", fp), ("rule", rule), ("gpu", gpu), ("uuid", uuid)):
        if not isinstance(v, str) or len(v) > 256:
            raise ValueError(f"{name}: not text of at most 256 characters")
    if kind not in LEDGER_KINDS:
        raise ValueError(f"kind: {str(kind)[:40]!r} is not one of {sorted(LEDGER_KINDS)}")
    if severity not in LEDGER_SEVERITIES:
        raise ValueError(f"severity: {str(severity)[:40]!r} is not one of page, ticket, info")
    if drain not in (0, 1) or isinstance(drain, float | str):
        raise ValueError(f"drain: {str(drain)[:40]!r} is not 0 or 1")
    return LedgerEntry(float(t), fp, rule, gpu, uuid, kind, severity, bool(drain))


def _meta_time(value: object) -> float | None:
    try:
        t = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return t if t == t and abs(t) != float("inf") else None


def _prune_ledger(conn: sqlite3.Connection, now: float, cap: int) -> None:
    """Drop ledger rows older than ``LEDGER_RETENTION``, then the oldest beyond ``cap``;
    remember the newest time dropped (``ledger_cut``)."""
    cut = conn.execute(
        "SELECT max(t) FROM memory_ledger WHERE t < ?", (now - LEDGER_RETENTION,)
    ).fetchone()[0]
    if cut is not None:
        conn.execute("DELETE FROM memory_ledger WHERE t <= ?", (cut,))
    excess = conn.execute("SELECT count(*) FROM memory_ledger").fetchone()[0] - cap
    if excess > 0:
        rows = conn.execute(
            "SELECT rowid, t FROM memory_ledger ORDER BY t, rowid LIMIT ?", (excess,)
        ).fetchall()
        conn.executemany("DELETE FROM memory_ledger WHERE rowid=?", [(r[0],) for r in rows])
        cut = max(cut if cut is not None else rows[-1][1], rows[-1][1])
    if cut is not None:
        old = conn.execute("SELECT value FROM meta WHERE key='ledger_cut'").fetchone()
        before = _meta_time(old[0]) if old is not None else None
        if before is None or cut > before:
            conn.execute(
                "INSERT OR REPLACE INTO meta(key, value) VALUES ('ledger_cut', ?)", (repr(cut),)
            )


MAX_RECOVERIES = 4096  # per rule: a forged or endless stream of GPUs cannot grow it


ALERT_STATES = frozenset({"inactive", "pending", "firing"})


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _maybe(v: object) -> bool:
    return v is None or _number(v)


def _str_map(text: object, what: str) -> dict[str, str]:
    """A JSON object of strings (labels, annotations); ``ValueError`` for anything else
    (valid JSON of another shape included)."""
    if not isinstance(text, str):
        raise ValueError(f"{what}: not text")
    value = json.loads(text)
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ValueError(f"{what}: not an object of strings")
    return value


def _alert_record(row: tuple[Any, ...]) -> AlertRecord:
    """One saved alert row, every column checked for its type (a row written by hand, by
    another version or by a broken disk must not stop the start)."""
    fingerprint, rule, labels, state, severity = row[0], row[1], row[2], row[3], row[4]
    if not all(isinstance(x, str) for x in (fingerprint, rule, state, severity, row[11])):
        raise ValueError("a text column is not text")
    if state not in ALERT_STATES:
        raise ValueError(f"unknown state {state[:40]!r}")
    if not (_number(row[5]) and _number(row[6]) and _maybe(row[7]) and _maybe(row[9])):
        raise ValueError("a time or value column is not a number")
    if not isinstance(row[8], int) or not isinstance(row[12], int):
        raise ValueError("sequence or escalated is not an integer")
    return AlertRecord(
        fingerprint=fingerprint,
        rule=rule,
        labels=_str_map(labels, "labels"),
        state=state,
        severity=severity,
        active_since=float(row[5]),
        last_true=float(row[6]),
        fired_at=None if row[7] is None else float(row[7]),
        sequence=row[8],
        value=None if row[9] is None else float(row[9]),
        annotations=_str_map(row[10], "annotations"),
        boot_id=row[11],
        escalated=bool(row[12]),
    )


class StateStore:
    """SQLite-backed state. ``path=":memory:"`` keeps it in memory (simulate, tests)."""

    def __init__(
        self, path: str, *, boot_id: str | None = None, ledger_rows: int = LEDGER_MAX_ROWS
    ) -> None:
        self.path = path
        self.ledger_rows = ledger_rows  # the memory ledger's bound (oldest dropped first)
        self.boot_id = boot_id if boot_id is not None else read_boot_id()
        self.errors = 0
        self.write_ok = True  # False while writes fail (disk full, read-only): for metrics
        self.rebuilt = False
        self.set_aside = 0  # files moved aside and rows skipped as unusable
        self._conn: sqlite3.Connection | None = None
        # Where the state belongs on disk, also while it is kept in memory because that
        # disk could not be written (read-only, deleted): ``_write`` goes back to it.
        self.disk_path: str | None = None if path == ":memory:" else path
        self._ident: tuple[int, int] | None = None
        self._retry_at = 0.0
        self._ledger_started = False  # ``ledger_since`` written by this store
        self._open()

    # -- opening and rebuilding -----------------------------------------------------------
    @classmethod
    def in_state_dir(cls, state_dir: str, *, boot_id: str | None = None) -> StateStore:
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
        except OSError as exc:
            log.warning(
                "state directory %s unusable (%s): rule state is kept in memory only",
                state_dir,
                exc.strerror or exc,
            )
            store = cls(":memory:", boot_id=boot_id)
            store.disk_path = os.path.join(state_dir, DB_NAME)
            return store
        return cls(os.path.join(state_dir, DB_NAME), boot_id=boot_id)

    @property
    def memory(self) -> bool:
        return self.path == ":memory:"

    def _connect(self) -> sqlite3.Connection:
        # a FIFO or link would hang or redirect SQLite: moved aside unopened
        self.set_aside += open_files_safely(
            self.path, "rule state", "alert states and counter history start afresh"
        )
        conn = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL" if not self.memory else "PRAGMA journal_mode=MEMORY")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    def _check(self, conn: sqlite3.Connection) -> str | None:
        """None when the database is usable, else why not."""
        row = conn.execute("PRAGMA quick_check").fetchone()
        if row is None or row[0] != "ok":
            return f"integrity check failed: {row[0] if row else 'no answer'}"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "meta" in tables:
            got = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if got is not None and got[0] != SCHEMA_VERSION:
                return f"schema version {got[0]}, expected {SCHEMA_VERSION}"
        return None

    def _open(self) -> None:
        try:
            conn = self._connect()
            problem = self._check(conn)
            if problem is None:
                with conn:
                    conn.executescript(_SCHEMA)
                    conn.execute(
                        "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema', ?)",
                        (SCHEMA_VERSION,),
                    )
                self._conn = conn
                self._ident = self._identity()
                return
            conn.close()
        except sqlite3.Error as exc:
            if not self.memory and storage_error(exc) and not damaged(exc):
                self._to_memory(str(exc))  # cannot write it, but the file is fine: keep it
                return
            problem = str(exc)
        except OSError as exc:  # not even moved aside (a read-only directory): memory
            self._to_memory(str(exc))
            return
        self._rebuild(problem)

    # -- a disk that cannot be written ----------------------------------------------------
    def _identity(self) -> tuple[int, int] | None:
        return file_identity(self.path)

    def health(self) -> StoreHealth:
        """The store's health in the vocabulary every state store reports."""
        return StoreHealth("rules", not self.memory and self.write_ok, self.errors, "",
                           self.set_aside)  # fmt: skip

    def _to_memory(self, problem: str) -> None:
        """Keep the state in memory, starting from what the file holds if it can be read."""
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        loaded = self.disk_path is not None and copy_read_only(self.disk_path, conn)
        conn.executescript(_SCHEMA)
        self.path = ":memory:"
        self._conn = conn
        self.write_ok = False
        self._retry_at = time.monotonic() + RETRY_DISK_EVERY
        log.error(
            "rule state: cannot write %s (%s): alert states kept in memory%s; trying again "
            "every %gs",
            self.disk_path,
            problem,
            ", starting from its saved contents" if loaded else "",
            RETRY_DISK_EVERY,
        )

    def _back_to_disk(self) -> None:
        """Write the state to ``disk_path`` (a new file) and use that from now on; stay as
        it is (and try again later) when that fails."""
        assert self.disk_path is not None and self._conn is not None
        self._retry_at = time.monotonic() + RETRY_DISK_EVERY
        try:
            write_back(self._conn, self.disk_path)
        except (OSError, sqlite3.Error) as exc:
            log.debug("rule state: still cannot write %s: %s", self.disk_path, exc)
            return
        old, old_path = self._conn, self.path
        self.path = self.disk_path
        try:
            self._conn = self._connect()
        except sqlite3.Error as exc:
            self._conn, self.path = old, old_path
            log.debug("rule state: %s does not open: %s", self.disk_path, exc)
            return
        with contextlib.suppress(sqlite3.Error):
            old.close()
        self._ident = self._identity()
        log.warning("rule state: back on disk in %s; alert states are durable again", self.path)

    def _rebuild(self, problem: str) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        if not self.memory:
            try:
                aside = move_aside(self.path)
            except OSError as exc:
                aside = f"nowhere ({exc})"
            log.warning(
                "rule state database %s is unusable (%s): moved to %s and rebuilt; alert "
                "states and counter history start afresh",
                self.path,
                problem,
                aside,
            )
        self.rebuilt = True
        self._ledger_started = False  # the new file's ledger starts now
        try:
            conn = self._connect()
            with conn:
                conn.executescript(_SCHEMA)
                conn.execute(
                    "INSERT OR REPLACE INTO meta(key, value) VALUES ('schema', ?)",
                    (SCHEMA_VERSION,),
                )
            self._conn = conn
            self._ident = self._identity()
        except (sqlite3.Error, OSError) as exc:
            log.error(
                "cannot create rule state database %s (%s): keeping state in memory", self.path, exc
            )
            self.path = ":memory:"
            conn = self._connect()
            conn.executescript(_SCHEMA)
            self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            self._open()
        assert self._conn is not None
        return self._conn

    def _write(self, what: str, fn: Any) -> bool:
        """Run ``fn(conn)`` in one transaction; on a database error log, count and retry
        once on a rebuilt database (a corrupt file is moved aside)."""
        if self.disk_path is not None and time.monotonic() >= self._retry_at:
            if self.memory:
                self._back_to_disk()
            elif self._identity() != self._ident:
                log.error(
                    "rule state database %s was deleted or replaced under the running daemon: "
                    "writing it again",
                    self.path,
                )
                self.errors += 1
                self._back_to_disk()  # the open connection still holds all of it
        for attempt in (1, 2):
            try:
                conn = self._db()
                with conn:
                    fn(conn)
                self.write_ok = True
                return True
            except sqlite3.DatabaseError as exc:
                self.errors += 1
                failing = not self.write_ok
                self.write_ok = False
                if (
                    attempt == 1
                    and isinstance(exc, sqlite3.DatabaseError)
                    and ("malformed" in str(exc) or "not a database" in str(exc))
                ):
                    self._rebuild(str(exc))
                    continue
                # once per streak (the engine retries at every evaluation), then quietly
                log.log(logging.DEBUG if failing else logging.ERROR, "rule state: %s failed: %s",
                        what, exc)  # fmt: skip
                return False
        return False

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    # -- alerts ---------------------------------------------------------------------------
    def load_alerts(self) -> list[AlertRecord]:
        try:
            rows = (
                self._db()
                .execute(
                    "SELECT fingerprint, rule, labels, state, severity, active_since, last_true,"
                    " fired_at, sequence, value, annotations, boot_id, escalated FROM alerts"
                    " ORDER BY rowid"
                )
                .fetchall()
            )
        except sqlite3.DatabaseError as exc:
            self._rebuild(str(exc))
            return []
        out: list[AlertRecord] = []
        for row in rows:
            try:
                out.append(_alert_record(row))
            except (ValueError, TypeError, RecursionError) as exc:
                self.set_aside += 1
                log.warning(
                    "rule state: skipping unreadable alert row %r: %s", str(row[0])[:200], exc
                )
        return out

    def save_alerts(
        self, records: Iterable[AlertRecord], now: float, ledger: Iterable[LedgerEntry] = ()
    ) -> bool:
        """Save alert states and, in the same transaction, the memory ledger's new rows
        (a row already there, from a save that is retried, is not written twice)."""
        entries = [
            (e.t, e.fingerprint, e.rule, e.gpu, e.uuid, e.kind, e.severity, int(e.drain))
            for e in ledger
        ]
        rows = [
            (
                a.fingerprint,
                a.rule,
                json.dumps(dict(a.labels), sort_keys=True),
                a.state,
                a.severity,
                a.active_since,
                a.last_true,
                a.fired_at,
                a.sequence,
                a.value,
                json.dumps(dict(a.annotations), sort_keys=True),
                a.boot_id,
                int(a.escalated),
                now,
            )
            for a in records
        ]
        if not rows and not entries:
            return True
        start_ledger = not self._ledger_started

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT OR REPLACE INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows
            )
            if start_ledger:  # from now on every memory firing is in the ledger
                conn.execute(
                    "INSERT OR IGNORE INTO meta(key, value) VALUES ('ledger_since', ?)",
                    (repr(now),),
                )
            if entries:
                conn.executemany(
                    "INSERT OR IGNORE INTO memory_ledger(t, fingerprint, rule, gpu, uuid, kind,"
                    " severity, drain) VALUES (?,?,?,?,?,?,?,?)",
                    entries,
                )
                _prune_ledger(conn, now, self.ledger_rows)
            for a in rows:
                if a[3] == "firing":
                    conn.execute(
                        "INSERT INTO faults(fingerprint, boot_id, first, last) VALUES (?,?,?,?)"
                        " ON CONFLICT(fingerprint, boot_id) DO UPDATE SET last=excluded.last",
                        (a[0], a[11], now, now),
                    )

        if not self._write("saving alert states", write):
            return False
        self._ledger_started = True
        return True

    def load_ledger(self, limit: int = LEDGER_MAX_ROWS) -> Ledger:
        """The memory ledger, newest ``limit`` rows at most (a forged file cannot make the
        reader hold more), oldest first; rows that do not read are skipped and listed."""
        db = self._db()
        try:
            meta = dict(
                db.execute(
                    "SELECT key, value FROM meta WHERE key IN ('ledger_since', 'ledger_cut')"
                ).fetchall()
            )
            rows = db.execute(
                "SELECT rowid, t, fingerprint, rule, gpu, uuid, kind, severity, drain"
                " FROM memory_ledger ORDER BY t DESC, rowid DESC LIMIT ?",
                (limit + 1,),
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            return Ledger([], None, None, [(0, f"the ledger does not read: {exc}")])
        since = _meta_time(meta.get("ledger_since"))
        bad: list[tuple[int, str]] = []
        if "ledger_since" in meta and since is None:
            bad.append((0, f"meta ledger_since: not a time: {str(meta['ledger_since'])[:40]!r}"))
        out: list[LedgerEntry] = []
        for row in rows[:limit]:
            try:
                out.append(_ledger_entry(tuple(row[1:])))
            except (ValueError, TypeError) as exc:
                bad.append((int(row[0]), str(exc)))
        out.reverse()
        bad.sort()
        truncated = len(rows) > limit
        cut = _meta_time(meta.get("ledger_cut"))
        if truncated:  # the rows not read are as good as dropped
            unread = rows[limit][1]
            last = float(unread) if _number(unread) else out[0].t if out else None
            if last is not None and (cut is None or last > cut):
                cut = last
        return Ledger(out, since, cut, bad, truncated)

    def fault_boots(self, fingerprint: str, since: float) -> set[str]:
        """The boots in which this alert was firing at some time after ``since``."""
        try:
            rows = (
                self._db()
                .execute(
                    "SELECT boot_id FROM faults WHERE fingerprint=? AND last>=?",
                    (fingerprint, since),
                )
                .fetchall()
            )
        except sqlite3.DatabaseError as exc:
            log.error("rule state: reading fault history failed: %s", exc)
            return set()
        return {r[0] for r in rows}

    # -- counter history ------------------------------------------------------------------
    def load_counters(self) -> dict[str, CounterRecord]:
        try:
            db = self._db()
            out: dict[str, CounterRecord] = {}
            bad = 0
            for r in db.execute('SELECT key, last_raw, "offset", last_t FROM counters'):
                if not (isinstance(r[0], str) and _number(r[2]) and all(map(_maybe, r[1::2]))):
                    bad += 1
                    continue
                out[r[0]] = CounterRecord(r[1], float(r[2]), r[3])
            for key, t, v in db.execute("SELECT key, t, v FROM history ORDER BY key, t"):
                if not (isinstance(key, str) and _number(t) and _number(v)):
                    bad += 1
                    continue
                rec = out.get(key)
                if rec is None:
                    rec = out[key] = CounterRecord(None, 0.0, None)
                rec.points.append((float(t), float(v)))
            if bad:
                self.set_aside += bad
                log.warning("rule state: skipped %d unreadable counter rows", bad)
        except sqlite3.DatabaseError as exc:
            self._rebuild(str(exc))
            return {}
        return out

    def save_counters(self, batch: Mapping[str, CounterRecord], now: float) -> bool:
        if not batch:
            return True

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                'INSERT OR REPLACE INTO counters(key, last_raw, "offset", last_t) VALUES (?,?,?,?)',
                [(k, r.last_raw, r.offset, r.last_t) for k, r in batch.items()],
            )
            conn.executemany(
                "INSERT OR REPLACE INTO history(key, t, v) VALUES (?,?,?)",
                [(k, t, v) for k, r in batch.items() for t, v in r.points],
            )

        return self._write("saving counter history", write)

    # -- XID episodes -----------------------------------------------------------------------
    def load_episodes(self, rule: str, signature: str) -> tuple[list[EpisodeRecord], int]:
        """The episodes saved for ``rule`` with this grouping ``signature``, and how many
        rows were unreadable (skipped; the next save replaces them)."""
        try:
            rows = (
                self._db()
                .execute(
                    'SELECT uuid, xid, start, "end", pids, flags FROM xid_episodes'
                    " WHERE rule=? AND signature=? ORDER BY start",
                    (rule, signature),
                )
                .fetchall()
            )
        except sqlite3.DatabaseError as exc:
            self._rebuild(str(exc))
            return [], 0
        out: list[EpisodeRecord] = []
        bad = 0
        for uuid, xid, start, end, pids, flags in rows:
            try:
                pid_list = json.loads(pids)
                if not (
                    isinstance(uuid, str)
                    and isinstance(xid, int)
                    and isinstance(flags, int)
                    and isinstance(pid_list, list)
                    and len(pid_list) <= 64
                    and all(type(p) is int for p in pid_list)
                ):
                    raise ValueError("wrong types")
                out.append(
                    EpisodeRecord(uuid, xid, float(start), float(end), tuple(pid_list), flags)
                )
            except (ValueError, TypeError):
                bad += 1
        return out, bad

    def save_episodes(self, rule: str, signature: str, records: Iterable[EpisodeRecord]) -> bool:
        """Replace what is saved for ``rule`` by ``records``."""
        rows = [
            (rule, signature, e.uuid, e.xid, e.start, e.end, json.dumps(list(e.pids)), e.flags)
            for e in records
        ]

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM xid_episodes WHERE rule=?", (rule,))
            conn.executemany("INSERT OR REPLACE INTO xid_episodes VALUES (?,?,?,?,?,?,?,?)", rows)

        return self._write("saving XID episodes", write)

    # -- XID recoveries ----------------------------------------------------------------------
    def load_recoveries(self, rule: str) -> tuple[list[RecoveryRecord], int]:
        """The faults saved for ``rule``, and how many rows were unreadable (skipped)."""
        try:
            rows = (
                self._db()
                .execute(
                    "SELECT uuid, xid, codes, last, boot_id, step, returns, recovered, proof,"
                    " flags, ecc FROM xid_recoveries WHERE rule=? LIMIT ?",
                    (rule, MAX_RECOVERIES),
                )
                .fetchall()
            )
        except sqlite3.DatabaseError as exc:
            self._rebuild(str(exc))
            return [], 0
        out: list[RecoveryRecord] = []
        bad = 0
        for uuid, xid, codes, last, boot_id, step, returns, recovered, proof, flags, ecc in rows:
            try:
                code_list = json.loads(codes)
                if not (
                    isinstance(uuid, str)
                    and isinstance(boot_id, str)
                    and isinstance(proof, str)
                    and all(type(v) is int for v in (xid, step, returns, flags))
                    and 0 <= step <= 2
                    and returns >= 0
                    and _number(last)
                    and (recovered is None or _number(recovered))
                    and (ecc is None or _number(ecc))
                    and isinstance(code_list, list)
                    and 0 < len(code_list) <= 64
                    and all(type(c) is int for c in code_list)
                ):
                    raise ValueError("wrong types")
                out.append(
                    RecoveryRecord(
                        uuid,
                        xid,
                        tuple(code_list),
                        float(last),
                        boot_id,
                        step,
                        returns,
                        None if recovered is None else float(recovered),
                        proof[:200],
                        flags,
                        None if ecc is None else float(ecc),
                    )
                )
            except (ValueError, TypeError):
                bad += 1
        return out, bad

    def save_recoveries(self, rule: str, records: Iterable[RecoveryRecord]) -> bool:
        """Replace what is saved for ``rule`` by ``records``."""
        rows = [
            (
                rule,
                r.uuid,
                r.xid,
                json.dumps(list(r.codes)),
                r.last,
                r.boot_id,
                r.step,
                r.returns,
                r.recovered,
                r.proof,
                r.flags,
                r.ecc,
            )
            for r in records
        ][:MAX_RECOVERIES]

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM xid_recoveries WHERE rule=?", (rule,))
            conn.executemany(
                "INSERT OR REPLACE INTO xid_recoveries VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows
            )

        return self._write("saving XID recoveries", write)

    def trim(self, now: float) -> None:
        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM xid_recoveries WHERE recovered IS NOT NULL AND recovered < ?",
                (now - EPISODE_RETENTION,),
            )
            conn.execute("DELETE FROM history WHERE t < ?", (now - HISTORY_RETENTION,))
            conn.execute('DELETE FROM xid_episodes WHERE "end" < ?', (now - EPISODE_RETENTION,))
            conn.execute("DELETE FROM faults WHERE last < ?", (now - INACTIVE_RETENTION,))
            _prune_ledger(conn, now, self.ledger_rows)
            conn.execute(
                "DELETE FROM alerts WHERE state='inactive' AND updated < ?",
                (now - INACTIVE_RETENTION,),
            )

        self._write("trimming old state", write)
