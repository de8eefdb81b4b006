"""The standard ``process_*`` metrics of the daemon itself, read at scrape time.

The names and meanings are those of every Prometheus client library (CPU seconds,
resident and virtual memory, start time, open and maximum file descriptors), so the
usual "exporter process" dashboards and alerts work on gpuwatchd too.

They cost little: CPU time comes from ``os.times()`` (no file read), memory from one
read of ``/proc/self/statm``, open descriptors from one listing of ``/proc/self/fd``;
the start time and the page size are read once. Where ``/proc`` is missing (not Linux)
the memory and descriptor series are left out rather than reported as 0. The root of
``/proc`` is a parameter so tests can point it at captured files.
"""

from __future__ import annotations

import os
import resource
import time

from gpuwatchd.core.families import Families

__all__ = ["ProcessMetrics"]


def _boot_time(proc: str) -> float | None:
    try:
        with open(os.path.join(proc, "stat"), encoding="ascii") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def _start_time(proc: str, pid: str) -> float | None:
    """Seconds since the epoch when the process started (field 22 of ``stat``)."""
    boot = _boot_time(proc)
    if boot is None:
        return None
    try:
        with open(os.path.join(proc, pid, "stat"), encoding="utf-8", errors="replace") as f:
            text = f.read()
        # the command name (field 2) may hold spaces and parentheses: split after its end
        fields = text[text.rindex(")") + 2 :].split()
        ticks = float(fields[19])
    except (OSError, ValueError, IndexError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


class ProcessMetrics:
    """Adds the ``process_*`` families of one process (default: this one)."""

    def __init__(self, proc: str = "/proc", pid: str = "self") -> None:
        self.proc = proc
        self.pid = pid
        self._statm = os.path.join(proc, pid, "statm")
        self._fd_dir = os.path.join(proc, pid, "fd")
        self._page = os.sysconf("SC_PAGE_SIZE")
        started = _start_time(proc, pid)
        self.start_time = started if started is not None else time.time()

    def add(self, fams: Families) -> None:
        t = os.times()
        fams.get(
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            [],
        ).add([], t.user + t.system)
        try:
            with open(self._statm, encoding="ascii") as f:
                size, resident = f.read().split()[:2]
        except (OSError, ValueError):
            pass
        else:
            fams.get(
                "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", []
            ).add([], float(int(size) * self._page))
            fams.get(
                "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", []
            ).add([], float(int(resident) * self._page))
        fams.get(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            [],
        ).add([], self.start_time)
        try:
            open_fds = len(os.listdir(self._fd_dir))
        except OSError:
            pass
        else:
            fams.get("process_open_fds", "gauge", "Number of open file descriptors.", []).add(
                [], float(open_fds)
            )
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY:
            fams.get(
                "process_max_fds", "gauge", "Maximum number of open file descriptors.", []
            ).add([], float(soft))

    def render(self) -> bytes:
        fams = Families()
        self.add(fams)
        return fams.render()
