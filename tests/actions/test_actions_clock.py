"""Issue 15 item 2: a wall-clock step never loses nor delays a page. Retries, backoff,
expiry, group windows and repeats run on the clock's monotonic reading; payload
timestamps stay on the wall clock.

Before the fix every timer was on the wall clock: stepped +2 days, pending pages were
dropped as ``expired``; stepped -1 h, a retry or a group window waited an hour more."""

from __future__ import annotations

from pathlib import Path

from actions_support import HttpReceiver, make_config, sink_for, transition
from conftest import free_port

from gpuwatchd.actions import ActionsSink
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.families import Families
from gpuwatchd.testing.clocks import SteppedClock


def down_then_up(tmp_path: Path, routing: str) -> tuple[HttpReceiver, ActionsSink, SteppedClock]:
    port = free_port()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: 'http://127.0.0.1:{port}/'}}\n"
        f"routing:\n{routing}",
    )
    clock = SteppedClock()
    return HttpReceiver(port), sink_for(config, clock), clock


def test_wall_clock_two_days_ahead_does_not_expire_a_pending_page(tmp_path: Path) -> None:
    rx, sink, clock = down_then_up(
        tmp_path, "  group_wait: 0s\n  retry_initial: 10s\n  give_up_after: 1h\n"
    )
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()  # the receiver is down: attempt 1 fails
        assert sink.pending() == 1
        clock.step_wall(2 * 86400.0)
        clock.advance(10.0)
        rx.start()
        sink.run_pending()
        assert len(rx.requests) == 1, "the page was dropped as expired"
        assert sink.pending() == 0
        assert 'reason="expired"} 0.0' in _metrics(sink)
    finally:
        sink.close()
        rx.stop()


def test_wall_clock_one_hour_back_does_not_hold_a_retry(tmp_path: Path) -> None:
    rx, sink, clock = down_then_up(tmp_path, "  group_wait: 0s\n  retry_initial: 2s\n")
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()  # fails; the retry is due within 2 s
        clock.step_wall(-3600.0)
        clock.advance(2.0)
        rx.start()
        sink.run_pending()
        assert len(rx.requests) == 1, "the retry waits for the wall clock to catch up"
    finally:
        sink.close()
        rx.stop()


def test_wall_clock_steps_do_not_move_group_windows_or_repeats(tmp_path: Path) -> None:
    rx, sink, clock = down_then_up(tmp_path, "  group_wait: 30s\n  repeat_interval: 1h\n")
    rx.start()
    try:
        sink.deliver([transition("gpu_xid_fatal", at=clock.now())], clock.now())
        sink.run_pending()
        assert len(rx.requests) == 1  # the first message of a new group: at once
        clock.advance(1.0)
        ticket = transition("nvlink_errors", severity=AlertSeverity.TICKET, at=clock.now())
        sink.deliver([ticket], clock.now())  # a ticket: folded (a page would leave at once)
        clock.step_wall(-3600.0)
        clock.advance(29.0)  # the window ends on the monotonic clock
        sink.run_pending()
        assert len(rx.requests) == 2, "the update waits for the wall clock"
        update = rx.requests[1].json()
        assert update["alerts"][1]["startsAt"].startswith("2026-01-01T00:00:01")  # wall time
        clock.step_wall(2 * 86400.0)
        sink.run_pending()
        assert len(rx.requests) == 2, "a wall step of two days is not a repeat interval"
        clock.advance(3600.0)
        sink.run_pending()
        assert len(rx.requests) == 3 and rx.requests[2].json()["status"] == "firing"
    finally:
        sink.close()
        rx.stop()


def _metrics(sink: ActionsSink) -> str:
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    return fams.render().decode()


def test_timers_survive_a_reboot_that_restarts_the_monotonic_clock(tmp_path: Path) -> None:
    """The outbox keeps monotonic deadlines; after a reboot the monotonic clock starts
    again near 0 and the stored deadlines move with it (not held for the old uptime)."""
    rx, sink, clock = down_then_up(tmp_path, "  group_wait: 0s\n  retry_initial: 4s\n")
    try:
        clock.advance(86400.0)  # a day of uptime
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()  # fails; retry within 4 s
        sink.close()
        booted = SteppedClock(clock.now() + 600.0)  # ten minutes later, monotonic at 0
        sink = sink_for(sink.config, booted)
        rx.start()
        booted.advance(4.0)
        sink.run_pending()
        assert len(rx.requests) == 1
    finally:
        sink.close()
        rx.stop()


def test_an_outbox_with_wall_clock_timers_is_converted_once(tmp_path: Path) -> None:
    """An outbox written by the previous version kept its timers on the wall clock."""
    import sqlite3

    rx, sink, clock = down_then_up(tmp_path, "  group_wait: 0s\n  retry_initial: 4s\n")
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()  # fails
        sink.close()
        db = sqlite3.connect(Path(sink.config.state_dir) / "actions.db")
        wall = clock.now()
        with db:  # what the previous version wrote: wall-clock timers, no timer_clock
            db.execute("UPDATE deliveries SET created=?, next_attempt=?", (wall - 60.0, wall + 4.0))
            db.execute("DELETE FROM meta WHERE key IN ('timer_clock', 'mono_last')")
        db.close()
        later = SteppedClock(wall)
        sink = sink_for(sink.config, later)
        (row,) = sink.status().as_json()["deliveries"]["queue"]
        assert row["age_seconds"] == 60.0
        assert row["next_attempt"] == wall + 4.0
        rx.start()
        sink.run_pending()
        assert not rx.requests  # not due yet
        later.advance(4.0)
        sink.run_pending()
        assert len(rx.requests) == 1
    finally:
        sink.close()
        rx.stop()
