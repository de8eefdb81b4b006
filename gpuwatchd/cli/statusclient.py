"""``gpuwatchd status``'s side of the status socket: find it, prove it is the daemon's,
read the answer, and make every string from it safe to print.

Proof (see ``gpuwatchd.exposition.statussock``): the socket is a socket (not a link), it
and its directory belong to the same user, the directory is writable by no one but that
user, and the peer process (``SO_PEERCRED``) runs as that user. Someone who squats the
HTTP port cannot pass: they cannot create a file in the service user's runtime directory.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from collections.abc import Mapping
from typing import Any

from gpuwatchd.exposition.statussock import SOCKET_NAME, socket_path

MAX_ANSWER = 16 * 1024 * 1024
DEFAULT_RUNTIME_DIR = "/run/gpuwatchd"


class StatusSocketError(Exception):
    """The socket is missing, unverifiable or gave no valid answer. ``stale``: nothing
    accepts on it (a socket a stopped daemon left): no daemon runs."""

    def __init__(self, message: str, *, stale: bool = False) -> None:
        super().__init__(message)
        self.stale = stale


def candidates(state_dir: str, environ: Mapping[str, str]) -> list[str]:
    """Where the daemon may have put its socket, in the order they are tried."""
    out = [socket_path(state_dir, dict(environ)), os.path.join(DEFAULT_RUNTIME_DIR, SOCKET_NAME)]
    out.append(os.path.join(state_dir, SOCKET_NAME))
    return list(dict.fromkeys(out))


def find_socket(state_dir: str, environ: Mapping[str, str]) -> str | None:
    for path in candidates(state_dir, environ):
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                return path
        except OSError:
            continue
    return None


def verify(path: str) -> int:
    """The uid the daemon runs as, if ``path`` can only have been made by it."""
    try:
        st = os.lstat(path)
        parent = os.stat(os.path.dirname(path) or ".")
    except OSError as exc:
        raise StatusSocketError(f"{path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise StatusSocketError(f"{path} is not a socket")
    if st.st_uid != parent.st_uid:
        raise StatusSocketError(
            f"{path} belongs to uid {st.st_uid}, its directory to uid {parent.st_uid}: "
            "not the daemon's"
        )
    if parent.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StatusSocketError(
            f"{os.path.dirname(path)} is writable by others: anyone could have made {path}"
        )
    return st.st_uid


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def read_verified(path: str, timeout: float) -> dict[str, Any]:
    """The daemon's status document, after proving who answers. A daemon that says it is
    busy (the socket's rate limit per uid) is asked again after the pause it names, for
    as long as ``timeout`` allows."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        doc = _read_once(path, max(0.1, deadline - time.monotonic()))
        busy = doc.get("busy")
        if "status" in doc or not isinstance(busy, dict):
            break
        pause = busy.get("retry_after")
        pause = min(max(float(pause), 0.05), 1.0) if isinstance(pause, int | float) else 0.2
        if time.monotonic() + pause >= deadline:
            raise StatusSocketError(f"{path}: the daemon stayed busy for {timeout:g}s")
        time.sleep(pause)
    if not isinstance(doc.get("status"), dict):
        raise StatusSocketError(f"{path}: the answer has no status")
    return doc


def _read_once(path: str, timeout: float) -> dict[str, Any]:
    owner = verify(path)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(timeout)
            sock.connect(path)
            peer = _peer_uid(sock)
            if peer != owner:
                raise StatusSocketError(
                    f"{path}: the process answering runs as uid {peer}, the socket belongs "
                    f"to uid {owner}: not the daemon"
                )
            chunks: list[bytes] = []
            size = 0
            while chunk := sock.recv(65536):
                size += len(chunk)
                if size > MAX_ANSWER:
                    raise StatusSocketError(f"{path}: answer larger than {MAX_ANSWER} bytes")
                chunks.append(chunk)
    except (ConnectionRefusedError, FileNotFoundError) as exc:
        raise StatusSocketError(f"{path}: {exc.strerror or exc}", stale=True) from None
    except OSError as exc:
        raise StatusSocketError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(b"".join(chunks).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StatusSocketError(f"{path}: the answer is not a JSON document") from None
    if not isinstance(doc, dict):
        raise StatusSocketError(f"{path}: the answer has no status")
    return doc


def printable(text: str) -> str:
    """``text`` with every control character (escape sequences included) shown escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def clean(value: Any) -> Any:
    """``value`` (a decoded JSON document) with every string, keys included, ``printable``."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {printable(str(k)): clean(v) for k, v in value.items()}
    return value
