"""XIDs from the systemd journal, trusting only what the kernel itself wrote.

Only entries with the trusted field ``_TRANSPORT=kernel`` and ``SYSLOG_FACILITY=0`` count:
any local user can log "NVRM: Xid ..." through syslog, ``logger --journald`` (even with
``SYSLOG_IDENTIFIER=kernel``) or stdout, and root's writes to /dev/kmsg get facility 1.
The reader also matches ``SYSLOG_IDENTIFIER=kernel`` so that forged entries claiming to be
the kernel are seen and counted, never acted on.

The position is a journal cursor saved atomically after every batch; a restart resumes
after it (python-systemd returns the entry *at* the cursor first: it is skipped). A cursor
that no longer exists (vacuumed) falls back to the saved realtime timestamp. The first
``wait()`` on a new Reader reports INVALIDATE; rotation does too; both just mean "drain".
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuwatchd.config.sections import KindSection, SourcesConfig, read_path
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.heartbeat import Heartbeat
from gpuwatchd.sources.kernel.cursor import PositionFile
from gpuwatchd.sources.kernel.kind import KernelLogKind, KernelLogSetup
from gpuwatchd.sources.kernel.linehandler import KernelLineHandler
from gpuwatchd.sources.kernel.restart import run_with_restarts

log = logging.getLogger(__name__)

StatusFn = Callable[[bool, str], None]


def journal_available() -> bool:
    try:
        importlib.import_module("systemd.journal")
    except ImportError:
        return False

    return os.path.isdir("/run/systemd/journal") or os.path.isdir("/var/log/journal")


def _message(entry: dict[str, Any]) -> str | None:
    msg = entry.get("MESSAGE")
    if isinstance(msg, bytes):
        return msg.decode("utf-8", "replace")
    return msg if isinstance(msg, str) else None


def is_trusted(entry: dict[str, Any]) -> bool:
    """Written by the kernel: trusted transport and the kernel's facility."""
    return entry.get("_TRANSPORT") == "kernel" and entry.get("SYSLOG_FACILITY") == 0


def _timestamp(entry: dict[str, Any], fallback: float) -> float:
    ts = entry.get("__REALTIME_TIMESTAMP")
    return ts.timestamp() if isinstance(ts, datetime) else fallback


class JournaldSource:
    name = "journald"

    def __init__(
        self,
        handler: KernelLineHandler,
        clock: Clock,
        *,
        directory: str | None = None,
        position: PositionFile | None = None,
        status: StatusFn | None = None,
        backfill: float = 0.0,
    ) -> None:
        self.handler = handler
        self.clock = clock
        self.directory = directory
        self.position = position or PositionFile(None)
        self.status = status or (lambda up, detail: None)
        self.backfill = backfill
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.resumed_from: str = ""  # cursor | realtime | tail | backfill: for status and tests
        self.heartbeat: Heartbeat | None = None  # beats once per turn of the read loop

    # -- reader set-up -----------------------------------------------------------------
    def _open(self) -> Any:
        journal = importlib.import_module("systemd.journal")
        if self.directory and os.path.isfile(self.directory):
            reader = journal.Reader(files=[self.directory])
        elif self.directory:
            reader = journal.Reader(path=self.directory)
        else:
            reader = journal.Reader()
        reader.add_match(_TRANSPORT="kernel")
        reader.add_disjunction()
        reader.add_match(SYSLOG_IDENTIFIER="kernel")
        return reader

    def _position(self, reader: Any) -> None:
        saved = self.position.load()
        cursor = saved.get("cursor") if saved else None
        if isinstance(cursor, str):
            try:
                reader.seek_cursor(cursor)
                entry = reader.get_next()
                if entry and reader.test_cursor(cursor):
                    self.resumed_from = "cursor"
                    return  # positioned on the saved entry: get_next() continues after it
            except OSError as exc:
                log.warning("journal cursor unusable (%s); falling back", exc)
            realtime = saved.get("realtime") if saved else None
            if isinstance(realtime, int | float):
                log.warning(
                    "journal cursor no longer exists (vacuumed or rotated away); resuming from "
                    "its timestamp"
                )
                reader.seek_realtime(float(realtime))
                # entries at exactly that time were processed already
                self._skip_until(reader, float(realtime))
                self.resumed_from = "realtime"
                return
        if self.backfill > 0:
            reader.seek_realtime(self.clock.now() - self.backfill)
            self.resumed_from = "backfill"
            return
        reader.seek_tail()
        reader.get_previous()  # portable: positions on the last entry (systemd 252 and later)
        self.resumed_from = "tail"

    def _skip_until(self, reader: Any, realtime: float) -> None:
        while True:
            entry = reader.get_next()
            if not entry:
                return
            if _timestamp(entry, realtime + 1) > realtime:
                reader.get_previous()
                return

    # -- reading ---------------------------------------------------------------------
    def drain(self, reader: Any) -> int:
        """Process every entry available now; save the position; return the count."""
        count = 0
        last: dict[str, Any] | None = None
        for entry in self._entries(reader):
            message = _message(entry)
            if message is not None:
                self.handler.handle(message, _timestamp(entry, self.clock.now()), is_trusted(entry))
            last = entry
            count += 1
        if last is not None:
            self.position.save(
                {
                    "cursor": last.get("__CURSOR"),
                    "realtime": _timestamp(last, self.clock.now()),
                }
            )
        return count

    def scan(self) -> int:
        """Post-mortem: every entry from the start, same trust rules, no position saved."""
        reader = self._open()
        try:
            reader.seek_head()
            count = 0
            for entry in self._entries(reader):
                message = _message(entry)
                if message is not None:
                    self.handler.handle(message, _timestamp(entry, 0.0), is_trusted(entry))
                count += 1
            return count
        finally:
            reader.close()

    @staticmethod
    def _entries(reader: Any) -> Iterator[dict[str, Any]]:
        while True:
            entry = reader.get_next()
            if not entry:
                return
            yield entry

    def run(self) -> None:
        """Read until stopped; an unexpected error restarts the loop (``restart.py``)."""
        run_with_restarts(
            "journald",
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
            reader = self._open()
            self._position(reader)
        except Exception as exc:  # no journal, no permission: report and stop this source
            log.error("journald source unavailable: %s", exc)
            self.status(False, f"cannot open the journal: {exc}")
            return
        self.status(True, f"reading kernel entries (resumed from {self.resumed_from})")
        try:
            while not self._stop.is_set():
                if self.heartbeat is not None:
                    self.heartbeat.beat()
                try:
                    self.drain(reader)
                    self.status(True, f"reading kernel entries (resumed from {self.resumed_from})")
                    reader.wait(0.5)  # NOP, APPEND or INVALIDATE: all mean "look again"
                except OSError as exc:
                    log.warning("journal read error: %s; reopening", exc)
                    self.status(False, f"read error: {exc}")
                    reader.close()
                    self._stop.wait(1.0)
                    reader = self._open()
                    self._position(reader)
        finally:
            reader.close()

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="journald", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)


@dataclass(frozen=True)
class JournaldSection(KindSection):
    """journald's own key of ``sources``."""

    journal_dir: str | None = None  # a journal directory (tests, containers)


def _directory(sources: SourcesConfig) -> str | None:
    return sources.section("journald", JournaldSection).journal_dir


def _build(setup: KernelLogSetup) -> JournaldSource:
    return JournaldSource(
        setup.handler,
        setup.clock,
        directory=_directory(setup.sources),
        position=PositionFile(setup.position_path("journald.json")),
        status=setup.status,
        backfill=setup.sources.backfill,
    )


KIND = KernelLogKind(
    "journald",
    available=lambda sources, backend: bool(_directory(sources)) or journal_available(),
    build=_build,
    section=JournaldSection,
    options={"journal_dir": read_path},
)
