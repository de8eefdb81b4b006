"""Issue 26 (low): a process name holding ", " and terminal escapes. The driver prints
``pid=%s, name=%s, %s`` with the name the kernel keeps (``current->comm``, at most 15 bytes;
open-gpu-kernel-modules kernel_rc.c, krcReportXid), so the name field is cut where a name
that short ends and the driver's message starts; what the daemon logs is escaped."""

from __future__ import annotations

import time
from pathlib import Path

from fault_support import Daemon, KmsgFile, fault_config, wait_until

from gpuwatchd.xid.parser import parse_line, parse_record

# A program that named itself "a, <OSC retitle><BEL><SGR bold>b" (14 bytes: a legal comm).
EVIL = "a, \x1b]0;x\x07\x1b[1mb"
MESSAGE = "channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted"
LINE = f"NVRM: Xid (PCI:0000:2a:00): 31, pid=4242, name={EVIL}, {MESSAGE}"


def test_a_name_with_a_comma_stays_whole_and_the_message_stays_the_drivers() -> None:
    for parsed in (parse_line(LINE), parse_record(LINE)):
        assert parsed is not None
        assert parsed.process == "a, \\x1b]0;x\\x07\\x1b[1mb"  # whole, escaped
        assert parsed.message == MESSAGE
    # ordinary names and messages are cut as before
    plain = parse_line(
        "NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, Ch 00000008, "
        "errorString CTX SWITCH TIMEOUT, Info 0x58005"
    )
    assert plain is not None and plain.process == "pt_main_thread"
    assert plain.message == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"
    short = parse_line("NVRM: Xid (PCI:0000:cb:00): 43, pid=7, name=py, Ch 00000010")
    assert short is not None and (short.process, short.message) == ("py", "Ch 00000010")
    # a name no comm can be (over 15 bytes) keeps the first cut
    long = parse_line("NVRM: Xid (PCI:0000:cb:00): 31, pid=7, name=abcdefgh, ijklmnop, Ch 00000010")
    assert long is not None and long.process == "abcdefgh"


def test_the_daemon_logs_no_raw_escape_from_a_process_name(tmp_path: Path) -> None:
    kmsg = KmsgFile(tmp_path / "kmsg.dump")
    d = Daemon(tmp_path, fault_config(tmp_path / "state", kmsg.path), None)
    try:
        d.start()
        # /dev/kmsg writes a control character of a record as \xNN; the source undoes it
        escaped = LINE.replace("\x1b", "\\x1b").replace("\x07", "\\x07")
        kmsg.append(escaped)
        wait_until(lambda: "XID 31 on GPU" in d.output(), 20, "the XID logged")
        time.sleep(0.5)
        out = d.output()
    finally:
        d.stop()
    assert "\x1b" not in out and "\x07" not in out
    line = next(x for x in out.splitlines() if "XID 31 on GPU" in x)
    assert f"via kmsg: {MESSAGE} xid=31" in line
