"""A kernel-log reader that dies is seen and restarted (issue 15 item 10).

On main, an unexpected error in the journald or kmsg reader (there: a number of more than
4300 digits in a trusted line) ended its thread like a clean stop: the heartbeat was
closed, ``/healthz`` stayed ok and every later XID was ignored. Both tests fail on main."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.families import Families
from gpuwatchd.core.heartbeat import HeartbeatRegistry
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.kernel.cursor import PositionFile
from gpuwatchd.sources.kernel.kmsg import KmsgSource
from gpuwatchd.sources.kernel.linehandler import (
    GpuResolver,
    KernelLineHandler,
    kernel_log_families,
)
from gpuwatchd.testing.fake_backend import make_infos

XID = "4,{seq},{seq}000,-;NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus."


def wait_for(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := cond()):
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.02)
    return value


class FailingOnce(PositionFile):
    """The position file's first save raises an error nobody planned for (a bug in any
    code the loop runs stands for all of them)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.failed = False

    def save(self, data: dict[str, Any]) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("unexpected failure in the read loop")
        super().save(data)


def test_a_crashed_reader_is_reported_and_restarted(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg.txt"
    dump.write_text(XID.format(seq=1) + "\n")
    events: list[XidEvent] = []
    states: list[tuple[bool, str]] = []
    handler = KernelLineHandler("kmsg", GpuResolver(make_infos(8)), events)
    registry = HeartbeatRegistry(SystemClock())
    source = KmsgSource(
        handler,
        SystemClock(),
        path=str(dump),
        position=FailingOnce(str(tmp_path / "kmsg.json")),
        status=lambda up, detail: states.append((up, detail)),
        boot_id="b",
    )
    source.heartbeat = registry.register("kernel-log-kmsg", 30.0)
    source.start()
    try:
        # the crash is visible at once: health (heartbeat check), status, metric
        stalls = wait_for(registry.check, 5, "the crash reported by the heartbeat")
        assert [s.name for s in stalls] == ["kernel-log-kmsg"]
        assert "reader crashed (RuntimeError: unexpected failure" in str(stalls[0])
        assert any(not up and "reader crashed" in d for up, d in states), states
        fams = Families()
        kernel_log_families([handler], fams)
        assert 'gpuwatchd_kernel_log_errors_total{source="kmsg"} 1.0' in fams.render().decode()
        # ... and the reader comes back: later XIDs are read, health recovers
        with dump.open("a") as fh:
            fh.write(XID.format(seq=2) + "\n")
        wait_for(lambda: len(events) == 2, 10, "both XIDs after the restart")
        wait_for(lambda: not registry.check(), 5, "the heartbeat healthy again")
        assert states[-1][0] is True
    finally:
        source.stop()
    assert registry.names() == []  # a clean stop unregisters


def test_a_poison_message_is_skipped_not_fatal() -> None:
    """A message whose handling raises is counted and skipped; the next one is read."""
    events: list[XidEvent] = []

    class Consumer:
        def append(self, event: XidEvent) -> None:
            if not events and event.xid == 79:
                events.append(event)
                raise ValueError("a consumer bug on the first XID")
            events.append(event)

    handler = KernelLineHandler("journald", GpuResolver(make_infos(8)), Consumer())
    line = "NVRM: Xid (PCI:0000:2a:00): {}, text"
    assert handler.handle(line.format(79), 1.0, True) is None
    assert handler.counters.errors == 1
    assert handler.handle(line.format(48), 2.0, True) is not None
    assert [e.xid for e in events] == [79, 48]
