"""Reading a SQLite state database that cannot be written (read-only file system, no
permission), so that a store that must run in memory starts from what was saved instead
of from nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3

from gpuwatchd.core.statefile import check_sqlite_files, open_state_file

__all__ = [
    "STORAGE_ERRORS",
    "copy_read_only",
    "damaged",
    "storage_error",
    "unreadable_wal_frames",
]

log = logging.getLogger(__name__)
MAX_PRIVATE_COPY = 256 << 20  # bytes of database and WAL copied to replay the WAL, at most

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
    # (a read-only file system) but sees only what was checkpointed: before it, the
    # database and its WAL are copied somewhere private and opened there, so that SQLite
    # replays the WAL into the copy (a page pending in the WAL of a read-only disk is kept)
    if _backup_from(f"file:{path}?mode=ro", dest):
        _report_unreadable(path)
        return True
    if _replay_private_copy(path, dest):
        return True
    if _backup_from(f"file:{path}?immutable=1", dest):
        wal = _size(path + "-wal")
        if wal:
            log.error(
                "%s: its WAL (%d bytes of changes not yet in the database) could not be "
                "read: started from the database alone, those changes are lost",
                path,
                wal,
            )
        return True
    return False


def _report_unreadable(path: str) -> None:
    lost = unreadable_wal_frames(path + "-wal")
    if lost:
        log.error(
            "%s: its WAL was replayed up to a damaged frame: %d frame(s) after it could not "
            "be read, the changes in them are lost",
            path,
            lost,
        )


def _size(path: str) -> int:
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def _backup_from(uri: str, dest: sqlite3.Connection) -> bool:
    try:
        src = sqlite3.connect(uri, uri=True, timeout=5.0)
    except sqlite3.Error:
        return False
    try:
        check = src.execute("PRAGMA quick_check(1)").fetchone()
        if check is None or check[0] != "ok":
            return False
        src.backup(dest)
        return True
    except sqlite3.Error:
        return False
    finally:
        with contextlib.suppress(sqlite3.Error):
            src.close()


WAL_MAGIC = {0x377F0682: "<", 0x377F0683: ">"}  # checksum word order of a WAL file


def unreadable_wal_frames(path: str, limit: int = MAX_PRIVATE_COPY) -> int:
    """How many frames of the WAL at ``path`` were written in its current generation (the
    header's salts) but lie after the first one SQLite cannot read (a bad checksum, a
    torn write): the committed changes in them are lost when SQLite replays the WAL, which
    stops there. 0 for a sound WAL, one whose tail is only stale frames of an earlier
    generation, or one that ends in a transaction never committed."""
    import struct

    try:
        fd = open_state_file(path)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit)
    except OSError:
        return 0
    if len(data) < 32:
        return 0
    magic, _version, page, _seq, salt1, salt2, c0, c1 = struct.unpack(">8I", data[:32])
    order = WAL_MAGIC.get(magic)
    if order is None or page < 512 or page & (page - 1):
        return 0

    def checksum(chunk: bytes, s0: int, s1: int) -> tuple[int, int]:
        words = struct.unpack(f"{order}{len(chunk) // 4}I", chunk)
        for i in range(0, len(words), 2):
            s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
            s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
        return s0, s1

    if checksum(data[:24], 0, 0) != (c0, c1):
        return 0  # a header that does not check out: SQLite ignores the whole WAL
    size = 24 + page
    frames = [data[i : i + size] for i in range(32, len(data) - size + 1, size)]
    s0, s1 = c0, c1
    sound = 0
    for frame in frames:
        _pgno, _commit, f1, f2, k0, k1 = struct.unpack(">6I", frame[:24])
        if (f1, f2) != (salt1, salt2):
            break
        s0, s1 = checksum(frame[:8], s0, s1)
        s0, s1 = checksum(frame[24:], s0, s1)
        if (s0, s1) != (k0, k1):
            break
        sound += 1
    tail = frames[sound:]
    if not tail or struct.unpack(">2I", tail[0][8:16]) != (salt1, salt2):
        # stale frames of an earlier generation follow: nothing of this one is lost,
        # unless a damaged frame also lost its salts (then its successors still show them)
        tail = tail[1:]
    return sum(1 for f in tail if struct.unpack(">2I", f[8:16]) == (salt1, salt2))


def _replay_private_copy(path: str, dest: sqlite3.Connection) -> bool:
    """Copy the database and its WAL (regular files, within ``MAX_PRIVATE_COPY``) into a
    private temporary directory, let SQLite replay the WAL there, and back that up into
    ``dest``; False when there is no WAL, it is too large, or anything fails."""
    import shutil  # only here: a start that needs it is rare
    import tempfile

    wal = _size(path + "-wal")
    if not wal or _size(path) + wal > MAX_PRIVATE_COPY:
        return False
    try:
        tmp = tempfile.mkdtemp(prefix="gpuwatchd-replay-")
    except OSError:
        return False
    try:
        copy = os.path.join(tmp, "copy.db")
        for suffix in ("", "-wal"):
            fd = open_state_file(path + suffix)
            with os.fdopen(fd, "rb") as src, open(copy + suffix, "wb") as out:
                shutil.copyfileobj(src, out)
        lost = unreadable_wal_frames(copy + "-wal")
        if not _backup_from(f"file:{copy}", dest):
            return False
        if lost:  # SQLite replays up to the first frame it cannot read
            log.error(
                "%s: read through a private copy, its WAL (%d bytes) replayed up to a "
                "damaged frame: %d frame(s) after it could not be read, the changes in "
                "them are lost",
                path,
                wal,
                lost,
            )
        else:
            log.warning(
                "%s: read through a private copy, its WAL (%d bytes) replayed: nothing "
                "saved in it was lost",
                path,
                wal,
            )
        return True
    except OSError:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
