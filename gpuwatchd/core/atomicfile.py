"""Files that readers see whole: the old version or the new one, never half of either.

The state directory belongs to the service user, and root writes into it too
(``gpuwatchd silence add``). Whoever owns a directory can swap any name in it for a
symbolic link at any moment, so nothing here is done by path after the directory is
opened: the temporary file is created through the directory's file descriptor with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never a link), its mode is set
with ``fchmod`` on the open descriptor, and only the final ``rename`` (which moves names,
never follows them) and the clean-up ``unlink`` use names, both relative to the directory
descriptor. A link swapped in for the temporary file can at worst become the new state
file, which every reader refuses (``core/statefile.py``); it never makes root change,
create or write a file elsewhere.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def open_directory(directory: str) -> Iterator[int]:
    """A file descriptor of ``directory`` (created if needed), closed on exit."""
    os.makedirs(directory, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def create_exclusive(dir_fd: int, prefix: str, mode: int = 0o600) -> tuple[int, str]:
    """A new, empty regular file in the directory ``dir_fd``: its descriptor and name.

    The name is ``prefix`` plus random hex; created with ``O_EXCL | O_NOFOLLOW`` (an
    existing name, link or not, is never opened) and given ``mode`` with ``fchmod``.
    """
    for _ in range(100):
        name = f"{prefix}{os.urandom(6).hex()}"  # not secrets: it loads OpenSSL
        try:
            fd = os.open(name, CREATE_FLAGS, 0o600, dir_fd=dir_fd)
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise
        return fd, name
    raise FileExistsError(f"no free temporary name for {prefix}")


def write_atomic_at(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``name`` in the directory ``dir_fd`` by a file holding ``data``.

    On any failure the temporary file is removed and the exception propagates; ``name``
    keeps its previous content.
    """
    fd, tmp = create_exclusive(dir_fd, "." + name + ".", mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_atomic(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` through a temporary file, fsync and rename.

    The directory is created if needed. On any failure the temporary file is removed and
    the exception propagates; ``path`` keeps its previous content.
    """
    with open_directory(os.path.dirname(path) or ".") as dir_fd:
        write_atomic_at(dir_fd, os.path.basename(path), text.encode("utf-8"), mode)
