"""Issue 10 item 4: building the actions stage starts no thread and changes no global
logging; ``start()`` starts the workers and ``close()`` stops them. A ``RecordingSender``
records what would be sent (no secret read, nothing on the network). The old sink
started its threads and turned httpx's loggers down in its constructor."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from actions_support import make_config, sink_for, transition

from gpuwatchd.actions import RecordingSender, build_actions
from gpuwatchd.configfile.stages import for_actions
from gpuwatchd.core.clock import SystemClock, VirtualClock


def workers() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith(("send-", "actions-"))}


def test_construction_starts_nothing_and_leaves_logging_alone(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        "receivers:\n  - {name: ops, type: webhook, url: 'http://127.0.0.1:9/'}\n"
        "drain:\n  mode: exec\n  exec: {command: [/bin/true]}\n  state_file: null\n",
    )
    levels = {n: logging.getLogger(n).level for n in ("httpx", "httpcore")}
    before = workers()
    sink = build_actions(for_actions(config), SystemClock())
    assert sink is not None
    try:
        assert workers() == before
        assert {n: logging.getLogger(n).level for n in levels} == levels
        sink.start()
        assert workers() - before == {"actions-sched", "actions-drain", "send-ops-0"}
    finally:
        sink.close()
    assert workers() == before


def test_recording_sender_records_without_secrets_or_network(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        "receivers:\n  - {name: pd, type: pagerduty, routing_key_file: /nonexistent/key}\n"
        "routing:\n  group_wait: 0s\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    sender = RecordingSender()
    sink = sink_for(config, clock, sender=sender)  # the key file is never read
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()
        (record,) = sender.records
        assert record["record"] == "notification" and record["receiver"] == "pd"
        assert record["kind"] == "notify"
        assert [a["rule"] for a in record["alerts"]] == ["gpu_xid_fatal"]
        assert sink.pending() == 0
    finally:
        sink.close()


def test_start_builds_the_http_clients_so_the_first_page_does_not_pay_for_them(
    tmp_path: Path,
) -> None:
    """The first httpx client of a process loads the CA store; start() builds every
    target's client so that the first page leaves as fast as the others."""
    from gpuwatchd.actions import build_actions
    from gpuwatchd.actions.transport import HttpSender
    from gpuwatchd.configfile.loader import load_config
    from gpuwatchd.core.clock import VirtualClock

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"state_dir: {tmp_path}\nreceivers:\n"
        "  - {name: a, type: webhook, url: 'http://127.0.0.1:9/a'}\n"
        "  - {name: b, type: alertmanager, urls: ['http://127.0.0.1:9/x', 'http://127.0.0.1:9/y']}\n"
    )
    sink = build_actions(for_actions(load_config(str(cfg), must_exist=True)), VirtualClock())
    assert sink is not None and isinstance(sink.sender, HttpSender)
    try:
        assert sink.sender._clients == {}  # building the stage opens nothing
        sink.start()
        assert sorted(sink.sender._clients) == [("a", 0), ("b", 0), ("b", 1)]
    finally:
        sink.close()
