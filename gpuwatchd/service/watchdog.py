"""The systemd side of ``gpuwatchd run``: readiness, status line, watchdog, reload, stop.

``Supervisor`` is driven by the daemon's *main loop* (``cmd_run``), never by a timer
thread of its own: a ping from an independent thread would keep a wedged daemon alive.
On every ``tick()`` it asks the ``HeartbeatRegistry`` whether every worker (poll
scheduler, rule evaluator, NVML event reader, log sources, delivery workers) made
progress, and sends ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC`` only when all did. When
one is stuck it stops pinging, says why in ``STATUS=`` and in the log, and systemd kills
and restarts the daemon after ``WatchdogSec=``.

Deliberately *not* a watchdog failure: a GPU whose NVML calls hang. The poll scheduler
marks it stale and keeps running (that is a GPU health event for Prometheus and the
rules); restarting the daemon would only hide it.

Message order: ``READY=1`` once the first poll of every GPU has completed (or timed
out); ``RELOADING=1`` + ``MONOTONIC_USEC=`` ... ``READY=1`` around a SIGHUP reload;
``STOPPING=1`` on SIGTERM before the shutdown begins.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuwatchd.core.heartbeat import HeartbeatRegistry, Stall
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuStatus
from gpuwatchd.service.sdnotify import Notifier, watchdog_usec

if TYPE_CHECKING:
    from gpuwatchd.service.daemon import Daemon

log = logging.getLogger(__name__)

__all__ = ["SignalInbox", "Supervisor", "serve", "status_line"]

STATUS_REFRESH = 5.0  # seconds between STATUS= updates when nothing else changed
MAX_TICK = 5.0  # the main loop checks liveness at least this often (heartbeats allow >= 30 s)
STALL_TICK = 1.0  # ... and this often while a worker is stalled


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.0f}h"


def status_line(
    view: NodeView, now: float, *, alerts_firing: int | None, backend_note: str | None = None
) -> str:
    """One line for ``systemctl status``: "8 GPUs ok; 0 alerts firing; last poll 2s ago"."""
    if backend_note is not None:
        return f"GPU backend unavailable: {backend_note}"
    parts: list[str] = []
    counts: dict[str, int] = {}
    for g in view.gpus:
        counts[g.status.value] = counts.get(g.status.value, 0) + 1
    n = len(view.gpus)
    noun = "GPU" if n == 1 else "GPUs"
    if counts.get(GpuStatus.OK.value, 0) == n:
        parts.append(f"{n} {noun} ok")
    else:
        detail = ", ".join(f"{c} {s}" for s, c in sorted(counts.items()))
        parts.append(f"{n} {noun}: {detail}")
    if view.expected_gpus is not None and view.expected_gpus != n:
        parts[-1] += f" (expected {view.expected_gpus})"
    if alerts_firing is not None:
        parts.append(f"{alerts_firing} alert{'' if alerts_firing == 1 else 's'} firing")
    last = max((g.last_success for g in view.gpus if g.last_success is not None), default=None)
    parts.append("no poll yet" if last is None else f"last poll {_age(max(0.0, now - last))} ago")
    return "; ".join(parts)


class Supervisor:
    """Talks to systemd on behalf of the main loop. Without systemd it only logs stalls."""

    def __init__(
        self,
        notifier: Notifier,
        heartbeats: HeartbeatRegistry,
        summary: Callable[[], str],
        *,
        watchdog_usec: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        status_refresh: float = STATUS_REFRESH,
    ) -> None:
        self.notifier = notifier
        self.heartbeats = heartbeats
        self.summary = summary
        self.ping_interval = watchdog_usec / 2_000_000 if watchdog_usec else None
        self._monotonic = monotonic
        self._status_refresh = status_refresh
        self._next_ping = 0.0
        self._last_status = ""
        self._last_status_at = -1e9
        self._stalled: tuple[str, ...] = ()
        self.pings = 0
        self.withheld = 0

    @classmethod
    def for_daemon(
        cls, daemon: Daemon, notifier: Notifier, environ: dict[str, str] | None = None
    ) -> Supervisor:
        """Wire a supervisor to a ``Daemon``: its heartbeats, its state, its alerts.

        ``environ`` supplies ``$WATCHDOG_USEC`` (read it before ``Notifier.from_environ(
        unset=True)`` removes it).
        """

        def summary() -> str:
            note = None
            if daemon.poller is None:
                nvml = daemon.state.view().sources.get("nvml")
                note = nvml.detail if nvml is not None and nvml.detail else "not open"
            return status_line(
                daemon.state.view(),
                daemon.clock.now(),
                alerts_firing=len(daemon.node.firing()),
                backend_note=note,
            )

        return cls(
            notifier,
            daemon.heartbeats,
            summary,
            watchdog_usec=watchdog_usec(os.environ if environ is None else environ),
        )

    # -- lifecycle messages -------------------------------------------------------------
    def ready(self) -> None:
        text = self.summary()
        self.notifier.ready(text)
        self._status_sent(text)
        self._next_ping = self._monotonic()  # the watchdog runs from now on: ping at once

    def reloading(self) -> None:
        self.notifier.reloading("reloading configuration")

    def reloaded(self, ok: bool) -> None:
        text = self.summary() + ("" if ok else "; last reload FAILED, old config kept")
        self.notifier.ready(text)
        self._status_sent(text)

    def stopping(self) -> None:
        self.notifier.stopping("stopping")

    # -- the main loop's call -----------------------------------------------------------
    def tick(self) -> float:
        """Check liveness, ping or withhold, refresh STATUS; seconds until the next tick."""
        now = self._monotonic()
        stalls = self.heartbeats.check()
        if stalls:
            self._on_stall(stalls)
            return STALL_TICK  # look again soon: pings resume the moment the stall ends
        if self._stalled:
            log.warning("watchdog: every worker is making progress again")
            self._stalled = ()
        text = self.summary()
        if self.ping_interval is not None and now >= self._next_ping:
            self.notifier.watchdog(text if self._status_due(text, now) else None)
            if self._status_due(text, now):
                self._status_sent(text)
            self.pings += 1
            self._next_ping = now + self.ping_interval
        elif self._status_due(text, now):
            self.notifier.status(text)
            self._status_sent(text)
        wait = MAX_TICK
        if self.ping_interval is not None:
            wait = min(wait, max(0.01, self._next_ping - now))
        return wait

    def _on_stall(self, stalls: list[Stall]) -> None:
        names = tuple(s.name for s in stalls)
        what = "; ".join(str(s) for s in stalls)
        self.withheld += 1
        if names != self._stalled:
            self._stalled = names
            log.error(
                "watchdog: %s: withholding WATCHDOG=1 (systemd restarts the daemon after "
                "WatchdogSec)",
                what,
            )
        text = f"STALLED: {what}"
        if text != self._last_status:
            self.notifier.status(text)
            self._status_sent(text)

    def _status_due(self, text: str, now: float) -> bool:
        if text == self._last_status:
            return False
        changed_shape = _shape(text) != _shape(self._last_status)
        return changed_shape or now - self._last_status_at >= self._status_refresh

    def _status_sent(self, text: str) -> None:
        self._last_status = text
        self._last_status_at = self._monotonic()


def _shape(text: str) -> str:
    """The status line without the poll age, which changes every second."""
    head, sep, _ = text.rpartition("last poll ")
    return head if sep else text


class SignalInbox:
    """SIGTERM, SIGINT and SIGHUP, recorded by trivial handlers and read by the main loop.

    A self-pipe (``signal.set_wakeup_fd``) wakes ``wait()``, so no lock is ever taken
    inside a handler. Use as a context manager around the daemon's life.
    """

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._fds: tuple[int, int] | None = None
        self._old_fd = -1
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalInbox:
        rfd, wfd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fds = (rfd, wfd)
        self._old_fd = signal.set_wakeup_fd(wfd, warn_on_full_buffer=False)
        self._previous = {s: signal.signal(s, self._on_signal) for s in self.HANDLED}
        return self

    def __exit__(self, *exc: object) -> None:
        signal.set_wakeup_fd(self._old_fd)
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        if self._fds is not None:
            for fd in self._fds:
                os.close(fd)
            self._fds = None

    def _on_signal(self, signum: int, frame: object) -> None:
        self.pending.append(signum)

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, less if a signal arrives."""
        assert self._fds is not None, "use SignalInbox as a context manager"
        rfd = self._fds[0]
        readable, _, _ = select.select([rfd], [], [], timeout)
        if readable:
            try:
                while os.read(rfd, 512):
                    pass
            except BlockingIOError:
                pass


def serve(supervisor: Supervisor, reload: Callable[[], bool], signals: SignalInbox) -> str:
    """The daemon's main loop: tick the supervisor, reload on SIGHUP, return on SIGTERM.

    Returns the name of the signal that stopped it, after sending ``STOPPING=1``.
    """
    while True:
        while signals.pending:
            signum = signals.pending.pop(0)
            name = signal.Signals(signum).name
            if signum == signal.SIGHUP:
                log.info("received SIGHUP, reloading")
                supervisor.reloading()
                supervisor.reloaded(reload())
                continue
            log.info("received %s, stopping", name)
            supervisor.stopping()
            return name
        signals.wait(supervisor.tick())
