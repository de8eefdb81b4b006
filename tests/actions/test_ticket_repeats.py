"""Issue 23 item 7: a ticket that nobody closed is repeated at most daily, a page keeps the
4 h repeat, and a group repeats as often as its most urgent firing alert asks. (Each repeat
carries the alert's current text: tests/rules/test_live_annotations.py.)

Before: one corrected ECC error gave a ticket re-sent every 4 h."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from actions_support import HttpReceiver, make_config, sink_for, transition

from gpuwatchd.actions import ActionsSink
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.testing.clocks import SteppedClock

HOUR = 3600.0


@pytest.fixture
def rx() -> Iterator[HttpReceiver]:
    r = HttpReceiver(0).start()  # a port the OS picks
    yield r
    r.stop()


def setup(tmp_path: Path, rx: HttpReceiver, group_by: str) -> tuple[ActionsSink, SteppedClock]:
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\n"
        f"routing:\n  group_wait: 0s\n  group_by: {group_by}\n",  # repeat_interval: 4h default
    )
    clock = SteppedClock()
    return sink_for(config, clock), clock


def kinds(rx: HttpReceiver, gpu: str) -> list[str]:
    out = []
    for r in rx.requests:
        body = r.json()
        if any(a["labels"]["gpu"] == gpu for a in body["alerts"]):
            out.append(body["alerts"][0]["status"] + ":" + str(len(body["alerts"])))
    return out


def run_for(sink: ActionsSink, clock: SteppedClock, seconds: float) -> None:
    end = clock.monotonic() + seconds
    while clock.monotonic() < end:
        clock.advance(600.0)
        sink.run_pending()


def test_a_ticket_repeats_daily_a_page_every_4h(tmp_path: Path, rx: HttpReceiver) -> None:
    sink, clock = setup(tmp_path, rx, "[node, gpu]")
    try:
        now = clock.now()
        sink.deliver(
            [
                transition("EccRising", severity=AlertSeverity.TICKET, gpu=1, xid=None, at=now),
                transition("Hot", severity=AlertSeverity.PAGE, gpu=2, xid=None, at=now),
            ],
            now,
        )
        sink.run_pending()
        assert (len(kinds(rx, "1")), len(kinds(rx, "2"))) == (1, 1)
        run_for(sink, clock, 4 * HOUR + 60)
        assert (len(kinds(rx, "1")), len(kinds(rx, "2"))) == (1, 2)  # the page repeated
        run_for(sink, clock, 20 * HOUR)
        assert (len(kinds(rx, "1")), len(kinds(rx, "2"))) == (2, 7)  # the ticket, once a day
    finally:
        sink.close()


def test_a_group_with_a_page_repeats_as_the_page_asks(tmp_path: Path, rx: HttpReceiver) -> None:
    sink, clock = setup(tmp_path, rx, "[node]")
    try:
        now = clock.now()
        sink.deliver(
            [transition("EccRising", severity=AlertSeverity.TICKET, gpu=1, xid=None, at=now)],
            now,
        )
        sink.run_pending()
        clock.advance(60.0)
        sink.deliver(
            [transition("Hot", severity=AlertSeverity.PAGE, gpu=2, xid=None, at=clock.now())],
            clock.now(),
        )
        sink.run_pending()
        assert len(rx.requests) == 2  # the ticket, then the update with the page
        run_for(sink, clock, 4 * HOUR + 60)
        assert len(rx.requests) == 3 and len(rx.requests[2].json()["alerts"]) == 2
    finally:
        sink.close()
