"""The daemon's status over a unix socket that only the daemon can have made.

The HTTP port proves nothing: any local user can bind it while the daemon is down and
answer ``gpuwatchd status`` with a fake "ok". This socket lives in the runtime directory
(``$RUNTIME_DIRECTORY``, ``/run/gpuwatchd`` under systemd; ``state_dir`` otherwise), which
belongs to the service user and is writable by no one else, so only the daemon (or root)
can create it. The client (``gpuwatchd.cli.statusclient``) checks exactly that before it
believes an answer: the socket and its directory are owned by the same user, the directory
is not writable by group or others, and the process at the other end (``SO_PEERCRED``)
runs as that user.

Any local user may ask (the socket is 0666, like HTTP on localhost), so answers are rate
limited per peer uid (``SO_PEERCRED``): ``ANSWERS_BURST`` at once, then
``ANSWERS_PER_SECOND``; beyond that a connection gets a few constant bytes,
``{"busy": {"retry_after": S}}``, instead of a document built for it (issue 26: one user
opened 70,244 connections in 30 s and cost 71 % of a core). Each uid has its own bucket,
so one user's flood never keeps another (root's prolog, the service user) from an answer,
and a client told to wait asks again (``gpuwatchd.cli.statusclient``), so many prologs
starting at once are slowed, never refused.

A refusal is cheap, but a flood of them still cost the daemon an ``accept``, a reply and a
``close`` per connection, as fast as a user could connect (60,281 in 3 s, 30 % of a core
here). So after each refusal the server pauses ``REFUSED_PAUSE`` before it accepts again:
connections wait in the listen backlog and a flooding client's ``connect`` blocks, which
caps refusals at about ``1 / REFUSED_PAUSE`` a second whatever the flood, while a waiting
client of another uid is reached after at most a backlog of pauses (``BACKLOG`` x
``REFUSED_PAUSE``, tens of milliseconds).

Protocol: connect, read one JSON document until the server closes. The document is
``{"busy": ...}`` as above, or ``{"status": <what /api/v1/status serves>, "health":
{"ok": bool, "detail": str}, "http": {"listening": bool, "problem": str | null, "where":
"HOST:PORT"}}``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable
from typing import Any

from gpuwatchd.config.web import RateLimiter

log = logging.getLogger(__name__)

SOCKET_NAME = "status.sock"
SEND_TIMEOUT = 2.0
ANSWERS_PER_SECOND = 5.0  # per peer uid, after the burst
ANSWERS_BURST = 20
REFUSED_PAUSE = 0.005  # seconds between a refusal and the next accept
BACKLOG = 16


def socket_path(state_dir: str, environ: dict[str, str] | None = None) -> str:
    """Where the daemon puts its status socket."""
    env = os.environ if environ is None else environ
    runtime = env.get("RUNTIME_DIRECTORY", "").split(":")[0]
    return os.path.join(runtime if os.path.isabs(runtime) else state_dir, SOCKET_NAME)


class StatusSocket:
    def __init__(self, path: str, document: Callable[[], dict[str, Any]]) -> None:
        self.path = path
        self._document = document
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.problem: str | None = None
        self._limit = RateLimiter(1.0 / ANSWERS_PER_SECOND, ANSWERS_BURST)
        self.refused = 0  # connections answered "busy" for the rate limit

    def start(self) -> bool:
        """Bind and serve; False (logged, daemon unaffected) if the path cannot be used."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            return self._fail(exc.strerror or str(exc))
        else:
            if not stat.S_ISSOCK(st.st_mode):  # never remove what is not our old socket
                return self._fail("the path exists and is not a socket")
            with contextlib.suppress(OSError):
                os.unlink(self.path)  # the socket a previous run left
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            sock.bind(self.path)
            os.chmod(self.path, 0o666)  # any local user may ask, as over HTTP on localhost
            sock.listen(BACKLOG)  # accept() blocks: stop() shuts the socket down to end it
        except OSError as exc:
            sock.close()
            return self._fail(exc.strerror or str(exc))
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="status-socket", daemon=True)
        self._thread.start()
        return True

    def _fail(self, why: str) -> bool:
        self.problem = why
        log.error("status socket %s not available: %s", self.path, why)
        return False

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            with conn:
                wait = self._limit.allow(_peer_uid(conn))
                if wait > 0:
                    self.refused += 1
                    with contextlib.suppress(OSError):
                        conn.settimeout(SEND_TIMEOUT)
                        conn.sendall(b'{"busy": {"retry_after": %.2f}}' % min(wait, 1.0))
                    conn.close()
                    self._stop.wait(REFUSED_PAUSE)  # a flood waits in the backlog, not here
                    continue
                try:
                    data = json.dumps(self._document(), sort_keys=True).encode()
                    conn.settimeout(SEND_TIMEOUT)
                    conn.sendall(data)
                except Exception:  # one client (or one bad document) must not end the loop
                    log.debug("status socket: a request failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
            self._sock.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        if self._thread is not None:
            self._thread.join(2.0)


def _peer_uid(conn: socket.socket) -> str:
    """The uid of the process at the other end, as a rate-limit key."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except OSError:
        return "unknown"
    return str(struct.unpack("3i", creds)[1])
