"""Real journal files for tests, written by systemd-journal-remote from export format."""

from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path

import pytest

JOURNAL_REMOTE = "/usr/lib/systemd/systemd-journal-remote"
BOOT = "0123456789abcdef0123456789abcdef"


def kernel_entry(message: str, ts: float, **extra: str) -> dict[str, str]:
    fields = {
        "__REALTIME_TIMESTAMP": str(int(ts * 1e6)),
        "__MONOTONIC_TIMESTAMP": str(int(ts * 1e6) % 10**12),
        "_BOOT_ID": BOOT,
        "_HOSTNAME": "gpu-node-17",
        "_TRANSPORT": "kernel",
        "SYSLOG_FACILITY": "0",
        "SYSLOG_IDENTIFIER": "kernel",
        "PRIORITY": "4",
        "MESSAGE": message,
    }
    fields.update(extra)
    return fields


def forged_entry(message: str, ts: float, transport: str) -> dict[str, str]:
    """A local user claiming to be the kernel (SYSLOG_* are user fields)."""
    return kernel_entry(message, ts, _TRANSPORT=transport, _UID="1000", _PID="4242")


def append(journal_dir: Path, entries: list[dict[str, str]], name: str = "test.journal") -> None:
    """Append entries to journal_dir/NAME (created on first use)."""
    if not Path(JOURNAL_REMOTE).exists():
        pytest.fail(f"{JOURNAL_REMOTE} missing: apt-get install systemd-journal-remote")
    journal_dir.mkdir(parents=True, exist_ok=True)
    data = b"".join(b"".join(_export_field(k, v) for k, v in e.items()) + b"\n" for e in entries)
    result = subprocess.run(
        [JOURNAL_REMOTE, f"--output={journal_dir / name}", "-"],
        input=data,
        capture_output=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert f"writing {len(entries)} entries" in result.stderr.decode(), result.stderr.decode()


def _export_field(key: str, value: str) -> bytes:
    """One field in journal export format; values with a newline use the binary form."""
    raw = value.encode()
    if b"\n" not in raw:
        return key.encode() + b"=" + raw + b"\n"
    return key.encode() + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"


def now() -> float:
    return time.time()
