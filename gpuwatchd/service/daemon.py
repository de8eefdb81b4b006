"""The daemon: a ``Node`` (see ``service.assembly``) driven by threads, plus the HTTP server.

``Daemon`` runs the node for ``run`` (wall clock) and ``demo`` (sped-up clock): one poll
worker per GPU and a scheduler (``Poller``), the kernel-log reader and the NVML XID event
reader (``XidInputs``, ``XidEventReader``), the PCI watcher, the evaluator and the HTTP
server. The evaluator is the only thread that touches the rule engine: it runs once per
poll interval and at once when an urgent record (an XID, a lost GPU) arrives.
``simulate`` steps the same ``Node`` on a virtual clock without threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuwatchd.config.loader import Config
from gpuwatchd.config.web import WebGuard
from gpuwatchd.core import memtrim, threadnames
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.families import Families
from gpuwatchd.core.heartbeat import HeartbeatRegistry
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuInfo, GpuStatus
from gpuwatchd.exposition.httpd import HttpServer
from gpuwatchd.exposition.listener import RetryingListener, Startable
from gpuwatchd.exposition.statussock import StatusSocket, socket_path
from gpuwatchd.rules.stage import RulesStage
from gpuwatchd.service.assembly import Node, Wiring
from gpuwatchd.service.handoff import Record
from gpuwatchd.sources.gpu.backend import Backend
from gpuwatchd.sources.gpu.pci import PciWatcher
from gpuwatchd.sources.gpu.poller import Poller

log = logging.getLogger(__name__)

BACKEND_RETRY_SECONDS = 30.0  # how often a backend that failed to open is tried again

ReloadHook = Callable[[Config], Callable[[], None] | None]
"""Called by ``Daemon.reload`` with the new config: load and validate everything it needs
(rule files, receivers), raising ``ConfigError`` to reject the reload; return a function
that swaps it in (called only when every hook succeeded), or ``None``."""

RESTART_ONLY = (
    "node_name",
    "listen",
    "backend",
    "state_dir",
    "poll",
    "gpus",
    "metrics",
    "fields",  # extra NVML field ids: the backend builds its poll batches at start-up
    "web",  # the web config *file* is re-read when it changes; the key takes a restart
    "sources",  # the kernel-log reader and the NVML event reader start once
    "log_format",  # the log handlers are set up once (log_level reloads)
)
"""Config keys a reload does not change (the running value stays until a restart)."""


class Daemon:
    def __init__(
        self,
        config: Config,
        backend: Backend,
        clock: Clock,
        *,
        wiring: Wiring | None = None,
        emit: Callable[[Record], None] | None = None,
        listen: tuple[str, int] | None = None,
        serve_http: bool = True,
    ) -> None:
        self.config = config
        self.backend = backend
        self.clock = clock
        self.node = Node(
            config,
            clock,
            backend,
            _with_families(wiring or Wiring(), self._http_families),
        )
        if emit is not None:
            self.node.listeners.append(emit)
        self.state = self.node.state
        self.pipeline = self.node.pipeline
        self.xids = self.node.xids
        self.renderer = self.node.renderer
        self._listen = listen or (config.listen.host, config.listen.port)
        self._serve_http = serve_http
        self.http: HttpServer | None = None
        self.listener: RetryingListener | None = None
        self.status_socket: StatusSocket | None = None
        self.poller: Poller | None = None
        self._stopped = threading.Event()
        self.on_stop: list[Callable[[], None]] = []
        self._eval_thread: threading.Thread | None = None
        self.evaluations = 0
        self._trim_due = threading.Event()  # a reload freed memory: trim after the next
        self.pci: PciWatcher | None = None  # NVIDIA GPUs on the PCI bus (nvml backend)
        self.heartbeats = HeartbeatRegistry(clock)  # worker liveness (watchdog, /healthz)
        self.reload_hooks: list[ReloadHook] = []
        if isinstance(self.node.rules, RulesStage):  # SIGHUP: validated, then swapped in
            self.reload_hooks.append(self.node.rules.reload_hook)
        if self.node.wiring.record is None:  # receivers, routing, drain (or a refusal)
            self.reload_hooks.append(self._reload_actions)
        self.config_loader: Callable[[], Config] | None = None  # set by `run` (CLI overrides)

    def _reload_actions(self, new: Config) -> Callable[[], None]:
        from gpuwatchd.actions.reload import prepare_reload

        return prepare_reload(self.node.actions, new, environ=self.node.wiring.environ)

    @property
    def infos(self) -> list[GpuInfo]:
        return self.node.infos

    def _http_families(self, view: NodeView, fams: Families) -> None:
        if self.http is not None:
            self.http.families(fams)

    def _evaluate_loop(self) -> None:
        """Evaluate once per poll interval (half an interval after each poll) and at once
        when an urgent record arrives; the only thread that touches the rule engine."""
        interval = self.config.poll.interval
        wakeup = self.pipeline.handoff.wakeup
        next_tick = self.clock.monotonic() + interval / 2
        while not self._stopped.is_set():
            remaining = next_tick - self.clock.monotonic()
            if remaining > 0 and not wakeup.is_set():
                self.clock.wait(wakeup, remaining)
            if self._stopped.is_set():
                return
            now_m = self.clock.monotonic()
            if now_m >= next_tick:  # periodic: keep the phase, skip ticks missed
                next_tick += interval * max(1, int((now_m - next_tick) // interval) + 1)
            try:
                self.node.evaluate()
            except Exception:  # the evaluator must outlive one bad evaluation
                log.exception("rule evaluation failed")
            self.evaluations += 1
            if self.evaluations == 1 or self._trim_due.is_set():
                self._trim_due.clear()
                memtrim.trim()  # start-up's (or a reload's) freed memory back to the kernel

    # -- lifecycle -------------------------------------------------------------------
    def open_backend(self) -> None:
        """Open the backend; a failure leaves the nvml source down (and is retried)."""
        if self.node.open_gpus():
            self.poller = self.node.poller(self.config.poll.interval, self.config.poll.call_timeout)

    def start(self) -> None:
        listener: RetryingListener | None = None
        if self._serve_http:
            host, port = self._listen
            web = self.config.web
            guard = WebGuard(  # ConfigError if the web config file no longer loads
                web.config_file,
                rate_interval=1.0 / web.rate_limit if web.rate_limit > 0 else 0.0,
                rate_burst=web.rate_burst,
                max_request_bytes=web.max_request_bytes,
            )

            def make() -> HttpServer:
                return HttpServer(host, port, self.renderer, self.health, self.status, guard)

            # a port someone else holds must not stop monitoring: bound later, retried
            listener = self.listener = RetryingListener(
                make, self._http_up, self._stopped, where=f"{host}:{port}"
            )
        self.open_backend()
        if self.config.backend.kind == "nvml":  # the PCI bus cross-checks NVML's GPU count
            self.pci = PciWatcher(self.node.set_pci_gpus, on_status=self.node.source_status)
            self.pci.start()
        if self.node.actions is not None and self.node.wiring.threaded:
            self.node.actions.start()  # sender, scheduler and drain threads
        self.xids.start(self.heartbeats)
        # Rules run even without GPUs: a node whose NVML is gone must still page.
        self._eval_thread = threading.Thread(
            target=self._evaluate_loop, name="evaluate", daemon=True
        )
        self._eval_thread.start()
        self.heartbeats.watch(
            "evaluator", lambda: self.evaluations, 3 * self.config.poll.interval + 1.0
        )
        if self.poller is not None:
            self._start_polling()
        else:
            threading.Thread(target=self._reopen_loop, name="backend-retry", daemon=True).start()
        if listener is not None:
            listener.start()
            self.status_socket = StatusSocket(
                socket_path(self.config.state_dir), self._status_document
            )
            self.status_socket.start()
        threadnames.publish()

    def _http_up(self, server: Startable) -> None:
        assert isinstance(server, HttpServer)
        self.http = server
        server.start()
        threadnames.publish()
        log.info("serving on %s", server.url)

    def _status_document(self) -> dict[str, Any]:
        """What ``gpuwatchd status`` reads over the status socket."""
        ok, detail = self.health()
        http = self.listener.describe() if self.listener is not None else {"listening": False}
        return {"status": self.status(), "health": {"ok": ok, "detail": detail}, "http": http}

    def _start_polling(self) -> None:
        assert self.poller is not None
        self.poller.start()
        self._watch_workers()
        events = self.node.events
        if events is not None:
            poll = self.config.poll
            events.heartbeat = self.heartbeats.register(
                "nvml-events", 3 * max(poll.interval, events.wait_s) + poll.call_timeout + 1
            )
            events.start()
        threadnames.publish()

    def _reopen_loop(self) -> None:
        """The backend failed to open (no driver yet, driver upgrade): try again until it
        works, then start polling. Everything else keeps running meanwhile."""
        while not self._stopped.is_set():
            if self.clock.wait(self._stopped, BACKEND_RETRY_SECONDS):
                return
            self.open_backend()
            if self.poller is not None:
                log.info("GPU backend %s opened after a retry", self.backend.name)
                self._start_polling()
                return

    def _watch_workers(self) -> None:
        """Register the poll scheduler with the liveness registry."""
        assert self.poller is not None
        poller = self.poller
        limit = 3 * self.config.poll.interval + 1.0  # as in health()
        self.heartbeats.watch("poller", lambda: poller.cycles, limit)

    def wait_started(self, timeout: float) -> bool:
        """Wait until every GPU has answered its first poll or been marked not OK."""
        deadline = self.clock.monotonic() + timeout
        while self.poller is not None:
            view = self.state.view()
            if all(g.polls > 0 or g.status is not GpuStatus.OK for g in view.gpus):
                return True
            if self.clock.monotonic() >= deadline or self.clock.wait(self._stopped, 0.02):
                return False
        return True

    def reload(self) -> bool:
        """Re-read the config file (SIGHUP); True when the new config is in effect.

        A config that does not load leaves everything as it was and logs each problem as
        ``PATH:LINE:COL: message``. Keys in ``RESTART_ONLY`` keep their running values
        (a warning names any that changed). Components that can change live (rule files,
        receivers, the log level) add a ``ReloadHook`` to ``reload_hooks``.
        """
        import dataclasses

        from gpuwatchd.config.loader import load_config

        old = self.config
        try:
            if self.config_loader is not None:
                new = self.config_loader()
            else:
                new = load_config(old.source, must_exist=old.source is not None)
            commits = [hook(new) for hook in self.reload_hooks]
        except ConfigError as exc:
            for line in exc.lines():
                log.error("%s", line)
            log.error("reload failed: keeping the running configuration")
            return False
        kept = {k: getattr(old, k) for k in RESTART_ONLY}
        changed = [k for k, v in kept.items() if getattr(new, k) != v]
        if changed:
            log.warning("reload: %s changed; takes effect after a restart", ", ".join(changed))
        self.config = dataclasses.replace(new, **kept)
        for commit in commits:
            if commit is not None:
                commit()
        log.info("reloaded configuration from %s", new.source or "built-in defaults")
        self._trim_due.set()
        return True

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.pipeline.handoff.wake()  # the evaluator leaves its wait
        if self.poller is not None:
            self.poller.stop()
        if self.node.events is not None:
            self.node.events.stop(wait=False)  # joined once the backend is closed
        if self.http is not None:
            self.http.stop()
        if self.status_socket is not None:
            self.status_socket.stop()
        self.xids.stop()
        if self.pci is not None:
            self.pci.stop()
        if self._eval_thread is not None:
            self._eval_thread.join(2.0)
        for hook in self.on_stop:
            hook()
        self.node.close()
        if self.node.events is not None:
            self.node.events.stop()

    # -- health and status -----------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """OK while every worker (poll scheduler, evaluator, readers) makes progress; says
        why not otherwise."""
        if self.poller is None:
            nvml = self.state.view().sources.get("nvml")
            return False, f"GPU backend not open: {nvml.detail if nvml else 'starting'}"
        stalls = self.heartbeats.check()  # the poll scheduler is one of the watched workers
        if stalls:
            return False, "; ".join(str(s) for s in stalls)
        view = self.state.view()
        bad = [
            f"{g.info.index}:{g.status.value}" for g in view.gpus if g.status is not GpuStatus.OK
        ]
        if bad:
            return True, "ok (daemon healthy; GPUs not answering: " + ", ".join(bad) + ")"
        return True, "ok"

    def status(self) -> dict[str, Any]:
        return self.node.status()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def _with_families(wiring: Wiring, extra: Callable[[NodeView, Families], None]) -> Wiring:
    import dataclasses

    return dataclasses.replace(wiring, extra_families=(*wiring.extra_families, extra))
