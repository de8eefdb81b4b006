"""Bind the HTTP server, and keep trying when the port is taken: never stop monitoring.

Anyone can bind the listen port while the daemon is down (a restart, an upgrade). Exiting
then would put the daemon in a restart loop and stop monitoring, paging and draining for
as long as the squatter holds the port. ``RetryingListener`` instead logs the problem,
reports it (``problem``, shown by ``gpuwatchd status`` over the status socket), and tries
to bind again every ``RETRY_SECONDS`` until it works or the daemon stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

RETRY_SECONDS = 10.0


class Startable(Protocol):
    @property
    def url(self) -> str: ...

    def start(self) -> None: ...


class RetryingListener:
    """``make()`` binds a server (``OSError`` when it cannot); ``on_up`` receives it."""

    def __init__(
        self,
        make: Callable[[], Startable],
        on_up: Callable[[Startable], None],
        stop: threading.Event,
        *,
        retry_every: float = RETRY_SECONDS,
        where: str = "",
    ) -> None:
        self._make = make
        self._on_up = on_up
        self._stop = stop
        self.retry_every = retry_every
        self.where = where
        self.problem: str | None = None  # why the server is not listening; None when it is
        self.attempts = 0
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Bind now if possible (True); else retry in the background (False)."""
        if self._try():
            return True
        log.error(
            "cannot listen on %s: %s; monitoring, paging and draining go on, /metrics and "
            "/healthz are unavailable; retrying every %gs",
            self.where,
            self.problem,
            self.retry_every,
        )
        self._thread = threading.Thread(target=self._retry, name="http-listen", daemon=True)
        self._thread.start()
        return False

    def _try(self) -> bool:
        self.attempts += 1
        try:
            server = self._make()
        except OSError as exc:
            self.problem = exc.strerror or str(exc)
            return False
        self.problem = None
        self._on_up(server)
        return True

    def _retry(self) -> None:
        while not self._stop.wait(self.retry_every):
            if self._try():
                log.warning("listening on %s again after %d attempts", self.where, self.attempts)
                return

    def describe(self) -> dict[str, object]:
        return {"listening": self.problem is None, "problem": self.problem, "where": self.where}
