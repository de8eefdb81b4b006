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
    sink = build_actions(config, SystemClock())
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
