"""Journal trouble under the real daemon (journald source on a directory of real journal
files written by systemd-journal-remote, read by python-systemd): rotation in the middle
of a burst, the file the saved cursor points into vacuumed away, a journal file garbled
and cut short while it is being read. The daemon does not crash, pages each fault once,
and every line still on disk is read exactly once."""

from __future__ import annotations

import time
from pathlib import Path

from actions_support import HttpReceiver
from conftest import ROOT, free_port
from fault_support import Daemon, alerts_of, metric, report, wait_until, xid_line
from journal_util import append, kernel_entry, now

EIGHT = ROOT / "scenarios" / "healthy-8xh100.yaml"
CHUNK = 400  # entries per systemd-journal-remote run (each run appends and wakes the reader)


def burst(t0: float, n: int, xids: dict[int, tuple[int, int]]) -> list[dict[str, str]]:
    """``n`` kernel entries 1 ms apart from ``t0``: noise, with an XID at each position
    given in ``xids`` (position -> (gpu, code))."""
    out = []
    for i in range(n):
        gpu_code = xids.get(i)
        msg = xid_line(*gpu_code) if gpu_code else f"eth0: link noise {i}"
        out.append(kernel_entry(msg, t0 + i * 0.001))
    return out


def write(journal: Path, entries: list[dict[str, str]], name: str) -> None:
    for i in range(0, len(entries), CHUNK):
        append(journal, entries[i : i + CHUNK], name)


def lines(d: Daemon) -> float:
    return metric(d.metrics(), "gpuwatchd_kernel_log_lines_total", source="journald")


def xids_counted(d: Daemon) -> float:
    return metric(d.metrics(), "gpuwatchd_xid_errors_total")


def pages(rx: HttpReceiver) -> list[str]:
    """GPUs paged for, in order; a GPU twice is a duplicate page."""
    return [g for name, g, state in alerts_of(rx.requests) if state == "firing"]


def test_rotation_vacuum_and_corruption(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    t = now() - 600  # entries in the recent past, in order
    append(journal, [kernel_entry("Linux version 6.1.0 (boot)", t)], "system.journal")
    rx = HttpReceiver(free_port()).start()
    d = Daemon(
        tmp_path,
        f"""node_name: journal-node
state_dir: {tmp_path / "state"}
poll: {{interval: 500ms, call_timeout: 400ms}}
sources: {{kernel_log: journald, journal_dir: {journal}, nvml_events: false}}
rules: {{files: []}}
receivers:
  - {{name: ops, type: webhook, url: "{rx.url}/hook"}}
routing: {{group_wait: 0s, group_by: [node, gpu]}}
web: {{rate_limit: 0}}
""",
        EIGHT,
    )
    try:
        d.start()
        wait_until(lambda: metric(d.metrics(), "gpuwatchd_source_up", source="journald"), 10,
                   "journald source up")  # fmt: skip

        # 1. a burst of 3200 lines, rotated twice while it is being read; GPUs 0-3 fail,
        #    GPU 0 again and again (the same fault: one page)
        n = 1600
        first = burst(t + 1, n, {10: (0, 79), 500: (1, 48), 900: (0, 48), 1500: (0, 48)})
        second = burst(t + 3, n, {5: (2, 79), 700: (3, 48), 1200: (0, 48)})
        write(journal, first[: n // 2], "system.journal")
        (journal / "system.journal").rename(journal / "system@0001-0000000000000001.journal")
        write(journal, first[n // 2 :] + second[: n // 2], "system.journal")
        (journal / "system.journal").rename(journal / "system@0002-0000000000000801.journal")
        write(journal, second[n // 2 :], "system.journal")
        wait_until(lambda: lines(d) >= 2 * n, 30, f"burst read: {lines(d)} of {2 * n}")
        wait_until(lambda: len(pages(rx)) >= 4, 10, "pages for GPUs 0-3")
        time.sleep(1.0)
        assert lines(d) == 2 * n  # every line once
        assert xids_counted(d) == 7
        assert sorted(pages(rx)) == ["0", "1", "2", "3"], pages(rx)
        assert d.stop() == 0

        # 2. the file the saved cursor points into is vacuumed; a new one is written
        (journal / "system.journal").unlink()
        third = burst(t + 10, 800, {100: (4, 79), 600: (5, 48)})
        write(journal, third, "system.journal")
        d.start()
        wait_until(lambda: lines(d) >= 800, 20, f"after vacuum: {lines(d)} of 800")
        wait_until(lambda: len(pages(rx)) >= 6, 10, "pages for GPUs 4-5")
        time.sleep(1.0)
        assert lines(d) == 800 and xids_counted(d) == 2  # nothing old read again
        assert "resumed from realtime" in d.status()["sources"]["journald"]["detail"]
        assert "cursor no longer exists" in d.output()
        assert sorted(pages(rx)) == [str(g) for g in range(6)], pages(rx)

        # 3. an archived file is garbled and cut short while the reader has it open, and
        #    the log goes on
        archived = journal / "system@0001-0000000000000001.journal"
        size = archived.stat().st_size
        with archived.open("r+b") as fh:
            fh.seek(size // 3)
            fh.write(b"\xde\xad\xbe\xef" * 4096)
            fh.truncate(size // 2)
        fourth = burst(t + 20, 400, {50: (6, 79), 300: (7, 48)})
        write(journal, fourth, "system.journal")
        wait_until(lambda: lines(d) >= 1200, 20, f"after corruption: {lines(d)} of 1200")
        wait_until(lambda: len(pages(rx)) >= 8, 10, "pages for GPUs 6-7")
        assert d.proc is not None and d.proc.poll() is None, d.output()[-3000:]
        assert d.stop() == 0

        # 4. a restart with the damaged file still there: no crash, nothing read twice
        d.start()
        time.sleep(2.0)
        assert metric(d.metrics(), "gpuwatchd_source_up", source="journald") == 1
        assert lines(d) == 0 and xids_counted(d) == 0
        assert sorted(pages(rx)) == [str(g) for g in range(8)], pages(rx)  # one page each
        report(
            "journal_trouble",
            lines_written=2 * n + 800 + 400,
            lines_read=2 * n + 800 + 400,
            pages=len(pages(rx)),
            duplicate_pages=len(pages(rx)) - len(set(pages(rx))),
        )
    finally:
        d.stop()
        rx.stop()
