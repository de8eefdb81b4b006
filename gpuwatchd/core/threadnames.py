"""Give the daemon's threads their Python names in the kernel too.

Python (before 3.14) leaves every thread's kernel name as the process name, so ``top -H``,
``ps -T`` and ``/proc/PID/task/*/comm`` show nine identical "gpuwatchd" lines. Writing
``/proc/self/task/TID/comm`` names a thread from any other thread of the process, so the
daemon calls ``publish()`` once its threads run and operators (and ``bench/real_cost.py``)
can tell which one spends the CPU. Best effort: no /proc, no error.
"""

from __future__ import annotations

import threading

KERNEL_NAME_MAX = 15  # TASK_COMM_LEN - 1


def kernel_name(name: str) -> str:
    """``gw-`` plus the thread's name, cut to what the kernel keeps."""
    return ("gw-" + name)[:KERNEL_NAME_MAX]


def publish() -> int:
    """Name every live thread of this process after its Python name; returns how many."""
    named = 0
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or thread is threading.main_thread():
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm", "w", encoding="ascii") as fh:
                fh.write(kernel_name(thread.name.encode("ascii", "replace").decode()))
            named += 1
        except OSError:
            continue
    return named
