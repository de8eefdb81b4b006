"""The /dev/kmsg source: facility-0 trust, resume by sequence number, the real device."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.kernel.cursor import PositionFile
from gpuwatchd.sources.kernel.kmsg import KmsgSource
from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler
from gpuwatchd.testing.fake_backend import make_infos

# Record framing as /dev/kmsg gives it (PRIO,SEQ,USEC,FLAGS;MESSAGE, dictionary lines start
# with a space); the XID 31 text follows the real line captured on the lent H100
# (docs/real-gpu.md). The second record is what root gets when writing the same text to
# /dev/kmsg: the kernel stamps user writes with facility 1 (prio 12 = 1<<3 | 4).
RECORDS = [
    "6,1201,5123456789,-;nvidia-nvswitch: probe skipped",
    "4,1202,5123457000,c;NVRM: Xid (PCI:0000:2a:00): 31, pid=9157, name=python3, "
    "channel 0x00000002, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted "
    "@ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
    " SUBSYSTEM=pci",
    " DEVICE=+pci:0000:2a:00.0",
    "12,1203,5123458000,-;NVRM: Xid (PCI:0000:2a:00): 79, pid=1, name=forged, GPU has fallen "
    "off the bus.",
    "4,1204,5123459000,-;NVRM: Xid (PCI:0000:9a:00): 48, pid='<unknown>', name=<unknown>, "
    "An uncorrectable double bit error (DBE) has been detected on GPU",
]


def run_file(
    tmp_path: Path, records: list[str], boot_id: str = "boot-a"
) -> tuple[KmsgSource, list[XidEvent]]:
    dump = tmp_path / "kmsg.txt"
    dump.write_text("\n".join(records) + "\n")
    events: list[XidEvent] = []
    handler = KernelLineHandler("kmsg", GpuResolver(make_infos(8)), events)
    source = KmsgSource(
        handler,
        SystemClock(),
        path=str(dump),
        position=PositionFile(str(tmp_path / "kmsg.json")),
        boot_id=boot_id,
    )
    source.start()
    deadline = time.monotonic() + 5
    while source.last_seq < max(int(r.split(",")[1]) for r in records if r[0] != " "):
        assert time.monotonic() < deadline, "records not read"
        time.sleep(0.01)
    source.stop()
    return source, events


def test_only_facility_zero_records_count(tmp_path: Path) -> None:
    source, events = run_file(tmp_path, RECORDS)
    assert [(e.xid, e.gpu, e.pid, e.process) for e in events] == [
        (31, 1, 9157, "python3"),
        (48, 4, None, None),
    ]
    assert source.handler.counters.forged == 1
    assert source.handler.counters.lines == 4


def test_resume_by_sequence_within_a_boot(tmp_path: Path) -> None:
    run_file(tmp_path, RECORDS[:2])
    _, events = run_file(tmp_path, RECORDS)
    assert [e.xid for e in events] == [48]  # 31 was handled before the restart
    _, after_reboot = run_file(tmp_path, RECORDS, boot_id="boot-b")
    assert [e.xid for e in after_reboot] == [31, 48]


def real_device_source() -> tuple[KmsgSource, list[tuple[bool, str]]]:
    """A started reader of the real /dev/kmsg (read only: tests never write to it)."""
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.fail("/dev/kmsg is not readable: run the tests as root (CI does)")
    states: list[tuple[bool, str]] = []
    handler = KernelLineHandler("kmsg", GpuResolver(make_infos(8)), [])
    source = KmsgSource(handler, SystemClock(), status=lambda up, d: states.append((up, d)))
    source.start()
    return source, states


def test_real_device_opens_and_reports_up(tmp_path: Path) -> None:
    source, states = real_device_source()
    time.sleep(0.7)
    source.stop()
    assert states and states[0] == (True, "reading /dev/kmsg")
    assert all(up for up, _ in states)


def test_an_idle_device_reader_sleeps_until_a_record_or_stop(tmp_path: Path) -> None:
    """Idle, the reader turns once per IDLE_POLL_MS (5 s), not twice a second; stop()
    still ends it at once through its wake-up pipe."""
    source, states = real_device_source()
    time.sleep(1.6)
    started = time.monotonic()
    source.stop()
    assert time.monotonic() - started < 3.0  # not the 5 s idle turn: woken by the pipe
    assert source._thread is not None and not source._thread.is_alive()
    assert 1 <= len(states) <= 2, states  # one idle turn (two if a record came), not 4
    assert source._wake_w is None  # the pipe is closed with the reader
