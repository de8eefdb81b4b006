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

from . import __version__
from .backend import Backend
from .clock import Clock
from .config import Config
from .errors import BackendError
from .fields import decode_clock_event_reasons
from .httpd import HttpServer
from .metrics import MetricsRenderer
from .poller import Emit, Poller
from .records import GpuInfo, GpuStatus
from .snapshot import GpuState, NodeState

log = logging.getLogger(__name__)

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
        out["readings_age_seconds"] = None
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
    ) -> None:
        self.config = config
        self.backend = backend
        self.clock = clock
        self.emit = emit
        self.state = NodeState(config.node_name, clock.now(), config.gpus.expected)
        self.renderer = MetricsRenderer(
            self.state.view,
            per_link=config.metrics.per_link,
            dcgm_compat=config.metrics.dcgm_compat,
            hostname_label=config.metrics.hostname_label,
        )
        self._listen = listen or (config.listen.host, config.listen.port)
        self._serve_http = serve_http
        self.http: HttpServer | None = None
        self.poller: Poller | None = None
        self.infos: list[GpuInfo] = []
        self._stopped = threading.Event()
        self._last_cycles = -1
        self._last_progress = clock.monotonic()
        self.on_stop: list[Callable[[], None]] = []
        self._events_thread: threading.Thread | None = None

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
        if self.poller is not None:
            self.poller.start()
            if hasattr(self.backend, "wait_xid_events"):
                self._events_thread = threading.Thread(
                    target=self._xid_events, name="nvml-events", daemon=True
                )
                self._events_thread.start()
        if self._serve_http:
            host, port = self._listen
            self.http = HttpServer(host, port, self.renderer, self.health, self.status)
            self.http.start()
            log.info("serving on %s", self.http.url)

    def _xid_events(self) -> None:
        """NVML XID events: the XID number within milliseconds (no text, no history)."""
        wait = self.backend.wait_xid_events  # type: ignore[attr-defined]
        while not self._stopped.is_set():
            try:
                events = wait(self.config.poll.interval)
            except BackendError as exc:
                self.state.source("nvml_events", up=False, now=self.clock.now(), detail=str(exc))
                self.clock.wait(self._stopped, self.config.poll.interval)
                continue
            self.state.source("nvml_events", up=True, now=self.clock.now())
            for event in events:
                if self._stopped.is_set():
                    return
                self.state.count_xid(event.gpu, event.xid)
                log.warning("NVML XID %d on GPU %s (%s)", event.xid, event.gpu, event.pci_bus_id)
                if self.emit is not None:
                    self.emit(event)

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self.poller is not None:
            self.poller.stop()
        if self.http is not None:
            self.http.stop()
        for hook in self.on_stop:
            hook()
        try:
            self.backend.close()
        except BackendError as exc:  # pragma: no cover - shutdown best effort
            log.warning("closing backend: %s", exc)

    # -- health and status -----------------------------------------------------------
    def health(self) -> tuple[bool, str]:
        """OK while the poll scheduler makes progress; says why not otherwise."""
        if self.poller is None:
            nvml = self.state.view().sources.get("nvml")
            return False, f"GPU backend not open: {nvml.detail if nvml else 'starting'}"
        now = self.clock.monotonic()
        if self.poller.cycles != self._last_cycles:
            self._last_cycles = self.poller.cycles
            self._last_progress = now
        stalled_for = now - self._last_progress
        if stalled_for > 3 * self.config.poll.interval + 1.0:
            return False, f"poll scheduler made no progress for {stalled_for:.1f}s"
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
        return {
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

    def wait(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)
