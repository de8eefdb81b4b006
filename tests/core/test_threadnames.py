"""The daemon's threads carry their names into the kernel (top -H, ps -T, /proc)."""

from __future__ import annotations

import threading
from pathlib import Path

from gpuwatchd.core import threadnames


def test_kernel_name_is_prefixed_and_cut_to_fifteen_bytes() -> None:
    assert threadnames.kernel_name("poll-0") == "gw-poll-0"
    assert threadnames.kernel_name("a-very-long-thread-name") == "gw-a-very-long-"


def test_publish_names_a_running_thread_in_proc() -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="evaluate", daemon=True)
    thread.start()
    try:
        assert threadnames.publish() >= 1
        comm = Path(f"/proc/self/task/{thread.native_id}/comm").read_text().strip()
        assert comm == "gw-evaluate"
    finally:
        stop.set()
        thread.join()
