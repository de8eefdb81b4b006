"""Reading a SQLite state database that cannot be written (read-only file system, no
permission), so that a store that must run in memory starts from what was saved instead
of from nothing."""

from __future__ import annotations

import contextlib
import os
import sqlite3

from gpuwatchd.core.statefile import check_sqlite_files

__all__ = ["STORAGE_ERRORS", "copy_read_only", "damaged", "storage_error"]

# SQLite primary result codes that mean "the file or the disk under it is in trouble"
# (as opposed to a bug in a statement): READONLY, IOERR, CORRUPT, FULL, CANTOPEN, NOTADB.
STORAGE_ERRORS = frozenset({8, 10, 11, 13, 14, 26})


def storage_error(exc: BaseException) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return (code & 0xFF) in STORAGE_ERRORS
    return isinstance(exc, sqlite3.OperationalError) and "unable to open" in str(exc)


def damaged(exc: BaseException) -> bool:
    """A file that is not (or no longer) a sound database, as opposed to one that may not
    be written or opened (read-only, full, missing permissions)."""
    code = getattr(exc, "sqlite_errorcode", None)
    return not isinstance(code, int) or (code & 0xFF) in (11, 26)


def copy_read_only(path: str, dest: sqlite3.Connection) -> bool:
    """Copy the database at ``path`` into ``dest`` without writing anything next to it.
    True when a sound copy was made; ``dest`` is left as it was otherwise."""
    try:
        check_sqlite_files(path)  # never a link, FIFO or device (a FIFO would hang SQLite)
    except OSError:
        return False
    if not os.path.isfile(path):
        return False
    # mode=ro still reads the WAL; immutable=1 works where even the -shm cannot be made
    # (a read-only file system) and sees what was checkpointed (all of it after a clean stop).
    for query in ("mode=ro", "immutable=1"):
        try:
            src = sqlite3.connect(f"file:{path}?{query}", uri=True, timeout=5.0)
        except sqlite3.Error:
            continue
        try:
            check = src.execute("PRAGMA quick_check(1)").fetchone()
            if check is None or check[0] != "ok":
                continue
            src.backup(dest)
            return True
        except sqlite3.Error:
            continue
        finally:
            with contextlib.suppress(sqlite3.Error):
                src.close()
    return False
