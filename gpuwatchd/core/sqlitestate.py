"""The resilient-SQLite mechanisms both state stores use (the rule engine's
``rules.sqlite3``, the outbox's ``actions.db``), written once.

A store keeps its policy (what it holds, when it checks, what it logs); the mechanisms
are here:

- ``open_files_safely``: a database file, ``-wal``, ``-shm`` or ``-journal`` that is not a
  regular file (a link, FIFO, directory, device) is renamed ``<name>.unsafe-<time>``
  unopened before SQLite ever sees it (a FIFO would hang it, a link would redirect it);
- ``move_aside``: a damaged database (or one of another schema) is renamed
  ``<name>.corrupt-<time>`` with its WAL and shared memory, so the store starts afresh
  instead of failing every start;
- ``memory_copy``: the contents of an open connection, copied into memory, when the disk
  under it fails (full, read-only, deleted, replaced): the store carries on in memory;
- ``file_identity``: the (device, inode) a store watches, so a file deleted or replaced
  under the running daemon is noticed;
- ``verify``: a fresh read-only look at the file on disk (quick_check);
- ``write_back``: an in-memory store written to a new file that replaces the old one
  (never paired with an old WAL), verified and synced, so it is durable again.

Reading a file that cannot be written (starting in memory from what it saved) is
``core.sqlitecopy.copy_read_only``. The health vocabulary every store reports is
``core.statehealth.StoreHealth``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import time

from gpuwatchd.core.statefile import UnsafeStateFile, check_sqlite_files, set_aside_unsafe

__all__ = [
    "file_identity",
    "memory_copy",
    "move_aside",
    "open_files_safely",
    "stamp",
    "verify",
    "write_back",
]

log = logging.getLogger(__name__)

Identity = tuple[int, int]


def stamp() -> str:
    """The time suffix of a file moved aside."""
    return time.strftime("%Y%m%dT%H%M%S")


def open_files_safely(path: str, store: str, afresh: str) -> int:
    """Make sure SQLite may open ``path``'s files: any that is not a regular file is moved
    aside unopened, with an error line naming the ``store`` and what starts ``afresh``.
    How many were moved (0 when all was well); ``UnsafeStateFile`` when one cannot be."""
    try:
        check_sqlite_files(path)
        return 0
    except UnsafeStateFile as exc:
        try:
            moved = set_aside_unsafe(path, stamp())
            check_sqlite_files(path)
        except OSError as again:
            raise UnsafeStateFile(
                again.errno or 0, f"{exc}; cannot move it aside: {again}"
            ) from None
    log.error(
        "%s: %s: moved aside (renamed to *.unsafe-<time>), not opened; %s",
        store,
        ", ".join(moved),
        afresh,
    )
    return len(moved)


def move_aside(path: str, label: str = "corrupt") -> str:
    """Rename the database and its ``-wal`` and ``-shm`` to ``<path>.<label>-<time>``; the
    new name of the database. A file that is not there is skipped; ``OSError`` when one
    cannot be moved (the caller logs it)."""
    aside = f"{path}.{label}-{stamp()}"
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(path + suffix, aside + suffix)
    return aside


def file_identity(path: str) -> Identity | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def verify(path: str) -> str | None:
    """None when the file at ``path`` reads as a sound database (a fresh read-only
    connection, after checking that its files are regular files); else why not."""
    try:
        check_sqlite_files(path)
        probe = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0)
    except (UnsafeStateFile, sqlite3.Error) as exc:
        return str(exc)
    try:
        check = probe.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            return f"quick_check: {check[0] if check else '-'}"
        probe.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        probe.close()
    return None


def memory_copy(conn: sqlite3.Connection) -> tuple[sqlite3.Connection, str]:
    """A new in-memory connection holding what ``conn`` holds, and "" ; or an empty one and
    why the contents could not be read (the caller says what was lost)."""
    with contextlib.suppress(sqlite3.Error):
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    mem = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    try:
        conn.backup(mem)
        check = mem.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            raise sqlite3.DatabaseError(f"quick_check: {check[0] if check else '-'}")
    except sqlite3.Error as exc:
        mem.close()
        return sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None), str(exc)
    return mem, ""


def write_back(source: sqlite3.Connection, path: str) -> None:
    """Write what ``source`` holds to a new file that replaces ``path``: copied to
    ``<path>.recover``, read back, then renamed over ``path`` (a damaged ``path`` is
    moved aside first), its old ``-wal``/``-shm`` removed (a new file must never be paired
    with an old WAL), and the directory synced. Raises ``OSError`` or ``sqlite3.Error``
    when any step fails; nothing is left behind then (a full disk stays as it was)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = path + ".recover"
    for name in (tmp, tmp + "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)
    try:
        disk = sqlite3.connect(tmp)
        try:
            source.backup(disk)
        finally:
            disk.close()
        problem = verify(tmp)
        if problem is not None:
            raise sqlite3.DatabaseError(f"the copy does not read back: {problem}")
    except BaseException:
        for name in (tmp, tmp + "-journal"):  # do not leave it filling a full disk
            with contextlib.suppress(OSError):
                os.unlink(name)
        raise
    if os.path.lexists(path) and verify(path) is not None:
        aside = move_aside(path)
        log.error("%s was damaged while the daemon ran: moved aside to %s", path, aside)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    os.replace(tmp, path)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
