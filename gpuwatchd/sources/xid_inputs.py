"""Builds the XID inputs a daemon (or simulation) runs, from the ``sources`` section and
the backend.

``XidInputs`` owns the kernel-log source (one of the kinds in ``kernel/registry.py``:
journald, /dev/kmsg or the scenario's lines), the line handlers, and the incident merger
that NVML events also pass through. It hands
merged, trusted ``XidEvent``s to one callback and exposes its metrics. It owns the
``sources`` section at a reload (``prepare``): a new ``merge_window`` is applied at once;
the readers themselves start once, so any other change is refused until a restart.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuwatchd.config.sections import SourcesConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.heartbeat import Heartbeat, HeartbeatRegistry
from gpuwatchd.core.records import GpuInfo, XidEvent
from gpuwatchd.core.reloading import Prepared
from gpuwatchd.core.statehealth import StoreHealth
from gpuwatchd.sources.incidents import IncidentMerger
from gpuwatchd.sources.kernel.kind import FollowingReader, KernelLogReader, KernelLogSetup
from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler, kernel_log_families
from gpuwatchd.sources.kernel.registry import BY_NAME, KINDS
from gpuwatchd.sources.kernel.scenario import ScenarioKernelSource
from gpuwatchd.xid.catalog import message_judged_codes

log = logging.getLogger(__name__)

EXPIRER_IDLE_S = 5.0  # with nothing pending the expirer only beats its heartbeat (30 s)

Status = Callable[[str, bool, str], None]  # (source name, up, detail)


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


class XidInputs:
    sections = ("sources",)

    def __init__(
        self,
        sources: SourcesConfig,
        state_dir: str | None,
        backend: object,
        clock: Clock,
        emit: Callable[[XidEvent], None],
        status: Status,
    ) -> None:
        """``state_dir``: where the kernel-log readers keep their resume position (``None``:
        in memory, as ``simulate`` runs)."""
        self.config = sources
        self.clock = clock
        self.status = status
        self.resolver = GpuResolver()
        self.kind = choose_kernel_log(sources, backend)
        self.handler: KernelLineHandler | None = None
        self.source: KernelLogReader | None = None
        self._kernel_up = False
        self.nvml_events_up = False
        self.merger = IncidentMerger(
            sources.merge_window,
            emit,
            kernel_up=lambda: self._kernel_up,
            nvml_up=lambda: self.nvml_events_up,
            on_mismatch=self._mismatch,
            hold=message_judged_codes(),
        )
        self._stop = threading.Event()
        self._expirer: threading.Thread | None = None
        self._expirer_beat: Heartbeat | None = None
        if self.kind == "none":
            log.warning("no kernel-log source: XIDs come from NVML events only")
            return
        self.handler = KernelLineHandler(self.kind, self.resolver, self._from_kernel)
        kind = BY_NAME[self.kind]
        self._kernel_up = kind.scripted
        self.source = kind.build(
            KernelLogSetup(
                self.handler,
                clock,
                sources,
                backend,
                lambda name: _pos(state_dir, name),
                self._source_status,
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

    def _source_status(self, up: bool, detail: str) -> None:
        self._kernel_up = up
        self.status(self.kind, up, detail)

    def _from_kernel(self, event: XidEvent) -> None:
        self.merger.submit(event, self.clock.monotonic())

    def nvml_event(self, event: XidEvent) -> None:
        self.merger.submit(self.resolver.resolve(event), self.clock.monotonic())

    def _mismatch(self, event: XidEvent, missing: str) -> None:
        log.warning(
            "XID %d on %s seen only by %s: the %s path reported nothing within %gs",
            event.xid,
            event.pci_bus_id,
            event.source,
            missing,
            self.merger.window,
        )

    def set_gpus(self, infos: list[GpuInfo]) -> None:
        self.resolver.update(infos)

    def _expire_loop(self) -> None:
        while not self._stop.is_set():
            if self._expirer_beat is not None:
                self._expirer_beat.beat()
            try:
                self.merger.expire(self.clock.monotonic())
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

    def start(self, heartbeats: HeartbeatRegistry | None = None) -> None:
        if isinstance(self.source, FollowingReader) and heartbeats is not None:
            # a read loop turns at least every 0.5 s; 30 s of silence means it is wedged
            self.source.heartbeat = heartbeats.register(f"kernel-log-{self.kind}", 30.0)
        if self.source is not None:
            self.source.start()
        if heartbeats is not None:
            self._expirer_beat = heartbeats.register("xid-merge", 30.0)
        self._expirer = threading.Thread(target=self._expire_loop, name="xid-merge", daemon=True)
        self._expirer.start()

    def pump(self, now: float, monotonic: float) -> None:
        """Synchronous step for simulate: replay due scenario lines, expire the merger."""
        if isinstance(self.source, ScenarioKernelSource):
            self.source.pump(now)
        self.merger.expire(monotonic)

    def stop(self) -> None:
        self._stop.set()
        self.merger.new_pending.set()  # wake the expirer
        if self.source is not None:
            self.source.stop()
        if self._expirer is not None:
            self._expirer.join(2.0)
        self.merger.expire(float("inf"))

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
