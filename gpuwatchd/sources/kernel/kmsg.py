"""XIDs from /dev/kmsg, where there is no journald (containers, minimal hosts).

Each read() of /dev/kmsg returns one record ``PRIO,SEQ,USEC,FLAGS;MESSAGE``. Only
facility 0 counts: the kernel stamps every user-space write with facility 1 or above, so
even root cannot forge a facility-0 record. The position (boot id + last sequence number)
is saved atomically; after a restart within the same boot the reader skips what it already
handled; after a reboot it starts from the beginning of the new boot's buffer (the
reboot's own XIDs matter). When the ring buffer wraps under a reader, read() fails with
EPIPE once: that is counted as an overrun and reading continues.

A regular file (a saved dump, or tests) is read line by line and followed as it grows.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatchd.config.sections import KindSection, SourcesConfig, read_path
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.heartbeat import Heartbeat
from gpuwatchd.sources.kernel.cursor import PositionFile
from gpuwatchd.sources.kernel.kind import KernelLogKind, KernelLogSetup
from gpuwatchd.sources.kernel.linehandler import KernelLineHandler
from gpuwatchd.sources.kernel.restart import run_with_restarts
from gpuwatchd.xid.parser import KmsgRecord, parse_kmsg_record

log = logging.getLogger(__name__)

StatusFn = Callable[[bool, str], None]
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
IDLE_POLL_MS = 5000  # an idle /dev/kmsg reader wakes this often (its heartbeat allows 30 s)
SAVE_EVERY = 1.0  # seconds: the position is saved when the log pauses, and at least this often


def read_boot_id(path: str = BOOT_ID_PATH) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def kmsg_available(path: str = "/dev/kmsg") -> bool:
    return os.access(path, os.R_OK)


class KmsgSource:
    name = "kmsg"

    def __init__(
        self,
        handler: KernelLineHandler,
        clock: Clock,
        *,
        path: str = "/dev/kmsg",
        position: PositionFile | None = None,
        status: StatusFn | None = None,
        boot_id: str | None = None,
        from_start: bool = False,
    ) -> None:
        self.handler = handler
        self.clock = clock
        self.path = path
        self.position = position or PositionFile(None)
        self.status = status or (lambda up, detail: None)
        self.boot_id = read_boot_id() if boot_id is None else boot_id
        self.from_start = from_start
        self.last_seq = -1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # wall time of boot, to timestamp records (None: stamp with the clock on arrival)
        self.time_base: float | None = None
        self._dirty = False
        self._saved_at = 0.0  # monotonic time of the last save
        self.heartbeat: Heartbeat | None = None  # beats once per turn of the read loop
        self._wake_w: int | None = None  # write end of the stop pipe while reading a device
        self._wake_lock = threading.Lock()

    # -- records -----------------------------------------------------------------------
    def _resume_seq(self) -> int | None:
        saved = self.position.load()
        if saved and saved.get("boot_id") == self.boot_id and isinstance(saved.get("seq"), int):
            return int(saved["seq"])
        return None

    def handle_record(self, raw: str) -> KmsgRecord | None:
        record = parse_kmsg_record(raw)
        if record is None:
            return None
        if record.seq <= self.last_seq:
            return record  # already handled before a restart
        self.last_seq = record.seq
        self._dirty = True
        base = self.time_base
        timestamp = self.clock.now() if base is None else base + record.usec / 1e6
        self.handler.handle(record.message, timestamp, record.facility == 0)
        if time.monotonic() - self._saved_at >= SAVE_EVERY:  # a log that never pauses
            self.save()
        return record

    def save(self) -> None:
        self._saved_at = time.monotonic()
        if self._dirty:
            self.position.save({"boot_id": self.boot_id, "seq": self.last_seq})
            self._dirty = False

    # -- device ------------------------------------------------------------------------
    def _boot_time(self) -> float:
        try:
            with open("/proc/uptime", encoding="ascii") as fh:
                uptime = float(fh.read().split()[0])
            return self.clock.now() - uptime
        except (OSError, ValueError, IndexError):
            return 0.0

    def _run_device(self, fd: int) -> None:
        resume = self._resume_seq()
        if resume is not None:
            self.last_seq = resume  # read from the buffer's start; skip handled records
        elif not self.from_start:
            os.lseek(fd, 0, os.SEEK_END)  # first start: only what happens from now on
        self.time_base = self._boot_time() or None
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        # stop() writes to this pipe, so the wait for a record can be long (IDLE_POLL_MS):
        # an idle reader wakes only to beat its heartbeat, not twice a second
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with self._wake_lock:
            self._wake_w = wake_w
        poller.register(wake_r, select.POLLIN)
        try:
            self._read_device(fd, poller)
        finally:
            with self._wake_lock:  # stop() must never write to a closed (reused) fd
                wake_w, self._wake_w = self._wake_w, None
                os.close(wake_r)
                if wake_w is not None:
                    os.close(wake_w)

    def _read_device(self, fd: int, poller: select.poll) -> None:
        while not self._stop.is_set():
            if self.heartbeat is not None:
                self.heartbeat.beat()
            try:
                data = os.read(fd, 16384)
            except BlockingIOError:
                self.save()
                self.status(True, "reading /dev/kmsg")
                poller.poll(IDLE_POLL_MS)
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self.handler.counters.overruns += 1
                    log.warning("/dev/kmsg overrun: records were lost before they were read")
                    continue
                raise
            self.handle_record(data.decode("utf-8", "replace"))

    def scan(self) -> int:
        """Post-mortem over a saved dump: every record once, same trust rule, no position.
        Events are stamped in seconds since boot (a dump carries no wall time)."""
        self.time_base = 0.0
        count = 0
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith(" "):
                    continue  # dictionary continuation lines
                if self.handle_record(line.rstrip("\n")) is not None:
                    count += 1
        return count

    def _run_file(self) -> None:
        resume = self._resume_seq()
        if resume is not None:
            self.last_seq = resume
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            pending = ""
            while not self._stop.is_set():
                if self.heartbeat is not None:
                    self.heartbeat.beat()
                chunk = fh.readline()
                if chunk:
                    pending += chunk
                    if not chunk.endswith("\n"):
                        continue
                    line, pending = pending, ""
                    if not line.startswith(" "):  # skip dictionary continuation lines
                        self.handle_record(line.rstrip("\n"))
                    continue
                self.save()
                self.status(True, f"following {self.path}")
                self._stop.wait(0.2)

    def run(self) -> None:
        """Read until stopped; an unexpected error restarts the loop (``restart.py``)."""
        run_with_restarts(
            "kmsg",
            self._run_once,
            stop=self._stop,
            heartbeat=lambda: self.heartbeat,
            on_crash=self._crashed,
        )

    def _crashed(self, detail: str) -> None:
        self.handler.count_error()
        self.status(False, detail)

    def _run_once(self) -> None:
        try:
            mode = os.stat(self.path).st_mode
            if stat.S_ISCHR(mode):
                fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    self.status(True, "reading /dev/kmsg")
                    self._run_device(fd)
                finally:
                    os.close(fd)
            else:
                self.status(True, f"following {self.path}")
                self._run_file()
        except OSError as exc:
            log.error("kmsg source unavailable: %s", exc)
            self.status(False, f"cannot read {self.path}: {exc.strerror or exc}")
        finally:
            self.save()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="kmsg", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._wake_lock:
            if self._wake_w is not None:
                with contextlib.suppress(OSError):  # a full pipe is awake already
                    os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(2.0)


@dataclass(frozen=True)
class KmsgSection(KindSection):
    """kmsg's own key of ``sources``."""

    kmsg_path: str = "/dev/kmsg"  # the kmsg device, or a file in tests


def _path(sources: SourcesConfig) -> str:
    return sources.section("kmsg", KmsgSection).kmsg_path


def _build(setup: KernelLogSetup) -> KmsgSource:
    return KmsgSource(
        setup.handler,
        setup.clock,
        path=_path(setup.sources),
        position=PositionFile(setup.position_path("kmsg.json")),
        status=setup.status,
    )


KIND = KernelLogKind(
    "kmsg",
    available=lambda sources, backend: kmsg_available(_path(sources)),
    build=_build,
    section=KmsgSection,
    options={"kmsg_path": read_path},
)
