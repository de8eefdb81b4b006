"""One incident per fault: the NVML XID event and the kernel's XID line become one event.

The NVML event arrives within milliseconds but carries only the XID number; the kernel
line carries the text, pid and process but may come later (journald batching). First
sight wins: whichever report arrives first is emitted at once as the incident, and no one
waits for its partner. When both paths are working, the partner (same PCI address and XID)
is expected within ``window`` seconds; when it comes, the pair is emitted again as one
enriching ``XidEvent`` (``enriches=True``, ``source`` naming both, e.g. ``kmsg+nvml``,
with the kernel line's text, pid and process) that updates the same incident and is never
counted, paged or drained again. A partner that never comes is counted as a mismatch after
the window (one of the paths is broken). Pure: time and whether each path is up are
passed in, and what goes out is returned (``submit``, ``expire``), never called back.

One exception to first sight: an NVML event of a code judged by its message (``hold``: the
NVLink5 XIDs 144-150 by their decoded registers, XID 154 by its recovery action) says too
little to judge. While the kernel-log path is up, such an event waits up to the window for
its kernel line, and the pair is the first sight (the rules judge the decoded text); if no
line comes, the NVML event is emitted alone when the window ends.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, replace

from gpuwatchd.core.families import Families
from gpuwatchd.core.records import XidEvent

NVML = "nvml"


@dataclass
class _Pending:
    event: XidEvent
    arrived: float
    held: bool = False  # not emitted yet: waits for its kernel line (see ``hold``)


@dataclass(frozen=True)
class Late:
    """A first sighting whose partner did not come within the window."""

    event: XidEvent
    missing: str  # the silent path: "kernel" or "nvml"
    emit: bool  # a held NVML event: it goes out now, judged on what NVML said


def _key(event: XidEvent) -> tuple[str, int]:
    pci = (event.pci_bus_id or "").upper()
    return (pci or f"gpu{event.gpu}", event.xid)


def _is_nvml(event: XidEvent) -> bool:
    return event.source == NVML


def merge_pair(kernel: XidEvent, nvml: XidEvent) -> XidEvent:
    """The kernel report with the NVML identity filled in and both provenances named."""
    return replace(
        kernel,
        source=f"{kernel.source}+{NVML}",
        timestamp=min(kernel.timestamp, nvml.timestamp),
        gpu=kernel.gpu if kernel.gpu is not None else nvml.gpu,
        uuid=kernel.uuid or nvml.uuid,
        pci_bus_id=kernel.pci_bus_id or nvml.pci_bus_id,
    )


class IncidentMerger:
    def __init__(
        self,
        window: float,
        *,
        hold: frozenset[int] = frozenset(),
    ) -> None:
        self.window = window
        self.hold = hold
        self._pending: dict[tuple[str, int], deque[_Pending]] = {}
        self._lock = threading.Lock()
        self.merged = 0
        self.duplicates = 0  # the same bus loss reported by an Xid 79 line and a plain line
        self._bus_loss: dict[str, float] = {}  # pci -> when a bus loss was last taken in
        self.mismatch = {"kernel": 0, "nvml": 0}  # which path was missing
        self.new_pending = threading.Event()  # set when a first sighting starts waiting

    def _duplicate_bus_loss(self, event: XidEvent, now: float) -> bool:
        """The driver reports a bus loss twice (an Xid 79 line and a "fallen off the bus"
        line); the second kernel report within the window is the same incident."""
        if event.xid != 79 or _is_nvml(event):
            return False
        pci = (event.pci_bus_id or "").upper()
        last = self._bus_loss.get(pci)
        self._bus_loss[pci] = now
        return last is not None and now - last < self.window

    def submit(
        self, event: XidEvent, now: float, *, kernel_up: bool, nvml_up: bool
    ) -> XidEvent | None:
        """Take one report; returns what goes out now (the incident, its enrichment) or
        None (a duplicate, or a held NVML event). ``kernel_up``/``nvml_up``: whether each
        path is working now, so that a partner is expected."""
        with self._lock:
            if self._duplicate_bus_loss(event, now):
                self.duplicates += 1
                return None
        nvml = _is_nvml(event)
        partner_expected = kernel_up if nvml else (nvml_up and event.kind == "xid")
        held = nvml and partner_expected and event.xid in self.hold
        out: XidEvent | None = event
        with self._lock:
            queue = self._pending.get(_key(event))
            if queue and _is_nvml(queue[0].event) != nvml:  # the partner of a first sighting
                head = queue.popleft()
                if not queue:
                    del self._pending[_key(event)]
                kernel_ev, nvml_ev = (head.event, event) if nvml else (event, head.event)
                out = merge_pair(kernel_ev, nvml_ev)
                if not head.held:  # else the pair is the first sight
                    out = replace(out, enriches=True)
                self.merged += 1
            elif partner_expected:
                self._pending.setdefault(_key(event), deque()).append(_Pending(event, now, held))
                self.new_pending.set()
                if held:
                    out = None
        return out

    def expire(self, now: float) -> list[Late]:
        """Count first sightings whose partner did not come within the window and return
        them (the held NVML events among them go out now)."""
        late: list[_Pending] = []
        with self._lock:
            for key in list(self._pending):
                queue = self._pending[key]
                while queue and now - queue[0].arrived >= self.window:
                    late.append(queue.popleft())
                if not queue:
                    del self._pending[key]
        out = []
        for pending in late:
            missing = "kernel" if _is_nvml(pending.event) else "nvml"
            self.mismatch[missing] += 1
            out.append(Late(pending.event, missing, pending.held))
        return out

    def next_expiry(self) -> float | None:
        """When the oldest first sighting's window ends (the clock of ``submit``), or None."""
        with self._lock:
            heads = [queue[0].arrived for queue in self._pending.values() if queue]
        return min(heads) + self.window if heads else None

    def pending(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._pending.values())

    def families(self, fams: Families) -> None:
        merged = fams.get(
            "gpuwatchd_xid_merged_total",
            "counter",
            "XIDs reported by both the kernel log and NVML events, merged into one incident.",
            [],
        )
        merged.add([], float(self.merged))
        dup = fams.get(
            "gpuwatchd_xid_duplicates_total",
            "counter",
            "Second kernel reports of one bus loss (an Xid 79 line and a 'fallen off the bus' "
            "line) folded into the first.",
            [],
        )
        dup.add([], float(self.duplicates))
        mismatch = fams.get(
            "gpuwatchd_xid_source_mismatch_total",
            "counter",
            "XIDs seen on one path only although both were up (missing = the silent path).",
            ["missing"],
        )
        for missing in ("kernel", "nvml"):
            mismatch.add([missing], float(self.mismatch[missing]))
