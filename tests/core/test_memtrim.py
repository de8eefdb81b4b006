"""Start-up's freed heap goes back to the kernel (glibc's malloc_trim)."""

from __future__ import annotations

import subprocess
import sys

from gpuwatchd.core import memtrim

CHURN = r"""
import re, sys
from gpuwatchd.core import memtrim
def rss():
    return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read())[1])
keep = []
blobs = [bytearray(4096) for _ in range(20000)]  # 80 MiB of heap chunks
for i in range(0, len(blobs), 100):
    keep.append(blobs[i])  # one in a hundred stays: the heap top never frees
del blobs
before = rss()
assert memtrim.trim()
print(before, rss())
"""


def test_trim_runs_on_glibc() -> None:
    assert memtrim.trim() is True


def test_trim_returns_freed_holes_in_the_heap() -> None:
    res = subprocess.run(
        [sys.executable, "-c", CHURN],
        capture_output=True,
        text=True,
        check=True,
        env={"MALLOC_ARENA_MAX": "1", "PATH": "/usr/bin:/bin"},
    )
    before, after = (int(x) for x in res.stdout.split())
    assert before - after > 40 * 1024, (before, after)  # KiB: most of the 80 MiB comes back
