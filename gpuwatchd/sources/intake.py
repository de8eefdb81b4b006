"""The XID intake: where every XID report enters the daemon, on its way to the hand-off.

``XidIntake`` owns the kernel-log source (one of the kinds in ``kernel/registry.py``:
journald, /dev/kmsg or the scenario's lines) with its line handler, the NVML XID event
reader, and the incident merger both paths meet in (one incident per fault). Each
incident is counted on the node state, logged, and handed to the ``outlet`` (the node,
which puts it in the hand-off); an urgent record wakes the evaluator there at once, so a
kernel line or an NVML event never waits for a timer.

Whether each path is up is read from the node state's source board, where the readers
report themselves: the merger expects a partner only from a path that works.

It owns the ``sources`` section at a reload (``prepare``): a new ``merge_window`` is
applied at once; the readers themselves start once, so any other change is refused until
a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Protocol

from gpuwatchd.config.sections import SourcesConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.heartbeat import Heartbeat, HeartbeatRegistry
from gpuwatchd.core.records import GpuInfo, XidEvent
from gpuwatchd.core.reloading import Prepared
from gpuwatchd.core.statehealth import StoreHealth
from gpuwatchd.sources.gpu.backend import SupervisedBackend, XidEventSource
from gpuwatchd.sources.gpu.xid_events import (
    SOURCE as NVML_EVENTS,
)
from gpuwatchd.sources.gpu.xid_events import (
    SUPERVISED_EVENT_WAIT_S,
    XidEventReader,
)
from gpuwatchd.sources.incidents import IncidentMerger, Late
from gpuwatchd.sources.kernel.kind import FollowingReader, KernelLogReader, KernelLogSetup
from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler, kernel_log_families
from gpuwatchd.sources.kernel.registry import BY_NAME, KINDS
from gpuwatchd.sources.kernel.scenario import ScenarioKernelSource
from gpuwatchd.xid.catalog import decoded_verdict, message_judged_codes, sxid_verdict

log = logging.getLogger(__name__)

EXPIRER_IDLE_S = 5.0  # with nothing pending the expirer only beats its heartbeat (30 s)


class XidBoard(Protocol):
    """What the intake writes on the node state: each path's health, each XID's count."""

    def source(self, name: str, *, up: bool, now: float, detail: str = "") -> None: ...

    def source_up(self, name: str) -> bool: ...

    def count_xid(
        self,
        gpu: int | None,
        xid: int,
        n: int = 1,
        *,
        gpu_instance: int | None = None,
        compute_instance: int | None = None,
        verdict: str | None = None,
    ) -> None: ...

    def count_sxid(self, pci_bus_id: str, verdict: str, n: int = 1) -> None: ...


class XidOutlet(Protocol):
    """Where an incident leaves the intake: the node, into the hand-off."""

    def emit(self, record: XidEvent, /) -> None: ...


def choose_kernel_log(sources: SourcesConfig, backend: object) -> str:
    """The kernel-log kind ``sources.kernel_log`` names; for ``auto``, the first kind of
    the registry that can serve this host, else ``none``."""
    if sources.kernel_log != "auto":
        return sources.kernel_log
    for kind in KINDS:
        if kind.available(sources, backend):
            return kind.name
    return "none"


LIVE_SOURCES_KEYS = frozenset({"merge_window"})
"""The ``sources`` keys a reload applies; the readers are built once from the others."""


class XidIntake:
    sections = ("sources",)

    def __init__(
        self,
        sources: SourcesConfig,
        poll_interval: float,
        state_dir: str | None,
        backend: object,
        clock: Clock,
        board: XidBoard,
        outlet: XidOutlet,
    ) -> None:
        """``state_dir``: where the kernel-log readers keep their resume position (``None``:
        in memory, as ``simulate`` runs). ``poll_interval``: how long one NVML event wait
        lasts on a backend whose wait cannot be cut short, and the retry delay."""
        self.config = sources
        self.clock = clock
        self.board = board
        self.outlet = outlet
        self.resolver = GpuResolver()
        self.kind = choose_kernel_log(sources, backend)
        self.handler: KernelLineHandler | None = None
        self.source: KernelLogReader | None = None
        self._scripted = False  # the kind's lines are there from the start: up at once
        self.merger = IncidentMerger(sources.merge_window, hold=message_judged_codes())
        self._stop = threading.Event()
        self._expirer: threading.Thread | None = None
        self._expirer_beat: Heartbeat | None = None
        self.events: XidEventReader | None = None
        if sources.nvml_events and isinstance(backend, XidEventSource):
            self.events = XidEventReader(
                backend,
                clock,
                self,
                board,
                # the worker's queue returns an event at once and close() wakes it, so
                # its wait can be long; libnvidia-ml's own wait cannot be cut short
                wait_s=max(poll_interval, SUPERVISED_EVENT_WAIT_S)
                if isinstance(backend, SupervisedBackend)
                else poll_interval,
                retry_s=poll_interval,
            )
        if self.kind == "none":
            log.warning("no kernel-log source: XIDs come from NVML events only")
            return
        self.handler = KernelLineHandler(self.kind, self.resolver, self)
        kind = BY_NAME[self.kind]
        self._scripted = kind.scripted
        name = self.kind
        self.source = kind.build(
            KernelLogSetup(
                self.handler,
                clock,
                sources,
                backend,
                lambda file: _pos(state_dir, file),
                lambda up, detail: board.source(name, up=up, now=clock.now(), detail=detail),
            )
        )

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        """The ``sources`` section at a reload: a changed ``merge_window`` alone is applied;
        a change to any other key refuses the section (the readers start once)."""
        if "sources" not in changed:
            return Prepared()
        section: SourcesConfig = new["sources"]
        old = dataclasses.asdict(self.config)
        moved = sorted(k for k, v in dataclasses.asdict(section).items() if old[k] != v)
        fixed = [f"sources.{k}" for k in moved if k not in LIVE_SOURCES_KEYS]
        if fixed:
            why = f"{', '.join(fixed)}: the kernel-log and NVML event readers are built at start"
            return Prepared(refused={"sources": why})

        def apply() -> None:
            self.merger.window = section.merge_window
            self.config = section
            log.info("sources.merge_window is now %gs", section.merge_window)

        return Prepared(apply)

    # -- the two paths in --------------------------------------------------------------
    def append(self, event: XidEvent) -> None:
        """A trusted XID from the kernel-log line handler (or, resolved, from NVML)."""
        kernel_up = self._scripted or (self.handler is not None and self.board.source_up(self.kind))
        nvml_up = self.events is not None and self.board.source_up(NVML_EVENTS)
        out = self.merger.submit(
            event, self.clock.monotonic(), kernel_up=kernel_up, nvml_up=nvml_up
        )
        if out is not None:
            self._incident(out)

    def nvml_event(self, event: XidEvent) -> None:
        """An XID event from the NVML event reader: mapped to its GPU, then merged."""
        self.append(self.resolver.resolve(event))

    def _expire(self, now: float) -> None:
        for late in self.merger.expire(now):
            self._late(late)

    def _late(self, late: Late) -> None:
        if late.emit:  # a held NVML event whose kernel line never came
            self._incident(late.event)
        event = late.event
        log.warning(
            "XID %d on %s seen only by %s: the %s path reported nothing within %gs",
            event.xid,
            event.pci_bus_id,
            event.source,
            late.missing,
            self.merger.window,
        )

    def _incident(self, event: XidEvent) -> None:
        """A trusted XID incident (first sight), or its partner's enrichment: counted on
        the node state, logged, and handed to the outlet."""
        extra = {"gpu": event.gpu, "xid": event.xid, "pci_bus_id": event.pci_bus_id}
        if event.enriches:
            log.info(
                "XID %d on GPU %s (%s) confirmed via %s: pid %s (%s): %s",
                event.xid,
                event.gpu,
                event.pci_bus_id,
                event.source,
                event.pid,
                event.process or "-",
                event.message or "-",
                extra=extra,
            )
        else:
            if event.trusted and event.kind == "sxid":
                self.board.count_sxid(event.pci_bus_id or "", sxid_verdict(event.message))
            elif event.trusted:
                self.board.count_xid(
                    event.gpu,
                    event.xid,
                    gpu_instance=event.gpu_instance,
                    compute_instance=event.compute_instance,
                    verdict=decoded_verdict(event.xid, event.message, event.kind),
                )
            log.warning(
                "XID %d on GPU %s (%s) via %s: %s",
                event.xid,
                event.gpu,
                event.pci_bus_id,
                event.source,
                event.message or "-",
                extra=extra,
            )
        self.outlet.emit(event)

    def set_gpus(self, infos: list[GpuInfo]) -> None:
        self.resolver.update(infos)

    def _expire_loop(self) -> None:
        while not self._stop.is_set():
            if self._expirer_beat is not None:
                self._expirer_beat.beat()
            try:
                self._expire(self.clock.monotonic())
            except Exception as exc:  # the loop must outlive one bad expiry, visibly
                log.exception("XID merge: expiring incidents failed")
                if self._expirer_beat is not None:
                    self._expirer_beat.fail(f"expiring incidents failed: {exc!r:.200}")
                self.clock.wait(self._stop, 1.0)
            # Sleep until the oldest first sighting's window ends, or a new one starts
            # waiting; with nothing pending, wake only to beat the heartbeat.
            due = self.merger.next_expiry()
            idle = EXPIRER_IDLE_S if due is None else due - self.clock.monotonic()
            wake = self.merger.new_pending
            wake.clear()
            if self.merger.next_expiry() == due:  # nothing arrived since the look
                self.clock.wait(wake, max(0.0, min(idle, EXPIRER_IDLE_S)))
        if self._expirer_beat is not None:
            self._expirer_beat.close()

    # -- threads (the daemon) and steps (simulate) -----------------------------------------
    def start(self, heartbeats: HeartbeatRegistry | None = None) -> None:
        """The kernel-log reader and the merger's expirer (the NVML event reader starts
        with the polls: ``start_events``)."""
        if isinstance(self.source, FollowingReader) and heartbeats is not None:
            # a read loop turns at least every 0.5 s; 30 s of silence means it is wedged
            self.source.heartbeat = heartbeats.register(f"kernel-log-{self.kind}", 30.0)
        if self.source is not None:
            self.source.start()
        if heartbeats is not None:
            self._expirer_beat = heartbeats.register("xid-merge", 30.0)
        self._expirer = threading.Thread(target=self._expire_loop, name="xid-merge", daemon=True)
        self._expirer.start()

    def start_events(self, heartbeats: HeartbeatRegistry, call_timeout: float) -> None:
        """The NVML event reader's thread, once the GPUs answer."""
        events = self.events
        if events is None:
            return
        events.heartbeat = heartbeats.register(
            "nvml-events", 3 * max(events.retry_s, events.wait_s) + call_timeout + 1
        )
        events.start()

    def pump(self, now: float, monotonic: float) -> None:
        """Synchronous step for simulate: NVML events and scenario lines due by now, then
        the merger's expiry."""
        if self.events is not None:
            self.events.step(0.0)
        if isinstance(self.source, ScenarioKernelSource):
            self.source.pump(now)
        self._expire(monotonic)

    def flush(self) -> None:
        """Let go of every first sighting still waiting for its partner."""
        self._expire(float("inf"))

    def stop(self) -> None:
        """Stop the kernel-log reader and the expirer and flush the merger; the NVML event
        reader is asked to stop without waiting (``join_events`` once the backend is
        closed, which ends its wait)."""
        self._stop.set()
        self.merger.new_pending.set()  # wake the expirer
        if self.events is not None:
            self.events.stop(wait=False)
        if self.source is not None:
            self.source.stop()
        if self._expirer is not None:
            self._expirer.join(2.0)
        self.flush()

    def join_events(self) -> None:
        if self.events is not None:
            self.events.stop()

    def families(self, fams: Families) -> None:
        kernel_log_families([self.handler] if self.handler else [], fams)
        self.merger.families(fams)

    def state_health(self) -> StoreHealth | None:
        """Whether the kernel-log reader's resume position reaches the disk."""
        if not isinstance(self.source, FollowingReader):
            return None
        position = self.source.position
        if position.path is None:
            return None
        return StoreHealth(
            f"{self.kind}_position", position.durable, position.errors, position.problem
        )


def _pos(state_dir: str | None, name: str) -> str | None:
    return None if state_dir is None else os.path.join(state_dir, name)
