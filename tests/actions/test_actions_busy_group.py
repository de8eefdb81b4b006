"""Issue 21 item 4: a page never waits for batching.

Folding (``group_wait``) is for tickets, info, resolves and repeats. A transition that adds a
page to a group goes out at once, however busy the group was in the last ``group_wait``; a
page that fires and resolves before its group's next message is still delivered firing,
then resolved; and the message that carries a new page is headed by it.

Before this change a ticket that flapped in the node's group (every change restarting the
fold) held each new page until the end of the window: 0.6-9.6 s on a real 4 x H200 node
with the default 5 s, and a page that resolved meanwhile never arrived as firing.

The first two tests run the real daemon on the scenario backend with a large
``group_wait`` (30 s, 10 s), so that a hold is unmistakable; the others drive the real
actions stage on a virtual clock and check the rendered Slack, PagerDuty and webhook
payloads."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from actions_support import HttpReceiver, Received, make_config, sink_for, transition
from conftest import free_port
from fault_support import STEADY, Daemon, KmsgFile, fault_config
from first_page_support import read_at

from gpuwatchd.actions import RecordingSender
from gpuwatchd.core.alerts import AlertSeverity, AlertState
from gpuwatchd.core.clock import VirtualClock

RULES = """rules:
- name: BusyTicket
  description: XID 13 opens a ticket that resolves one second after the last one (flaps).
  severity: ticket
  condition:
    xid: {codes: [13], quiet: 1s}
  annotations:
    summary: 'ticket: XID {xid} on GPU {gpu}'
    area: application
- name: BusyPage
  description: XID 79 pages; resolves soon after, so every test page is a new one.
  severity: page
  condition:
    xid: {codes: [79], quiet: 1s}
  annotations:
    summary: 'page: XID {xid} on GPU {gpu}'
    area: hardware
"""


def busy_daemon(tmp_path: Path, group_wait: str, rx: HttpReceiver) -> tuple[Daemon, KmsgFile]:
    rules = tmp_path / "busy-rules.yaml"
    rules.write_text(RULES)
    kmsg = KmsgFile(tmp_path / "kmsg")
    receivers = f"""receivers:
  - {{name: ops, type: webhook, url: "{rx.url}/hook"}}
routing:
  group_wait: {group_wait}
  repeat_interval: 1h
"""
    config = fault_config(
        tmp_path / "state",
        kmsg.path,
        receivers,
        rules=f"rules: {{defaults: false, files: [{rules}]}}",
    )
    return Daemon(tmp_path, config, STEADY), kmsg


def alerts(r: Received) -> list[tuple[str, str, str]]:
    return [
        (a["labels"]["alertname"], a["labels"].get("gpu", ""), a["status"])
        for a in r.json()["alerts"]
    ]


def wait_message(
    rx: HttpReceiver, want: tuple[str, str, str], after: int = 0, timeout: float = 10.0
) -> int:
    """The index of the first request from ``after`` on that carries alert ``want``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with rx.lock:
            got = list(rx.requests)
        for i in range(after, len(got)):
            if want in alerts(got[i]):
                return i
        time.sleep(0.005)
    raise AssertionError(f"no message with {want} in {timeout}s: {[alerts(r) for r in got]}")


def test_pages_leave_at_once_while_a_flapping_ticket_keeps_the_group_busy(
    tmp_path: Path,
) -> None:
    """Three XID 79 pages on GPUs 1-3 while a ticket on GPU 0 (XID 13) fires and resolves
    again and again in the same group (``group_by: [node]``), ``group_wait: 30s``: each page
    reaches the webhook within 5 s of the daemon reading its line (a generous bound: it
    takes milliseconds; the old code held each until the end of the 30 s window), headed by
    the page."""
    rx = HttpReceiver(free_port()).start()
    d, kmsg = busy_daemon(tmp_path, "30s", rx)
    try:
        d.start()
        kmsg.xid(0, 13)
        wait_message(rx, ("BusyTicket", "0", "firing"))  # the group's first message
        took = []
        for gpu in (1, 2, 3):
            # the ticket flaps: it resolves after 1 s of quiet and fires again
            time.sleep(1.6)
            kmsg.xid(0, 13)
            time.sleep(0.3)
            kmsg.xid(gpu, 79)
            i = wait_message(rx, ("BusyPage", str(gpu), "firing"), timeout=20.0)
            took.append(rx.requests[i].at - read_at(d.output(), gpu))
            msg = rx.requests[i].json()
            assert msg["alerts"][0]["labels"]["gpu"] == str(gpu), alerts(rx.requests[i])
            assert msg["alerts"][0]["labels"]["alertname"] == "BusyPage"
        ms = [round(t * 1000, 1) for t in took]
        print(f"busy group, group_wait 30s: read -> webhook {ms} ms")
        assert max(took) < 5.0, took
        assert len(rx.requests) == 4, [alerts(r) for r in rx.requests]  # ticket, 3 pages
    finally:
        d.stop()
        rx.stop()


def test_page_that_resolves_before_the_next_message_is_delivered_firing_then_resolved(
    tmp_path: Path,
) -> None:
    """A page that fires and resolves (1 s quiet) well within the 10 s window of a busy
    group arrives as firing at once, and as resolved later (two messages, in that order).
    The old code folded both into the window's update: the page was only ever seen
    resolved."""
    rx = HttpReceiver(free_port()).start()
    d, kmsg = busy_daemon(tmp_path, "10s", rx)
    try:
        d.start()
        kmsg.xid(0, 13)
        wait_message(rx, ("BusyTicket", "0", "firing"))
        time.sleep(1.6)  # the ticket resolves after 1 s of quiet ...
        kmsg.xid(0, 13)  # ... and fires again: the group is busy
        time.sleep(0.3)
        kmsg.xid(1, 79)
        fired = wait_message(rx, ("BusyPage", "1", "firing"), after=1, timeout=5.0)
        resolved = wait_message(rx, ("BusyPage", "1", "resolved"), after=fired, timeout=20.0)
        assert fired < resolved
        firing_msgs = [r for r in rx.requests if ("BusyPage", "1", "firing") in alerts(r)]
        assert len(firing_msgs) == 1, [alerts(r) for r in rx.requests]
    finally:
        d.stop()
        rx.stop()


# -- the real actions stage on a virtual clock ---------------------------------------------
RECEIVERS = """receivers:
  - {name: hook, type: webhook, url: "http://127.0.0.1:9/hook"}
  - {name: chat, type: slack, url: "http://127.0.0.1:9/slack"}
  - {name: pd, type: pagerduty, routing_key: R0UT1NGKEY0123456789abcdefABCDEF}
routing:
  group_wait: 30s
"""


def ticket(gpu: int, at: float, state: AlertState = AlertState.FIRING, seq: int = 1) -> Any:
    return transition(
        "BusyTicket",
        state,
        severity=AlertSeverity.TICKET,
        gpu=gpu,
        at=at,
        seq=seq,
        xid=13,
        annotations={"summary": f"ticket: XID 13 on GPU {gpu}", "area": "application"},
    )


def page(gpu: int, at: float, state: AlertState = AlertState.FIRING, seq: int = 1) -> Any:
    return transition(
        "BusyPage",
        state,
        gpu=gpu,
        at=at,
        seq=seq,
        xid=79,
        annotations={"summary": f"page: XID 79 on GPU {gpu}", "area": "hardware"},
    )


def bodies(sender: RecordingSender, receiver: str) -> list[list[Any]]:
    """The JSON bodies of every message to ``receiver`` (PagerDuty: one per event)."""
    return [
        [json.loads(r.body) for r in o.requests] for o in sender.sent if o.receiver.name == receiver
    ]


def test_the_message_that_carries_a_new_page_is_headed_by_it(tmp_path: Path) -> None:
    """Three tickets fire, one of them flaps, then a page fires in the same group: the page
    leaves at once, and the Slack header, the first PagerDuty event's summary and the
    webhook's first alert are the page's (not '[FIRING:4] ticket ... (+3 more) - update');
    the webhook's commonAnnotations hold nothing of the tickets'."""
    config = make_config(tmp_path, RECEIVERS)
    clock = VirtualClock(1_800_000_000.0)
    sender = RecordingSender()
    sink = sink_for(config, clock, sender=sender)
    try:
        t0 = clock.now()
        sink.deliver([ticket(g, t0) for g in (0, 2, 3)], t0)
        sink.run_pending()
        for name in ("hook", "chat", "pd"):
            assert len(bodies(sender, name)) == 1, name
        clock.advance(2.0)
        sink.deliver([ticket(0, clock.now(), AlertState.RESOLVED, 2)], clock.now())
        clock.advance(2.0)
        sink.deliver([ticket(0, clock.now(), seq=3)], clock.now())
        sink.run_pending()
        clock.advance(2.0)
        sink.deliver([page(1, clock.now())], clock.now())
        sink.run_pending()  # no time passes: the page goes now

        (hook,) = bodies(sender, "hook")[1]
        assert hook["alerts"][0]["labels"]["alertname"] == "BusyPage"
        assert hook["alerts"][0]["labels"]["gpu"] == "1"
        page_ann = hook["alerts"][0]["annotations"]
        assert hook["commonAnnotations"].items() <= page_ann.items(), hook["commonAnnotations"]

        (chat,) = bodies(sender, "chat")[1]
        head = chat["blocks"][0]["text"]["text"]
        assert head.startswith("[FIRING:4] page: XID 79 on GPU 1"), head
        assert not head.endswith("update"), head
        assert chat["text"].splitlines()[0] == head

        events = bodies(sender, "pd")[1]
        assert events[0]["event_action"] == "trigger"
        assert "page: XID 79 on GPU 1" in events[0]["payload"]["summary"], events[0]
        assert events[0]["payload"]["severity"] == "critical"

        # the flapping ticket's changes went with the page: nothing is left to fold
        assert ("BusyTicket", "firing") in [
            (a["labels"]["alertname"], a["status"]) for a in hook["alerts"]
        ]
        clock.advance(30.0)
        sink.run_pending()
        assert all(len(bodies(sender, n)) == 2 for n in ("hook", "chat", "pd"))
    finally:
        sink.close()


def test_page_fired_and_resolved_in_one_batch_is_sent_firing_then_resolved(
    tmp_path: Path,
) -> None:
    """Both transitions of a page reach the outbox in one commit while its group is busy:
    the firing still leaves at once (its own message), the resolve at the end of the
    window."""
    config = make_config(tmp_path, RECEIVERS)
    clock = VirtualClock(1_800_000_000.0)
    sender = RecordingSender()
    sink = sink_for(config, clock, sender=sender)
    try:
        sink.deliver([ticket(0, clock.now())], clock.now())
        sink.run_pending()
        clock.advance(1.0)
        now = clock.now()
        sink.deliver([page(1, now), page(1, now, AlertState.RESOLVED, 2)], now)
        sink.run_pending()
        (hook,) = bodies(sender, "hook")[1]
        assert [(a["labels"]["alertname"], a["status"]) for a in hook["alerts"]] == [
            ("BusyPage", "firing"),
            ("BusyTicket", "firing"),
        ]
        assert bodies(sender, "pd")[1][0]["event_action"] == "trigger"
        clock.advance(30.0)
        sink.run_pending()
        (hook,) = bodies(sender, "hook")[2]
        assert ("BusyPage", "resolved") in [
            (a["labels"]["alertname"], a["status"]) for a in hook["alerts"]
        ]
        assert [e["event_action"] for e in bodies(sender, "pd")[2]] == ["resolve"]
    finally:
        sink.close()


@pytest.mark.parametrize("group_wait", ["0s", "30s"])
def test_slack_never_merges_a_page_with_its_own_resolve(tmp_path: Path, group_wait: str) -> None:
    """Slack sends at most one message a second and merges what waits into one message
    (the latest state of each alert). A page that fires and resolves while Slack waits is
    still shown firing first: the merge stops before the resolve of a page it would hide."""
    config = make_config(
        tmp_path,
        "receivers:\n  - {name: chat, type: slack, url: 'http://127.0.0.1:9/slack'}\n"
        f"routing:\n  group_wait: {group_wait}\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    sender = RecordingSender()
    sink = sink_for(config, clock, sender=sender)
    try:
        sink.deliver([ticket(0, clock.now())], clock.now())
        sink.run_pending()  # sent; Slack waits 1 s before the next message
        clock.advance(0.2)
        sink.deliver([page(1, clock.now())], clock.now())
        sink.run_pending()
        clock.advance(0.2)
        sink.deliver([page(1, clock.now(), AlertState.RESOLVED, 2)], clock.now())
        sink.run_pending()
        for _ in range(40):
            clock.advance(1.0)
            sink.run_pending()
        heads = [body[0]["blocks"][0]["text"]["text"] for body in bodies(sender, "chat")]
        assert len(heads) == 3, heads
        assert heads[1].startswith("[FIRING:2] page: XID 79 on GPU 1"), heads
        assert "- [resolved] page: XID 79 on GPU 1" in bodies(sender, "chat")[2][0]["text"]
    finally:
        sink.close()
