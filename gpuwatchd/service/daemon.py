"""Wires sources, state and endpoints into the running daemon.

``Daemon`` owns one backend, the ``NodeState``, the ``Poller`` and the HTTP server. It is
used by ``run`` (wall clock), ``demo`` (sped-up clock) and the tests; ``simulate`` uses the
same pieces on a virtual clock without threads (see ``simulate.py``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from gpuwatchd import __version__
from gpuwatchd.config.loader import Config
from gpuwatchd.config.web import WebGuard
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendError, ConfigError
from gpuwatchd.core.families import Families
from gpuwatchd.core.fields import decode_clock_event_reasons
from gpuwatchd.core.heartbeat import HeartbeatRegistry
from gpuwatchd.core.nodestate import GpuState, NodeState, NodeView
from gpuwatchd.core.records import GpuInfo, GpuStatus, XidEvent
from gpuwatchd.core.statehealth import StoreHealth, state_families
from gpuwatchd.exposition.httpd import HttpServer
from gpuwatchd.exposition.metrics import MetricsRenderer
from gpuwatchd.rules.stage import SIMULATE_BOOT_ID
from gpuwatchd.service.pipeline import Pipeline
from gpuwatchd.sources.gpu.backend import Backend
from gpuwatchd.sources.gpu.pci import PciWatcher
from gpuwatchd.sources.gpu.poller import Emit, Poller, Record
from gpuwatchd.sources.xid_inputs import XidInputs

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
    "web",  # the web config *file* is re-read when it changes; the key takes a restart
)
"""Config keys a reload does not change (the running value stays until a restart)."""

STATUS_FIELDS = (
    "temperature_gpu",
    "temperature_memory",
    "power",
    "sm_clock",
    "utilization_gpu",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "pcie_replay",
    "pcie_link_generation",
    "pcie_link_width",
    "compute_processes",
    "recovery_action",
)


def filter_ignored(infos: list[GpuInfo], ignore: tuple[str, ...]) -> list[GpuInfo]:
    skip = {s.upper() for s in ignore}
    return [i for i in infos if i.uuid.upper() not in skip and i.pci_bus_id.upper() not in skip]


def gpu_status_dict(g: GpuState) -> dict[str, Any]:
    out: dict[str, Any] = {
        **g.info.as_dict(),
        "status": g.status.value,
        "status_since": g.status_since,
        "last_success": g.last_success,
    }
    if g.sample is not None:
        fields = g.sample.fields
        out["readings"] = {k: fields[k] for k in STATUS_FIELDS if k in fields}
        mask = fields.get("clock_event_reasons")
        if mask is not None:
            out["clock_event_reasons"] = decode_clock_event_reasons(int(mask))
        down = [ls.link for ls in g.sample.links if ls.fields.get("nvlink_up") == 0.0]
        out["nvlink_links_down"] = down
    if g.sample is not None and g.status is not GpuStatus.OK:
        out["error"] = "readings are from the last successful poll"
    return out


class Daemon:
    def __init__(
        self,
        config: Config,
        backend: Backend,
        clock: Clock,
        *,
        emit: Emit | None = None,
        listen: tuple[str, int] | None = None,
        serve_http: bool = True,
        pipeline: Pipeline | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.clock = clock
        self.pipeline = pipeline or Pipeline()
        self._user_emit = emit
        self.emit: Emit = self._record
        self.state = NodeState(config.node_name, clock.now(), config.gpus.expected)
        self.renderer = MetricsRenderer.for_config(
            self.state.view,
            config.metrics,
            (self.pipeline.families, self._xid_families, self._http_families),
        )
        self.xids = XidInputs(config, backend, clock, self._xid, self._source_status)
        self._listen = listen or (config.listen.host, config.listen.port)
        self._serve_http = serve_http
        self.http: HttpServer | None = None
        self.poller: Poller | None = None
        self.infos: list[GpuInfo] = []
        self._stopped = threading.Event()
        self.on_stop: list[Callable[[], None]] = []
        self._events_thread: threading.Thread | None = None
        self._eval_thread: threading.Thread | None = None
        self.evaluations = 0
        self.pci: PciWatcher | None = None  # NVIDIA GPUs on the PCI bus (nvml backend)
        self.heartbeats = HeartbeatRegistry(clock)  # worker liveness (watchdog, /healthz)
        self.reload_hooks: list[ReloadHook] = []
        self.config_loader: Callable[[], Config] | None = None  # set by `run` (CLI overrides)

    def _source_status(self, name: str, up: bool, detail: str) -> None:
        self.state.source(name, up=up, now=self.clock.now(), detail=detail)

    def _xid_families(self, view: NodeView, fams: Families) -> None:
        self.xids.families(fams)

    def _http_families(self, view: NodeView, fams: Families) -> None:
        if self.http is not None:
            self.http.families(fams)
        state_families(fams, self.state_health())

    def state_health(self) -> list[StoreHealth]:
        """The rule engine's store and the kernel-log position (the outbox reports its own)."""
        out = []
        for stage in self.pipeline.stages:
            store = getattr(getattr(stage, "engine", None), "store", None)
            if store is None or not hasattr(store, "errors"):
                continue
            if getattr(store, "boot_id", None) == SIMULATE_BOOT_ID:
                continue  # in memory on purpose (demo)
            durable = not getattr(store, "memory", False) and getattr(store, "write_ok", True)
            out.append(StoreHealth("rules", bool(durable), int(store.errors)))
        position = self.xids.state_health()
        if position is not None:
            out.append(position)
        return out

    def _xid(self, event: XidEvent) -> None:
        """A merged, trusted XID incident from the kernel log and/or NVML events."""
        if event.trusted:
            self.state.count_xid(event.gpu, event.xid)
        log.warning(
            "XID %d on GPU %s (%s) via %s: %s",
            event.xid,
            event.gpu,
            event.pci_bus_id,
            event.source,
            event.message or "-",
            extra={"gpu": event.gpu, "xid": event.xid, "pci_bus_id": event.pci_bus_id},
        )
        self.emit(event)

    def _record(self, record: Record) -> None:
        self.pipeline.observe(record)
        if self._user_emit is not None:
            self._user_emit(record)

    def _evaluate_loop(self) -> None:
        """Evaluate the rules once per poll interval, half an interval after each poll."""
        interval = self.config.poll.interval
        self.clock.wait(self._stopped, interval / 2)
        while not self._stopped.is_set():
            start = self.clock.monotonic()
            try:
                self.pipeline.evaluate(self.clock.now(), self.state.view())
            except Exception:  # the evaluator must outlive one bad evaluation
                log.exception("rule evaluation failed")
            self.evaluations += 1
            self.state.touch()
            elapsed = self.clock.monotonic() - start
            self.clock.wait(self._stopped, max(0.0, interval - elapsed))

    # -- lifecycle -------------------------------------------------------------------
    def open_backend(self) -> None:
        """Open the backend; a failure leaves the nvml source down (and is retried)."""
        try:
            infos = self.backend.open()
        except BackendError as exc:
            self.state.source("nvml", up=False, now=self.clock.now(), detail=str(exc))
            log.error("GPU backend %s unavailable: %s", self.backend.name, exc)
            return
        self.infos = filter_ignored(infos, self.config.gpus.ignore)
        self.xids.set_gpus(infos)
        self.state.set_gpus(self.infos, self.clock.now())
        log.info(
            "backend %s: %d GPU(s): %s",
            self.backend.name,
            len(self.infos),
            ", ".join(f"{i.index}={i.pci_bus_id}" for i in self.infos),
        )
        self.poller = Poller(
            self.backend,
            self.infos,
            self.state,
            self.clock,
            self.config.poll.interval,
            self.config.poll.call_timeout,
            self.emit,
        )

    def start(self) -> None:
        self.open_backend()
        if self.config.backend.kind == "nvml":  # the PCI bus cross-checks NVML's GPU count
            self.pci = PciWatcher(self.state.set_pci_gpus, on_status=self._source_status)
            self.pci.start()
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
        if self._serve_http:
            host, port = self._listen
            web = self.config.web
            guard = WebGuard(  # ConfigError if the web config file no longer loads
                web.config_file,
                rate_interval=1.0 / web.rate_limit if web.rate_limit > 0 else 0.0,
                rate_burst=web.rate_burst,
                max_request_bytes=web.max_request_bytes,
            )
            self.http = HttpServer(host, port, self.renderer, self.health, self.status, guard)
            self.http.start()
            log.info("serving on %s", self.http.url)

    def _start_polling(self) -> None:
        assert self.poller is not None
        self.poller.start()
        self._watch_workers()
        if self.config.sources.nvml_events and hasattr(self.backend, "wait_xid_events"):
            self._events_thread = threading.Thread(
                target=self._xid_events, name="nvml-events", daemon=True
            )
            self._events_thread.start()

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

    def _xid_events(self) -> None:
        """NVML XID events: the XID number within milliseconds (no text, no history)."""
        wait = self.backend.wait_xid_events  # type: ignore[attr-defined]
        poll = self.config.poll
        beat = self.heartbeats.register("nvml-events", 3 * poll.interval + poll.call_timeout + 1)
        while not self._stopped.is_set():
            beat.beat()
            try:
                events = wait(self.config.poll.interval)
            except BackendError as exc:
                self.xids.nvml_events_up = False
                self.state.source("nvml_events", up=False, now=self.clock.now(), detail=str(exc))
                self.clock.wait(self._stopped, self.config.poll.interval)
                continue
            self.xids.nvml_events_up = True
            self.state.source("nvml_events", up=True, now=self.clock.now())
            for event in events:
                if self._stopped.is_set():
                    return
                self.xids.nvml_event(event)

    def _watch_workers(self) -> None:
        """Register the poll scheduler and the evaluator with the liveness registry."""
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
        return True

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.poller is not None:
            self.poller.stop()
        if self.http is not None:
            self.http.stop()
        self.xids.stop()
        if self.pci is not None:
            self.pci.stop()
        if self._eval_thread is not None:
            self._eval_thread.join(2.0)
        for hook in self.on_stop:
            hook()
        self.pipeline.close()
        try:
            self.backend.close()
        except BackendError as exc:  # pragma: no cover - shutdown best effort
            log.warning("closing backend: %s", exc)

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
        view = self.state.view()
        now = self.clock.now()
        gpus = []
        for g in view.gpus:
            d = gpu_status_dict(g)
            if g.sample is not None:
                d["readings_age_seconds"] = round(now - g.sample.timestamp, 3)
            gpus.append(d)
        out: dict[str, Any] = {
            "node": view.node_name,
            "version": __version__,
            "now": now,
            "started_at": view.started_at,
            "backend": self.backend.name,
            "gpus": gpus,
            "gpus_expected": view.expected_gpus,
            "sources": {k: v.as_dict() for k, v in sorted(view.sources.items())},
            "xid_counts": [
                {"gpu": gpu, "xid": xid, "count": n}
                for (gpu, xid), n in sorted(
                    view.xid_counts.items(), key=lambda kv: (kv[0][0] or -1, kv[0][1])
                )
            ],
        }
        for sink in self.pipeline.sinks:  # actions: pending deliveries, silences, drain state
            extra = getattr(sink, "status", None)
            if callable(extra):
                out.update(extra())
        return out

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)
