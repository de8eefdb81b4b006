"""Turns trusted kernel-log messages into ``XidEvent``s, and counts what it saw.

Shared by the journald and /dev/kmsg sources and by ``xid scan``: the trust decision is
made by the source (``_TRANSPORT=kernel`` and facility 0 for journald, facility 0 for
kmsg) and passed in; this module parses each trusted message as one kernel record (the
driver's header at its first character, see ``gpuwatchd.xid.parser``), maps the PCI
address to a GPU, and keeps the per-source counters exported as metrics. Each trusted
XID goes to the handler's ``sink`` (anything with ``append``: the XID intake in the daemon,
a list in a test, the printer of ``xid scan``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from gpuwatchd.core.families import Families
from gpuwatchd.core.records import GpuInfo, XidEvent
from gpuwatchd.xid.parser import XidStream

log = logging.getLogger(__name__)

SOURCES = ("journald", "kmsg", "scenario")
FORGED_LOG_EVERY = 60.0  # seconds between two warnings about forged lines (all counted)


class XidSink(Protocol):
    """Where a handler puts each trusted XID it found."""

    def append(self, event: XidEvent, /) -> None: ...


@dataclass
class LineCounters:
    lines: int = 0
    xids: int = 0
    forged: int = 0
    unmapped: int = 0  # XID for a PCI address no known GPU has (NVSwitch, a lost GPU, ...)
    overruns: int = 0  # /dev/kmsg: records lost because the ring buffer wrapped
    errors: int = 0  # messages or reader loops that raised an unexpected error
    last_xid_at: float | None = None


class GpuResolver:
    """PCI bus id (NVML form) -> GPU index and UUID, from the backend's GPU list."""

    def __init__(self, infos: Iterable[GpuInfo] = ()) -> None:
        self._by_pci: dict[str, GpuInfo] = {}
        self._by_uuid: dict[str, GpuInfo] = {}
        self.update(infos)

    def update(self, infos: Iterable[GpuInfo]) -> None:
        for info in infos:
            self._by_pci[info.pci_bus_id.upper()] = info
            self._by_uuid[info.uuid.lower()] = info

    def resolve(self, event: XidEvent) -> XidEvent:
        info = None
        if event.pci_bus_id:
            info = self._by_pci.get(event.pci_bus_id.upper())
        if info is None and event.uuid:
            info = self._by_uuid.get(event.uuid.lower())
        if info is None:
            return event
        return replace(event, gpu=info.index, uuid=info.uuid, pci_bus_id=info.pci_bus_id)


_REPORT_MARKS = ("Xid (", "fallen off the bus")  # "Xid (" also covers SXid reports


def _claims_a_report(message: str) -> bool:
    return any(mark in message for mark in _REPORT_MARKS)


class KernelLineHandler:
    """Parses messages of one source; emits trusted XIDs; counts forged ones."""

    def __init__(
        self,
        source: str,
        resolver: GpuResolver,
        sink: XidSink,
    ) -> None:
        self.source = source
        self.resolver = resolver
        self.sink = sink
        self.counters = LineCounters()
        self._stream = XidStream()
        self._lock = threading.Lock()
        self._forged_quiet_until = 0.0
        self._forged_unlogged = 0

    def _warn_forged(self, message: str) -> None:
        """Log forgeries, at most one line per ``FORGED_LOG_EVERY`` seconds: whoever floods
        syslog with fake XIDs must not flood the journal through us as well."""
        now = time.monotonic()
        if now < self._forged_quiet_until:
            self._forged_unlogged += 1
            return
        more = self._forged_unlogged
        self._forged_unlogged = 0
        self._forged_quiet_until = now + FORGED_LOG_EVERY
        log.warning(
            "ignored a forged XID line from %s (not written by the NVIDIA driver): %.200r%s",
            self.source,
            message,
            f" (and {more} more since the last such warning; counted in "
            "gpuwatchd_kernel_log_forged_lines_total)"
            if more
            else "",
        )

    def count_error(self) -> None:
        with self._lock:
            self.counters.errors += 1

    def handle(self, message: str, timestamp: float, trusted: bool) -> XidEvent | None:
        """One kernel-log message (possibly several lines). Returns the event if emitted.

        A message that makes parsing raise is logged, counted and skipped: one poison
        message must not take the reader (and every later XID) down with it."""
        try:
            return self._handle(message, timestamp, trusted)
        except Exception:
            self.count_error()
            log.exception("%s: could not handle a kernel-log message: %.200r", self.source, message)
            return None

    def _handle(self, message: str, timestamp: float, trusted: bool) -> XidEvent | None:
        with self._lock:
            self.counters.lines += 1
            if not trusted:
                # An untrusted line is never parsed into an event. It is only counted when
                # it claims to be an XID, so operators can see forgery attempts. No "NVRM"
                # required: journald files a user-facility /dev/kmsg record's "NVRM:" as
                # its SYSLOG_IDENTIFIER, leaving "Xid (PCI:...): 79, ..." as the message.
                if _claims_a_report(message):
                    self.counters.forged += 1
                    self._warn_forged(message)
                return None
            # One record, read as the driver writes one: the header at its first
            # character, nothing after its first line (gpuwatchd.xid.parser). Splitting
            # the record on newlines would let a kernel message that echoes user text
            # (tmpfs: Unknown parameter '...) smuggle in a line of its own.
            found = self._stream.feed_record(message)
            if found is None:
                if _claims_a_report(message):
                    # The kernel wrote it, the driver did not: a message that echoes user
                    # text (a mount option, a USB product string) with a report inside.
                    self.counters.forged += 1
                    self._warn_forged(message)
                return None
            event = self.resolver.resolve(found.to_event(timestamp, self.source))
            self.counters.xids += 1
            self.counters.last_xid_at = timestamp
            if event.gpu is None:
                self.counters.unmapped += 1
        self.sink.append(event)
        return event


def kernel_log_families(handlers: Iterable[KernelLineHandler], fams: Families) -> None:
    """Per-source line counters (all present at 0 from start-up)."""
    lines = fams.get(
        "gpuwatchd_kernel_log_lines_total", "counter", "Kernel-log messages read.", ["source"]
    )
    xids = fams.get(
        "gpuwatchd_kernel_log_xid_lines_total",
        "counter",
        "Trusted XID / SXid / fallen-off-the-bus reports found in the kernel log.",
        ["source"],
    )
    forged = fams.get(
        "gpuwatchd_kernel_log_forged_lines_total",
        "counter",
        "XID-looking lines ignored because the NVIDIA driver did not write them "
        "(wrong journal transport or syslog facility, or a kernel message that only "
        "echoes the text).",
        ["source"],
    )
    unmapped = fams.get(
        "gpuwatchd_kernel_log_unmapped_xids_total",
        "counter",
        "XIDs whose PCI address matches no GPU NVML knows (NVSwitch, a GPU already lost).",
        ["source"],
    )
    errors = fams.get(
        "gpuwatchd_kernel_log_errors_total",
        "counter",
        "Kernel-log messages and reader loops that raised an unexpected error (the message "
        "was skipped, the reader restarted; the log has the traceback).",
        ["source"],
    )
    overruns = fams.get(
        "gpuwatchd_kernel_log_overruns_total",
        "counter",
        "Records lost because the kernel ring buffer wrapped before they were read.",
        ["source"],
    )
    last = fams.get(
        "gpuwatchd_kernel_log_last_xid_timestamp_seconds",
        "gauge",
        "When the source last reported an XID, in seconds since the epoch.",
        ["source"],
    )
    for h in handlers:
        c = h.counters
        lines.add([h.source], float(c.lines))
        xids.add([h.source], float(c.xids))
        forged.add([h.source], float(c.forged))
        unmapped.add([h.source], float(c.unmapped))
        overruns.add([h.source], float(c.overruns))
        errors.add([h.source], float(c.errors))
        if c.last_xid_at is not None:
            last.add([h.source], c.last_xid_at)
