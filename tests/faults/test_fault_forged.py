"""Forged faults: "NVRM: Xid" lines that a local user (or root, through /dev/kmsg) can put
into the logs must never page or drain. Through the real daemon and the real journal path
(journal files written by systemd-journal-remote, read by python-systemd) and the kmsg
path (a file of /dev/kmsg records; this machine's real kernel log is never written).

Each test ends with one genuine kernel XID, which must page once and drain once: the
pipeline was listening all along, so the zeros before it mean something."""

from __future__ import annotations

import stat
import time
from pathlib import Path

from actions_support import HttpReceiver
from conftest import free_port
from fault_support import (
    STEADY,
    Daemon,
    KmsgFile,
    alerts_of,
    metric,
    report,
    wait_until,
    xid_line,
)
from journal_util import append, forged_entry, kernel_entry, now

HOOK = """#!/bin/sh
env | grep '^GPUWATCHD_' | sort >> {log}
echo --- >> {log}
"""
PER_KIND = 25  # forged lines per way of forging


def config(tmp_path: Path, sources: str, url: str) -> str:
    log = tmp_path / "drain-hook.log"
    hook = tmp_path / "drain-hook"
    hook.write_text(HOOK.format(log=log))
    hook.chmod(hook.stat().st_mode | stat.S_IXUSR)
    return f"""node_name: forged-node
state_dir: {tmp_path / "state"}
poll: {{interval: 500ms, call_timeout: 400ms}}
sources: {sources}
rules: {{files: []}}   # the shipped rules: XID 48/79 page and drain
receivers:
  - {{name: ops, type: webhook, url: "{url}/hook"}}
routing: {{group_wait: 0s, group_by: [node, gpu]}}
drain:
  mode: exec
  exec: {{command: ["{hook}"]}}
  state_file: {tmp_path / "health.json"}
"""


def drains(tmp_path: Path) -> list[str]:
    log = tmp_path / "drain-hook.log"
    if not log.exists():
        return []
    return [c for c in log.read_text().split("---\n") if c.strip()]


def forged_messages() -> list[str]:
    """XID-looking lines for every GPU and a few codes, with the tricks people try."""
    out = []
    for i in range(PER_KIND):
        gpu = i % 4
        code = (79, 48, 94, 95, 119)[i % 5]
        line = xid_line(gpu, code)
        if i % 3 == 1:
            line = "kernel: [ 1234.5678] " + line  # a copied dmesg line
        if i % 7 == 2:
            line = "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."
        out.append(line)
    return out


def check_quiet_then_real(d: Daemon, rx: HttpReceiver, tmp_path: Path, source: str) -> int:
    """No page, no drain, every forgery counted; returns the forged count."""
    text = d.metrics()
    forged = metric(text, "gpuwatchd_kernel_log_forged_lines_total", source=source)
    assert metric(text, "gpuwatchd_kernel_log_xid_lines_total", source=source) == 0
    assert metric(text, "gpuwatchd_xid_errors_total") == 0
    assert metric(text, "gpuwatchd_alert_transitions_received_total") == 0
    assert metric(text, "gpuwatchd_drain_actions_total") == 0
    assert rx.requests == [] and drains(tmp_path) == []
    status = d.status()
    assert status["drain"]["state"] == "ok" and status["deliveries"]["firing"] == []
    # one warning, not one per line: a flood of forgeries must not flood the journal
    assert d.output().count("ignored a forged XID line") == 1
    return int(forged)


def test_forged_journal_entries_never_page_or_drain(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    t = now()
    append(journal, [kernel_entry("Linux version 6.1.0 (boot noise)", t - 5)])
    rx = HttpReceiver(free_port()).start()
    sources = f"{{kernel_log: journald, journal_dir: {journal}, nvml_events: false}}"
    d = Daemon(tmp_path, config(tmp_path, sources, rx.url), STEADY)
    try:
        d.start()
        wait_until(
            lambda: metric(d.metrics(), "gpuwatchd_source_up", source="journald") == 1, 10, "up"
        )
        entries = []
        for i, message in enumerate(forged_messages()):
            ts = t + i * 0.001
            entries += [
                forged_entry(message, ts, "syslog"),  # logger "NVRM: Xid ..."
                forged_entry(message, ts, "journal"),  # logger --journald, identifier kernel
                forged_entry(message, ts, "stdout"),  # a service printing it
                kernel_entry(message, ts, SYSLOG_FACILITY="1"),  # root writing /dev/kmsg
            ]
        append(journal, entries)
        total = 4 * PER_KIND
        wait_until(
            lambda: (
                metric(d.metrics(), "gpuwatchd_kernel_log_lines_total", source="journald") >= total
            ),
            15,
            "every entry read",
        )
        time.sleep(2.0)  # a few rule evaluations and delivery rounds
        forged = check_quiet_then_real(d, rx, tmp_path, "journald")
        assert forged == total, forged

        append(journal, [kernel_entry(xid_line(2, 79), now())])  # the kernel itself
        wait_until(lambda: drains(tmp_path), 15, f"real XID drains: {d.output()[-3000:]}")
        wait_until(lambda: rx.requests, 10, "real XID pages")
        time.sleep(1.0)
        assert [a for a in alerts_of(rx.requests)] == [("GpuXidFatal", "2", "firing")]
        assert len(drains(tmp_path)) == 1 and "GPUWATCHD_GPU=2" in drains(tmp_path)[0]
        report("forged_journal", forged=forged, pages=0, drains=0, real_pages=1, real_drains=1)
    finally:
        d.stop()
        rx.stop()


def test_forged_kmsg_records_never_page_or_drain(tmp_path: Path) -> None:
    kmsg = KmsgFile(tmp_path / "kmsg.dump")
    rx = HttpReceiver(free_port()).start()
    sources = f"{{kernel_log: kmsg, kmsg_path: {kmsg.path}, nvml_events: false}}"
    d = Daemon(tmp_path, config(tmp_path, sources, rx.url), STEADY)
    try:
        d.start()
        messages = forged_messages()
        kmsg.append(*messages, facility=1)  # what the kernel makes of a user-space write
        kmsg.append(*messages[:5], facility=3)  # ... and of one claiming the daemon facility
        # an escaped newline must not smuggle a second (facility 0) record in
        kmsg.append(xid_line(1, 79) + "\\x0a4,999,1,-;" + xid_line(1, 79), facility=1)
        total = len(messages) + 5 + 1
        wait_until(
            lambda: metric(d.metrics(), "gpuwatchd_kernel_log_lines_total", source="kmsg") >= total,
            15,
            "every record read",
        )
        time.sleep(2.0)
        forged = check_quiet_then_real(d, rx, tmp_path, "kmsg")
        assert forged == total, forged

        kmsg.xid(3, 48)  # facility 0: only the kernel writes these
        wait_until(lambda: drains(tmp_path), 15, "real XID drains")
        wait_until(lambda: rx.requests, 10, "real XID pages")
        time.sleep(1.0)
        assert alerts_of(rx.requests) == [("GpuXidFatal", "3", "firing")]
        assert len(drains(tmp_path)) == 1 and "GPUWATCHD_XID=48" in drains(tmp_path)[0]
        report("forged_kmsg", forged=forged, pages=0, drains=0, real_pages=1, real_drains=1)
    finally:
        d.stop()
        rx.stop()


# Kernel messages that echo text a user chose, with a report inside: they carry the
# kernel's transport and facility 0, so only the record's shape can tell them apart.
# The first is the unprivileged `unshare -rm mount -t tmpfs -o "$(printf 'x\nNVRM: ...')"`.
ECHOES = [
    "tmpfs: Unknown parameter 'x\n" + xid_line(0, 79) + "\ny'",
    'EXT4-fs (loop0): Unrecognized mount option "' + xid_line(1, 48) + '" or missing value',
    "usb 1-1: Product: " + xid_line(2, 79),
    'audit: type=1400 apparmor="DENIED" name="/tmp/\n'
    'NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus."',
    "loop0: detected capacity change\nnvidia-nvswitch0: SXid (PCI:0000:18:00.0): 12028, Data",
]


def _kmsg_escaped(message: str) -> str:
    return message.replace("\n", "\\x0a")


def test_kernel_messages_echoing_user_text_never_page_or_drain(tmp_path: Path) -> None:
    """Issue 15 item 1: failed on main (the tmpfs record paged and drained GPU 0)."""
    journal = tmp_path / "journal"
    kmsg = KmsgFile(tmp_path / "kmsg.dump")
    t = now()
    append(journal, [kernel_entry("Linux version 6.1.0 (boot noise)", t - 5)])
    rx = HttpReceiver(free_port()).start()
    sources = f"{{kernel_log: journald, journal_dir: {journal}, nvml_events: false}}"
    d = Daemon(tmp_path, config(tmp_path, sources, rx.url), STEADY)
    try:
        d.start()
        wait_until(
            lambda: metric(d.metrics(), "gpuwatchd_source_up", source="journald") == 1, 10, "up"
        )
        append(journal, [kernel_entry(m, t + i * 0.001) for i, m in enumerate(ECHOES)])
        wait_until(
            lambda: (
                metric(d.metrics(), "gpuwatchd_kernel_log_lines_total", source="journald")
                >= len(ECHOES)
            ),
            15,
            "every entry read",
        )
        time.sleep(2.0)
        assert check_quiet_then_real(d, rx, tmp_path, "journald") == len(ECHOES)
        append(journal, [kernel_entry(xid_line(2, 79), now())])
        wait_until(lambda: drains(tmp_path), 15, f"real XID drains: {d.output()[-3000:]}")
        assert len(drains(tmp_path)) == 1 and "GPUWATCHD_GPU=2" in drains(tmp_path)[0]
    finally:
        d.stop()
        rx.stop()

    kmsg_dir = tmp_path / "k"
    kmsg_dir.mkdir()
    kmsg = KmsgFile(kmsg_dir / "kmsg.dump")
    rx = HttpReceiver(free_port()).start()
    sources = f"{{kernel_log: kmsg, kmsg_path: {kmsg.path}, nvml_events: false}}"
    d = Daemon(kmsg_dir, config(kmsg_dir, sources, rx.url), STEADY)
    try:
        d.start()
        kmsg.append(*[_kmsg_escaped(m) for m in ECHOES], facility=0)
        wait_until(
            lambda: (
                metric(d.metrics(), "gpuwatchd_kernel_log_lines_total", source="kmsg")
                >= len(ECHOES)
            ),
            15,
            "every record read",
        )
        time.sleep(2.0)
        assert check_quiet_then_real(d, rx, kmsg_dir, "kmsg") == len(ECHOES)
        kmsg.xid(3, 48)
        wait_until(lambda: drains(kmsg_dir), 15, "real XID drains")
        assert len(drains(kmsg_dir)) == 1 and "GPUWATCHD_XID=48" in drains(kmsg_dir)[0]
        report("kernel_echo_forgery", forged=len(ECHOES) * 2, pages=0, drains=0)
    finally:
        d.stop()
        rx.stop()
