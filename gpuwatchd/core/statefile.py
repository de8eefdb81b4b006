"""Open files in the state directory without trusting what the directory holds.

Whoever can write the state directory (the service user, or anyone if it is set up
badly) can replace a state file by a symbolic link, a FIFO or a device. Followed blindly,
that lets them have root's ``gpuwatchd silence add`` create a file anywhere, exhaust
memory by pointing ``silences.json`` at /dev/zero, or hang the daemon on a FIFO named
``actions.db``. Every state file is therefore:

- opened with ``O_NOFOLLOW`` (a symbolic link as the last component is refused) and
  ``O_NONBLOCK`` (a FIFO cannot block the open), then checked with ``fstat`` to be a
  regular file, and only then used (``O_NONBLOCK`` is cleared again);
- read with a size limit (``read_state_file``);
- for SQLite databases, which SQLite opens itself, checked before the open with
  ``lstat`` (the database and its ``-wal``, ``-shm`` and ``-journal`` companions).

A refusal is an ``UnsafeStateFile``, an ``OSError``, so callers that already handle an
unreadable file handle this one the same way, and its message says what was found.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


class UnsafeStateFile(OSError):
    """A state file that is a link, a FIFO, a device or a directory; or one too large."""


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse(path: str, what: str) -> UnsafeStateFile:
    return UnsafeStateFile(
        errno.EINVAL,
        f"refusing {path}: a file that is {what} (only regular files are read)",
        path,
    )


def open_state_file(
    path: str, flags: int = os.O_RDONLY, mode: int = 0o644, *, dir_fd: int | None = None
) -> int:
    """A file descriptor for the regular file ``path`` (never a link, FIFO or device);
    ``path`` relative to the directory ``dir_fd`` when given."""
    return open_regular(path, flags, mode, follow_links=False, dir_fd=dir_fd)


def open_regular(
    path: str,
    flags: int = os.O_RDONLY,
    mode: int = 0o644,
    *,
    follow_links: bool,
    dir_fd: int | None = None,
) -> int:
    """A file descriptor for ``path`` if it is a regular file; ``UnsafeStateFile`` if it
    is a FIFO, device, directory or socket (or a symbolic link, unless ``follow_links``).
    Opening never blocks, whatever ``path`` is. Config and rule files are opened with
    ``follow_links=True`` (an administrator may link them); state files never are."""
    extra = os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags | extra, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_links:
            raise _refuse(path, "a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _refuse(path, _kind(st.st_mode))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_state_file(
    path: str, limit: int, *, follow_links: bool = False, dir_fd: int | None = None
) -> bytes:
    """The content of the regular file ``path``, at most ``limit`` bytes (else refused).

    ``FileNotFoundError`` passes through for callers that treat an absent file as empty.
    """
    fd = open_regular(path, follow_links=follow_links, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise UnsafeStateFile(errno.EFBIG, f"refusing {path}: larger than {limit} bytes", path)
    return data


def check_state_file(path: str) -> None:
    """Nothing, if ``path`` is absent or a regular file; else ``UnsafeStateFile``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, _kind(st.st_mode))


def check_sqlite_files(path: str) -> None:
    """``check_state_file`` for a SQLite database and the files SQLite keeps next to it."""
    if path == ":memory:" or path.startswith("file:"):
        return
    for suffix in SQLITE_COMPANIONS:
        check_state_file(path + suffix)


def set_aside_unsafe(path: str, stamp: str) -> list[str]:
    """Rename each of ``path``'s SQLite files that is not a regular file (a link, FIFO,
    directory, device) to ``<name>.unsafe-<stamp>``, never opening it; the names moved.

    A store calls this when ``check_sqlite_files`` refuses its files at start-up, so that
    it can run on a fresh database instead of failing every start (a crash loop)."""
    moved: list[str] = []
    if path == ":memory:" or path.startswith("file:"):
        return moved
    for suffix in SQLITE_COMPANIONS:
        name = path + suffix
        try:
            st = os.lstat(name)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            continue
        os.replace(name, f"{name}.unsafe-{stamp}")
        moved.append(f"{name} ({_kind(st.st_mode)})")
    return moved
