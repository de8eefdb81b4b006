"""Application XIDs counted as independent episodes, not lines (issue 22 item 8)."""

from __future__ import annotations

from gpuwatchd.core.records import XidEvent
from gpuwatchd.rules.conditions.xid import count_episodes


def line(t: float, pid: int | None, process: str | None = "python3") -> XidEvent:
    return XidEvent(t, "kmsg", 31, gpu=0, pid=pid, process=process)


def test_one_process_storm_is_one_episode() -> None:
    assert count_episodes([line(t, 9157) for t in range(0, 1200, 30)], 600.0) == 1


def test_other_processes_and_quiet_gaps_start_episodes() -> None:
    events = [line(0, 1), line(5, 2), line(10, 1), line(700, 1), line(710, None, None)]
    # pid 1 at 0 and 10 (one), pid 2 (two), pid 1 again after 11 quiet minutes (three),
    # a line that names no process (four)
    assert count_episodes(events, 600.0) == 4
    # without a pid the process name tells processes apart
    named = [line(0, None, "a"), line(1, None, "b"), line(2, None, "a")]
    assert count_episodes(named, 600.0) == 2
