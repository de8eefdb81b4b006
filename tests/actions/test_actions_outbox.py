"""The durable outbox: outage and restart without loss or duplicates, order per alert,
backoff, the queue bound, silences, metrics from start-up, simulate's recording."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from actions_support import HttpReceiver, make_config, sink_for, transition
from conftest import ROOT, free_port, need_binary

from gpuwatchd.actions import ActionsSink
from gpuwatchd.actions.silences import add_silence, expire_silence, path_in
from gpuwatchd.core.alerts import AlertSeverity, AlertState
from gpuwatchd.core.clock import SystemClock, VirtualClock
from gpuwatchd.core.families import Families

DRIVER = ROOT / "tests" / "actions_driver.py"


def metrics_text(sink: ActionsSink) -> str:
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    return fams.render().decode()


class Driver:
    """A separate process that owns the sink (so the test can SIGKILL it)."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"driver exited with {self.proc.wait()}"
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def deliver(self, *items: tuple[str, str, int, int]) -> None:
        batch = [{"rule": r, "state": s, "gpu": g, "seq": q} for r, s, g, q in items]
        assert self.send({"deliver": batch}) == {"written": len(batch)}

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self._pipes()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send({"exit": True})
            self.proc.wait(10)
        self._pipes()

    def _pipes(self) -> None:
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    started: list[Driver] = []
    yield started
    for d in started:
        if d.proc.poll() is None:
            d.kill()
        d._pipes()


def test_outage_and_restart_deliver_every_transition_once_in_order(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    port = free_port()
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(
        f"""node_name: node17
state_dir: {tmp_path / "state"}
receivers:
  - {{name: ops, type: webhook, url: "http://127.0.0.1:{port}/hook"}}
routing:
  group_wait: 0s
  group_by: [node, gpu]
  retry_initial: 100ms
  retry_max: 300ms
"""
    )
    rx = HttpReceiver(port).start()
    sent: list[tuple[str, str, int, int]] = []
    try:
        d1 = Driver(cfg)
        drivers.append(d1)
        assert d1.ready == {"ready": True, "pending": 0}
        for item in [("xid", "firing", 0, 1), ("xid", "firing", 1, 1)]:
            d1.deliver(item)
            sent.append(item)
        rx.wait_for(2)
        assert d1.send({"wait_idle": 5}) == {"idle": True}  # both acknowledged
        rx.stop()  # the receiver goes away ...
        before = list(rx.requests)
        for item in [
            ("xid", "resolved", 0, 2),
            ("xid", "firing", 0, 3),
            ("temp", "firing", 2, 1),
            ("xid", "resolved", 1, 2),
        ]:
            d1.deliver(item)
            sent.append(item)
        time.sleep(0.5)  # ... while deliveries fail and back off
        d1.kill()  # ... and the daemon dies without warning
        d2 = Driver(cfg)
        drivers.append(d2)
        assert d2.ready["pending"] == 4  # nothing was lost
        for item in [("xid", "resolved", 0, 4), ("xid", "firing", 1, 3)]:
            d2.deliver(item)
            sent.append(item)
        time.sleep(0.3)
        rx = HttpReceiver(port).start()  # the receiver is back
        assert d2.send({"wait_idle": 10}) == {"idle": True}
        d2.close()
        requests = before + rx.requests
    finally:
        rx.stop()
    keys = [r.headers["idempotency-key"] for r in requests]
    assert len(keys) == len(set(keys)), "a notification arrived twice"
    received = [
        (a["labels"]["alertname"], a["status"], a["labels"]["gpu"])
        for r in requests
        for a in r.json()["alerts"]
    ]
    assert len(received) == len(sent)  # each transition exactly once ...
    for alert in {(r, g) for r, _, g, _ in sent}:
        want = [s for r, s, g, _ in sorted(sent, key=lambda x: x[3]) if (r, g) == alert]
        have = [s for r, s, g in received if (r, int(g)) == alert]
        assert have == want, f"{alert}: {have} != {want}"  # ... and in order per alert


def test_same_transition_twice_is_one_delivery(tmp_path: Path) -> None:
    rx = HttpReceiver(free_port()).start()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\nrouting:\n  group_wait: "
        "0s\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    t = transition(at=clock.now())
    try:
        sink = sink_for(config, clock)
        sink.deliver([t, t], clock.now())
        sink.run_pending()
        sink.close()
        sink = sink_for(config, clock)  # a restart replays it again
        sink.deliver([t], clock.now())
        sink.run_pending()
        assert len(rx.requests) == 1
        assert "gpuwatchd_alert_transitions_received_total 0.0" in metrics_text(sink)
        sink.close()
    finally:
        rx.stop()


def test_backoff_is_exponential_with_jitter_and_capped(tmp_path: Path) -> None:
    port = free_port()  # nothing listens
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: 'http://127.0.0.1:{port}/'}}\n"
        "routing:\n  group_wait: 0s\n  retry_initial: 2s\n  retry_max: 30s\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    rng = random.Random(7)
    expect = random.Random(7)
    sink = sink_for(config, clock, rng=rng)
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        delays = []
        for attempt in range(1, 8):
            sink.run_pending()
            (row,) = sink.status().as_json()["deliveries"]["queue"]
            assert row["attempts"] == attempt
            assert "ConnectError" in row["last_error"]
            delay = row["next_attempt"] - clock.now()
            base = min(30.0, 2.0 * 2 ** (attempt - 1))
            assert delay == pytest.approx(base * (0.5 + expect.random() / 2))
            assert base / 2 <= delay <= base
            delays.append(delay)
            clock.advance(delay / 2)
            sink.run_pending()  # not due yet: no attempt
            assert sink.status().as_json()["deliveries"]["queue"][0]["attempts"] == attempt
            clock.set(row["next_attempt"] + 1e-3)  # shown on the wall clock, rounded
        assert max(delays) <= 30.0
        text = metrics_text(sink)
        assert 'gpuwatchd_notifications_failed_total{receiver="ops"} 7.0' in text
        assert 'gpuwatchd_notifications_queued{receiver="ops"} 1.0' in text
    finally:
        sink.close()


def test_queue_bound_drops_oldest_info_first(tmp_path: Path) -> None:
    port = free_port()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: 'http://127.0.0.1:{port}/'}}\n"
        "routing:\n  group_wait: 0s\n  group_by: [node, gpu]\n  min_severity: info\n  queue_size: "
        "3\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    sink = sink_for(config, clock)
    try:
        plan = [
            ("a", AlertSeverity.INFO, 0),
            ("b", AlertSeverity.PAGE, 1),
            ("c", AlertSeverity.INFO, 2),
            ("d", AlertSeverity.TICKET, 3),
            ("e", AlertSeverity.PAGE, 4),
            ("f", AlertSeverity.TICKET, 5),
        ]
        for rule, sev, gpu in plan:
            sink.deliver(
                [transition(rule, severity=sev, gpu=gpu, at=clock.now(), xid=None)], clock.now()
            )
        text = metrics_text(sink)
        assert (
            'gpuwatchd_notifications_dropped_total{receiver="ops",reason="queue_full"} 3.0' in text
        )
        assert 'gpuwatchd_notifications_queued{receiver="ops"} 3.0' in text
        rx = HttpReceiver(port).start()
        try:
            sink.run_pending()
            got = [r.json()["alerts"][0]["labels"]["alertname"] for r in rx.requests]
        finally:
            rx.stop()
        assert got == ["b", "e", "f"]  # a, c (info) went first, then d (the oldest ticket)
    finally:
        sink.close()


def test_silence_mutes_then_expiry_notifies(tmp_path: Path) -> None:
    rx = HttpReceiver(free_port()).start()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\n"
        "routing:\n  group_wait: 0s\n  group_by: [node, gpu]\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    path = path_in(config.state_dir)
    os.makedirs(config.state_dir, exist_ok=True)
    silence = add_silence(
        path,
        node="node17",
        gpu="3",
        rule=None,
        duration=7200,
        reason="RMA",
        author="t",
        now=clock.now(),
    )
    sink = sink_for(config, clock)
    try:
        sink.deliver(
            [transition(gpu=3, at=clock.now()), transition(gpu=4, at=clock.now())], clock.now()
        )
        sink.run_pending()
        assert [r.json()["alerts"][0]["labels"]["gpu"] for r in rx.requests] == ["4"]
        status = sink.status().as_json()
        assert [s["id"] for s in status["silences"] if s["active"]] == [silence.id]
        muted = [a for a in status["deliveries"]["firing"] if a["silenced_by"]]
        assert [a["labels"]["gpu"] for a in muted] == ["3"]
        text = metrics_text(sink)
        assert "gpuwatchd_alerts_silenced_total 1.0" in text
        assert "gpuwatchd_silences_active 1.0" in text
        clock.advance(600)
        expire_silence(path, silence.id, clock.now())
        sink.run_pending()
        assert [r.json()["alerts"][0]["labels"]["gpu"] for r in rx.requests] == ["4", "3"]
        # a silence that simply runs out does the same
        add_silence(
            path,
            node="node17",
            gpu=None,
            rule=None,
            duration=60,
            reason="reboot",
            author="t",
            now=clock.now(),
        )
        sink.deliver([transition("temp", gpu=5, at=clock.now(), xid=None)], clock.now())
        sink.run_pending()
        assert len(rx.requests) == 2
        clock.advance(61)
        sink.run_pending()
        assert rx.requests[-1].json()["alerts"][0]["labels"]["alertname"] == "temp"
    finally:
        sink.close()
        rx.stop()


def test_metrics_exist_at_zero_for_each_receiver(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        """receivers:
  - {name: ops, type: webhook, url: "http://127.0.0.1:9/"}
  - {name: am, type: alertmanager, urls: ["http://127.0.0.1:9", "http://127.0.0.1:10"]}
drain:
  mode: exec
  exec: {command: [/bin/true]}
  state_file: null
""",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        text = metrics_text(sink)
    finally:
        sink.close()
    for r in ("ops", "am"):
        for name in ("gpuwatchd_notifications_queued", "gpuwatchd_notifications_sent_total",
                     "gpuwatchd_notifications_failed_total"):  # fmt: skip
            assert f'{name}{{receiver="{r}"}} 0.0' in text
        for why in ("queue_full", "rejected", "expired"):
            assert (
                f'gpuwatchd_notifications_dropped_total{{receiver="{r}",reason="{why}"}} 0.0'
                in text
            )
        assert f'gpuwatchd_notification_delivery_seconds_count{{receiver="{r}"}} 0.0' in text
        assert (
            f'gpuwatchd_notification_delivery_seconds_bucket{{receiver="{r}",le="+Inf"}} 0.0'
            in text
        )
    assert "gpuwatchd_drain_pending 0.0" in text
    assert 'gpuwatchd_drain_actions_total{action="drain",result="drained"} 0.0' in text
    assert "gpuwatchd_drain_rate_limited_total 0.0" in text
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    for doc in ("metrics.md", "actions.md"):
        body = (ROOT / "docs" / doc).read_text()
        missing = sorted(f for f in families if f"`{f}`" not in body)
        assert not missing, f"docs/{doc} does not document {missing}"
    promtool = need_binary("promtool")
    lint = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()


def test_restart_keeps_group_state_and_resolves(tmp_path: Path) -> None:
    """A firing alert notified before a restart still gets its resolve after it."""
    rx = HttpReceiver(free_port()).start()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\nrouting:\n  group_wait: "
        "0s\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    try:
        sink = sink_for(config, clock)
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()
        sink.close()
        clock.advance(60)
        sink = sink_for(config, clock)
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        sink.close()
        assert [r.json()["status"] for r in rx.requests] == ["firing", "resolved"]
    finally:
        rx.stop()


def test_corrupt_outbox_is_moved_aside_not_a_crash_loop(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(
        tmp_path, "receivers:\n  - {name: ops, type: webhook, url: 'http://127.0.0.1:9/'}\n"
    )
    os.makedirs(config.state_dir)
    Path(config.state_dir, "actions.db").write_bytes(b"this is not SQLite" * 100)
    sink = sink_for(config, VirtualClock())
    try:
        assert sink.pending() == 0
        assert "is unusable" in caplog.text and "starting empty" in caplog.text
        assert [p.name for p in Path(config.state_dir).glob("actions.db.corrupt-*")]
    finally:
        sink.close()
