"""`gpuwatchd xid scan`: post-mortem over copied journal files and kmsg dumps, with the
daemon's trust rules."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import GPUWATCHD, ROOT
from journal_util import append, forged_entry, kernel_entry, now

XID79 = (
    "NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)
XID48 = "NVRM: Xid (PCI:0000:5d:00): 48, pid=2011, name=python3, An uncorrectable double bit error"


def scan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, "xid", "scan", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


def test_scan_journal_directory_applies_trust_rules(tmp_path: Path) -> None:
    t = now() - 3600
    append(
        tmp_path / "j",
        [
            kernel_entry(
                "NVRM: GPU at PCI:0000:3a:00: GPU-1d7ad7b1-5c2f-4b8e-9d51-0c7d3a6e2f10", t
            ),
            kernel_entry(XID79, t + 1),
            forged_entry(XID48, t + 2, "journal"),
            kernel_entry(XID48, t + 3, SYSLOG_FACILITY="1"),
            kernel_entry(XID48, t + 4),
        ],
    )
    result = scan("--journal", str(tmp_path / "j"))
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["xid"], r["pci"], r["pid"]) for r in reports] == [
        (79, "00000000:3A:00.0", None),
        (48, "00000000:5D:00.0", 2011),
    ]
    assert reports[0]["uuid"] == "GPU-1d7ad7b1-5c2f-4b8e-9d51-0c7d3a6e2f10"
    assert reports[0]["severity"] and reports[0]["action"]
    assert reports[0]["time"].startswith("20")
    assert "2 trusted XID reports, 2 forged XID lines ignored" in result.stderr
    # a single .journal file works too
    single = scan("--journal", str(tmp_path / "j" / "test.journal"))
    assert single.stdout == result.stdout


def test_scan_kmsg_dump(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg.txt"
    dump.write_text("4,10,5000000,-;" + XID48 + "\n SUBSYSTEM=pci\n12,11,5000100,-;" + XID79 + "\n")
    result = scan("--kmsg", str(dump))
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["xid"], r["seconds_since_boot"]) for r in reports] == [(48, 5.0)]
    assert "1 forged XID lines ignored" in result.stderr


def test_scan_missing_path_fails_clearly(tmp_path: Path) -> None:
    result = scan("--kmsg", str(tmp_path / "nope"))
    assert result.returncode == 1
    assert "nope" in result.stderr
