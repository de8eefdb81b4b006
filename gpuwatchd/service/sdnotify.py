"""A small sd_notify(3) client: one datagram per message to ``$NOTIFY_SOCKET``.

systemd starts a ``Type=notify`` service with ``$NOTIFY_SOCKET`` naming an AF_UNIX datagram
socket (a path, or a Linux abstract name written with a leading ``@``). A message is a few
``KEY=VALUE`` lines in one datagram: ``READY=1``, ``STATUS=...``, ``WATCHDOG=1``,
``RELOADING=1`` with ``MONOTONIC_USEC=...``, ``STOPPING=1``. No libsystemd or
python-systemd is needed. Without ``$NOTIFY_SOCKET`` (a shell, a container, a test) every
call is a no-op that returns ``False``.

``Notifier.from_environ(unset=True)`` also removes ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and
``WATCHDOG_PID`` from ``os.environ`` so that child processes (drain hooks) do not inherit
them, as ``sd_notify(unset_environment=1, ...)`` does.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, MutableMapping

log = logging.getLogger(__name__)

__all__ = ["Notifier", "monotonic_usec", "watchdog_usec"]

_ENV_KEYS = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock ``MONOTONIC_USEC=`` is read against."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def watchdog_usec(environ: Mapping[str, str], pid: int | None = None) -> int | None:
    """The watchdog timeout systemd asked for, or ``None`` when there is none for us.

    Like sd_watchdog_enabled(3): ``$WATCHDOG_USEC`` must be a positive integer and
    ``$WATCHDOG_PID``, when set, must be this process.
    """
    raw = environ.get("WATCHDOG_USEC", "")
    if not raw.isdigit() or int(raw) <= 0:
        return None
    owner = environ.get("WATCHDOG_PID", "")
    if owner and (not owner.isdigit() or int(owner) != (os.getpid() if pid is None else pid)):
        return None
    return int(raw)


def _address(text: str) -> str | None:
    if text.startswith("@") and len(text) > 1:
        return "\0" + text[1:]
    if text.startswith("/"):
        return text
    return None  # e.g. vsock: addresses (systemd >= 254): not supported here


class Notifier:
    """Sends sd_notify messages; every method returns whether a datagram went out."""

    def __init__(self, address: str | None) -> None:
        self.address = address  # as written in $NOTIFY_SOCKET
        self._target = _address(address) if address else None
        if address and self._target is None:
            log.warning("NOTIFY_SOCKET=%r is not a socket path or @name: not notifying", address)
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed = False
        self.sent = 0

    @classmethod
    def from_environ(
        cls, environ: MutableMapping[str, str] | None = None, *, unset: bool = False
    ) -> Notifier:
        env = os.environ if environ is None else environ
        notifier = cls(env.get("NOTIFY_SOCKET") or None)
        if unset:
            for key in _ENV_KEYS:
                env.pop(key, None)
        return notifier

    @property
    def enabled(self) -> bool:
        return self._target is not None

    def notify(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` assignments as one datagram."""
        if self._target is None:
            return False
        for a in assignments:
            if "=" not in a or "\n" in a:
                raise ValueError(f"not a single KEY=VALUE assignment: {a!r}")
        payload = "\n".join(assignments).encode("utf-8")
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(
                        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    )
                self._sock.sendto(payload, self._target)
            except OSError as exc:
                if not self._failed:  # say it once; the service manager may be restarting
                    log.warning("sd_notify to %s failed: %s", self.address, exc)
                    self._failed = True
                return False
            self._failed = False
            self.sent += 1
            return True

    # -- the messages gpuwatchd sends ---------------------------------------------------
    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={_one_line(text)}")

    def watchdog(self, status: str | None = None) -> bool:
        return self.notify("WATCHDOG=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def reloading(self, status: str | None = None) -> bool:
        return self.notify(
            "RELOADING=1",
            f"MONOTONIC_USEC={monotonic_usec()}",
            *([f"STATUS={_one_line(status)}"] if status else []),
        )

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *([f"STATUS={_one_line(status)}"] if status else []))

    def extend_timeout(self, seconds: float) -> bool:
        return self.notify(f"EXTEND_TIMEOUT_USEC={max(1, round(seconds * 1_000_000))}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


def _one_line(text: str) -> str:
    """STATUS= is a single line: newlines become spaces, length is bounded."""
    flat = " ".join(text.split())
    return flat if len(flat) <= 500 else flat[:497] + "..."
