"""When a page arrives and when the daemon read its XID: the first-page latency tests'
clocks (tests/actions/test_actions_first_page.py, tests/sources/test_first_page_merged.py)."""

from __future__ import annotations

import time

from actions_support import HttpReceiver


def read_at(log: str, gpu: int) -> float:
    """When the daemon logged reading an XID for ``gpu`` (epoch seconds)."""
    for line in log.splitlines():
        if f"XID 79 on GPU {gpu} " in line:
            stamp, ms = line[:23].split(",")
            return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(ms) / 1000
    raise AssertionError(f"the daemon did not log reading the XID for GPU {gpu}:\n{log}")


def first_firing(rx: HttpReceiver, gpu: str, timeout: float = 10.0) -> float:
    """When the first message with a firing alert for ``gpu`` arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in list(rx.requests):
            if any(
                a["status"] == "firing" and a["labels"].get("gpu") == gpu
                for a in r.json()["alerts"]
            ):
                return r.at
        time.sleep(0.005)
    raise AssertionError(f"no page for GPU {gpu}: {[r.json() for r in rx.requests]}")
