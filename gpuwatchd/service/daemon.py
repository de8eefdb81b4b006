"""The daemon: a ``Node`` (see ``service.assembly``) driven by threads, plus the HTTP server.

``Daemon`` runs the node for ``run`` (wall clock) and ``demo`` (sped-up clock): one poll
worker per GPU and a scheduler (``Poller``), the kernel-log reader and the NVML XID event
reader (both in ``XidIntake``), the PCI watcher, the evaluator and the HTTP
server. The evaluator is the only thread that touches the rule engine: it runs once per
evaluation period (``rules.evaluation_interval``, or the poll interval when longer) and
at once when an urgent record arrives (an XID, a lost GPU, a sample whose change a rule
must judge now).
``simulate`` steps the same ``Node`` on a virtual clock without threads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuwatchd.config.web import WebGuard
from gpuwatchd.configfile.loader import Config
from gpuwatchd.core import memtrim, threadnames
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.families import Families
from gpuwatchd.core.heartbeat import HeartbeatRegistry
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import GpuInfo, GpuStatus
from gpuwatchd.core.reloading import Prepared, RestartOnly, SectionOwner, plan_reload
from gpuwatchd.core.statusdoc import ConfigState, StatusDocument
from gpuwatchd.exposition.httpd import HttpServer
from gpuwatchd.exposition.listener import RetryingListener, Startable
from gpuwatchd.exposition.statussock import StatusSocket, socket_path
from gpuwatchd.service.assembly import Node, Wiring
from gpuwatchd.service.handoff import Record
from gpuwatchd.sources.gpu.backend import Backend
from gpuwatchd.sources.gpu.pci import PciWatcher
from gpuwatchd.sources.gpu.poller import Poller

log = logging.getLogger(__name__)

BACKEND_RETRY_SECONDS = 30.0  # how often a backend that failed to open is tried again

HTTP_OWNER = RestartOnly(
    ("listen", "web"),
    "the HTTP server binds and loads its guards at start "
    "(the web config file it names is re-read when it changes)",
)


class LogOwner:
    """The owner of ``log_level`` (applied) and ``log_format`` (the handlers are set up
    once: a change is refused). ``set_level`` is the process's level setter; the CLI's
    ``run`` sets it, an in-process daemon (tests) leaves the process's logging alone."""

    sections = ("log_level", "log_format")

    def __init__(self) -> None:
        self.set_level: Callable[[str], None] | None = None

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        refused = {}
        if "log_format" in changed:
            refused["log_format"] = "the log handlers are set up at start"
        level = new.get("log_level")
        if "log_level" not in changed or self.set_level is None or level is None:
            return Prepared(refused=refused)
        set_level = self.set_level
        return Prepared(lambda: set_level(level), refused)


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
            _with_families(wiring or Wiring(), self._http_families, self._config_families),
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
        self._evaluating = False  # the evaluator is inside an evaluation
        self._idle_beats = 0  # the evaluator's liveness while it waits for work
        self._trim_due = threading.Event()  # a reload freed memory: trim after the next
        self.pci: PciWatcher | None = None  # NVIDIA GPUs on the PCI bus (nvml backend)
        self.heartbeats = HeartbeatRegistry(clock)  # worker liveness (watchdog, /healthz)
        # SIGHUP: each config key's owner applies it or refuses it (core.reloading)
        self.log_owner = LogOwner()
        self.owners: list[SectionOwner] = [*self.node.owners(), HTTP_OWNER, self.log_owner]
        self.after_reload: list[Callable[[Config], None]] = []  # run by `run` (log secrets)
        self.restart_required: dict[str, str] = {}  # key -> why: refused by the last reload
        self.last_reload: dict[str, Any] | None = None  # what the last reload did
        self.config_loader: Callable[[], Config] | None = None  # set by `run` (CLI overrides)

    @property
    def infos(self) -> list[GpuInfo]:
        return self.node.infos

    def _http_families(self, view: NodeView, fams: Families) -> None:
        if self.http is not None:
            self.http.families(fams)

    def _config_families(self, view: NodeView, fams: Families) -> None:
        """Whether each top-level key waits for a restart, and whether the last reload
        was taken (a refused key is never accepted silently)."""
        fam = fams.get(
            "gpuwatchd_config_restart_required",
            "gauge",
            "1 for a config key the file changed but the running daemon cannot apply: its "
            "running value stays until a restart (or until the file puts it back); the "
            "reason is in the log and in gpuwatchd status.",
            ["key"],
        )
        for key in _config_keys():
            fam.add([key], 1.0 if key in self.restart_required else 0.0)
        ok = self.last_reload is None or self.last_reload["result"] != "failed"
        fams.get(
            "gpuwatchd_config_last_reload_success",
            "gauge",
            "0 when the last reload (SIGHUP) was refused as a whole (a file or rule that "
            "does not load); 1 otherwise.",
            [],
        ).add([], 1.0 if ok else 0.0)

    def evaluation_period(self) -> float:
        """Seconds between periodic evaluations: the poll interval, or
        ``rules.evaluation_interval`` when longer."""
        return self.pipeline.period(self.config.poll.interval)

    def _evaluate_loop(self) -> None:
        """Evaluate once per evaluation period (half a poll interval after a poll) and at
        once when an urgent record arrives; the only thread that touches the rule
        engine."""
        wakeup = self.pipeline.handoff.wakeup
        next_tick = self.clock.monotonic() + self.config.poll.interval / 2
        while not self._stopped.is_set():
            remaining = next_tick - self.clock.monotonic()
            if remaining > 0 and not wakeup.is_set():
                self.clock.wait(wakeup, remaining)
            if self._stopped.is_set():
                return
            now_m = self.clock.monotonic()
            if now_m >= next_tick:  # periodic: keep the phase, skip ticks missed
                period = self.evaluation_period()
                next_tick += period * max(1, int((now_m - next_tick) // period) + 1)
            self._evaluating = True
            try:
                self.node.evaluate()
            except Exception:  # the evaluator must outlive one bad evaluation
                log.exception("rule evaluation failed")
            finally:
                self._evaluating = False
            self.evaluations += 1
            # the period can shrink with what the evaluation found (an XID alert active)
            next_tick = min(next_tick, now_m + self.evaluation_period())
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
                return HttpServer(
                    host, port, self.renderer, self.health, self.status_document, guard
                )

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
        self._watch_evaluator()
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
        self.xids.start_events(self.heartbeats, self.config.poll.call_timeout)
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

    def _evaluator_progress(self) -> int:
        """The evaluator's liveness for the watchdog: it moves while the evaluator waits
        for its next tick or an urgent record (a wait always ends), and stands still
        inside an evaluation, so one that never returns is caught within three poll
        intervals whatever the evaluation period."""
        if self._evaluating:
            return -1 - self.evaluations
        self._idle_beats += 1
        return self._idle_beats

    def _watch_evaluator(self) -> None:
        """Register the evaluator with the liveness registry."""
        self.heartbeats.watch(
            "evaluator", self._evaluator_progress, 3 * self.config.poll.interval + 1.0
        )

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
        """Re-read the config file (SIGHUP); True when the new config is taken (perhaps
        with some keys refused).

        A config that does not load, or a section an owner finds unusable (a rule file,
        a receiver secret), leaves everything as it was and logs each problem as
        ``PATH:LINE:COL: message``. Otherwise every changed top-level key is applied by
        its owner or refused: a refused key keeps its running value and is reported as
        an error line, by ``gpuwatchd_config_restart_required{key}`` and in ``status``.
        """
        from gpuwatchd.configfile.loader import load_config

        old = self.config
        at = self.clock.now()
        try:
            if self.config_loader is not None:
                new = self.config_loader()
            else:
                new = load_config(old.source, must_exist=old.source is not None)
            plan = plan_reload(self.owners, _sections(old), _sections(new))
        except ConfigError as exc:
            for line in exc.lines():
                log.error("%s", line)
            log.error("reload failed: keeping the running configuration")
            self.last_reload = {"at": at, "result": "failed", "problems": exc.lines()}
            return False
        for key, why in plan.refused.items():
            log.error(
                "reload: %s changed but is not applied (%s); the running value stays "
                "until a restart",
                key,
                why,
            )
        kept = {k: getattr(old, k) for k in plan.refused}
        self.config = dataclasses.replace(new, **kept)
        for apply in plan.applies:
            apply()
        for after in self.after_reload:
            after(self.config)
        self.restart_required = dict(plan.refused)
        result = "partly" if plan.refused else "applied"
        self.last_reload = {"at": at, "result": result, "refused": dict(plan.refused)}
        log.info(
            "reloaded configuration from %s%s",
            new.source or "built-in defaults",
            f" (not applied: {', '.join(plan.refused)})" if plan.refused else "",
        )
        self._trim_due.set()
        return True

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self.pipeline.handoff.wake()  # the evaluator leaves its wait
        if self.poller is not None:
            self.poller.stop()
        if self.http is not None:
            self.http.stop()
        if self.status_socket is not None:
            self.status_socket.stop()
        self.xids.stop()
        if self.pci is not None:
            self.pci.stop()
        if self._eval_thread is not None:
            self._eval_thread.join(2.0)
            if not self._eval_thread.is_alive():
                self._last_look()
        for hook in self.on_stop:
            hook()
        self.node.close()
        self.xids.join_events()  # the closed backend ended its wait

    def _last_look(self) -> None:
        """Judge what reached the hand-off after the evaluator's last turn: records that
        came while it was busy, and the first sightings the XID merger held, which
        ``xids.stop`` lets go. Without this look they were dropped with the process (the
        kernel-log position was already past them): an XID at the stop never paged, and
        the newest XID episodes were missing after a restart."""
        if not self.pipeline.handoff.pending():
            return
        try:
            self.node.evaluate()
        except Exception:  # the stop goes on: the state is still closed properly
            log.exception("the last evaluation before the stop failed")

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

    def status_document(self) -> StatusDocument:
        """The node's status document with the daemon's config part."""
        config = ConfigState(
            file=self.config.source,
            last_reload=self.last_reload,
            restart_required=dict(self.restart_required),
        )
        return self.node.status_document().with_config(config)

    def status(self) -> dict[str, Any]:
        return self.status_document().as_json()

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)


def _with_families(wiring: Wiring, *extra: Callable[[NodeView, Families], None]) -> Wiring:
    return dataclasses.replace(wiring, extra_families=(*wiring.extra_families, *extra))


def _config_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(Config) if not f.metadata.get("internal")]


def _sections(config: Config) -> dict[str, Any]:
    """The config as top-level key -> section value, as reload diffs it."""
    return {key: getattr(config, key) for key in _config_keys()}
