"""Receiver outage: the webhook, Slack and Alertmanager receivers are all down while alerts
fire and resolve, and the daemon restarts twice meanwhile (once killed, once stopped).
When they come back, every transition arrives: all of them, none twice, in order.

Real parts: the daemon (scenario backend, XIDs from a kmsg file), loopback HTTP servers
for the webhook and the Slack incoming webhook, the Debian Alertmanager (plus a recording
server listed as a second Alertmanager URL, to see every push in order)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

from actions_support import HttpReceiver
from alertmanager_support import am_alerts, parse_time, start_for_webhook
from conftest import free_port
from fault_support import (
    STEADY,
    Daemon,
    KmsgFile,
    alerts_of,
    fault_config,
    metric,
    report,
    wait_until,
)

SLACK_LINE = re.compile(r"^- \[(\w+)\] XID \d+ on GPU (\d+)")


def slack_states(rx: HttpReceiver) -> list[tuple[str, str]]:
    """(gpu, "firing" | "resolved") for every alert line of every Slack message."""
    out = []
    for r in rx.requests:
        for line in r.json()["text"].splitlines():
            m = SLACK_LINE.match(line)
            if m:
                out.append((m.group(2), "resolved" if m.group(1) == "resolved" else "firing"))
    return out


def am_pushes(rx: HttpReceiver) -> list[tuple[str, str, bool]]:
    """(gpu, startsAt, resolved) of every alert in every push, in order of arrival."""
    out = []
    for r in rx.requests:
        for a in r.json():
            resolved = parse_time(a["endsAt"]) <= r.at + 1.0  # endsAt now: a resolve
            out.append((a["labels"]["gpu"], a["startsAt"], resolved))
    return out


def test_outage_with_two_restarts_delivers_everything_once_in_order(tmp_path: Path) -> None:
    hook = HttpReceiver(free_port()).start()
    slack = HttpReceiver(free_port()).start()
    am_rec = HttpReceiver(free_port()).start()
    am_hook = HttpReceiver(free_port()).start()
    am, am_url = start_for_webhook(tmp_path, "am", am_hook.url + "/am")
    am_port = int(am_url.rsplit(":", 1)[1])
    kmsg = KmsgFile(tmp_path / "kmsg")
    receivers = f"""receivers:
  - {{name: ops, type: webhook, url: "{hook.url}/hook"}}
  - {{name: chat, type: slack, url: "{slack.url}/services/T0/B0/x", min_interval: 500ms}}
  - {{name: am, type: alertmanager, urls: ["{am_url}", "{am_rec.url}"], resend_interval: 1s}}
routing:
  group_wait: 0s
  group_by: [node, gpu]
  retry_initial: 200ms
  retry_max: 1s
"""
    d = Daemon(tmp_path, fault_config(tmp_path / "state", kmsg.path, receivers), STEADY)
    sent: list[tuple[str, str]] = []  # (gpu, state) in the order the rule engine made them
    try:
        d.start()
        kmsg.xid(0)
        sent += [("0", "firing"), ("0", "resolved")]
        wait_until(lambda: len(alerts_of(hook.requests)) == 2, 15, "GPU 0 fired and resolved")

        # every receiver goes away (Alertmanager too) ...
        outage = time.monotonic()
        for rx in (hook, slack, am_rec):
            rx.stop()
        am.stop()
        kmsg.xid(1)
        sent.append(("1", "firing"))
        time.sleep(1.5)
        d.kill()  # ... the daemon crashes with GPU 1 firing ...
        d.start()  # ... restart 1
        kmsg.xid(2)
        sent += [("2", "firing"), ("1", "resolved"), ("2", "resolved")]
        wait_until(lambda: metric(d.metrics(), "gpuwatchd_alerts", state="firing") == 0, 15,
                   "GPUs 1 and 2 resolved")  # fmt: skip
        kmsg.xid(1)  # GPU 1 again: a second incident
        sent.append(("1", "firing"))
        time.sleep(1.0)
        assert d.stop() == 0  # ... restart 2
        d.start()
        kmsg.xid(3)
        sent += [("3", "firing"), ("1", "resolved"), ("3", "resolved")]
        wait_until(lambda: metric(d.metrics(), "gpuwatchd_alerts", state="firing") == 0, 15,
                   "GPUs 1 and 3 resolved")  # fmt: skip
        status = d.status()["deliveries"]
        pending = status["pending"]
        assert pending > 0 and status["durable"] is True
        down_for = time.monotonic() - outage

        # ... and the receivers come back
        for rx in (hook, slack, am_rec):
            rx.start()
        am, am_url2 = _restart_alertmanager(tmp_path, am_hook, am_port)
        back = time.monotonic()
        wait_until(lambda: d.status()["deliveries"]["pending"] == 0, 30, "outbox drained")
        drained_in = time.monotonic() - back

        # webhook: every transition exactly once, in order per alert
        got = [(g, s) for _, g, s in alerts_of(hook.requests)]
        assert len(got) == len(sent) == 10, got
        for gpu in "0123":
            assert [s for g, s in got if g == gpu] == [s for g, s in sent if g == gpu], gpu
        keys = [r.headers["idempotency-key"] for r in hook.requests]
        assert len(keys) == len(set(keys)), "a message arrived twice"

        # Slack: messages coalesce while it is down (one per min_interval, the latest
        # state of each alert); every GPU's last word is its resolve, never undone
        states = slack_states(slack)
        for gpu in "0123":
            mine = [s for g, s in states if g == gpu]
            assert mine and mine[-1] == "resolved", (gpu, states)
        bodies = [r.body for r in slack.requests]
        assert len(bodies) == len(set(bodies)), "a Slack message arrived twice"

        # Alertmanager: the pushes of each incident in order (firing, then its resolve),
        # and the real Alertmanager ends with nothing active
        pushes = am_pushes(am_rec)
        incidents: dict[tuple[str, str], list[bool]] = {}
        for gpu, starts, resolved in pushes:
            incidents.setdefault((gpu, starts), []).append(resolved)
        assert len(incidents) == 5, incidents  # GPU 0, 1 (twice), 2, 3
        for key, seq in incidents.items():
            assert seq[-1] is True and seq.count(True) == 1, (key, seq)  # resolve last, once
        wait_until(lambda: not [a for a in am_alerts(am_url2) if a["labels"].get("gpu")], 10,
                   "Alertmanager has no active alert")  # fmt: skip
        text = d.metrics()
        for r in ("ops", "chat", "am"):
            assert metric(text, "gpuwatchd_notifications_dropped_total", receiver=r) == 0
        report(
            "receiver_outage",
            down_s=round(down_for, 1),
            restarts=2,
            transitions=len(sent),
            webhook_delivered=len(got),
            duplicates=0,
            pending_at_return=pending,
            drained_in_s=round(drained_in, 2),
            slack_messages=len(slack.requests),
            am_pushes=len(pushes),
        )
    finally:
        d.stop()
        for rx in (hook, slack, am_rec, am_hook):
            rx.stop()
        am.stop()


def _restart_alertmanager(tmp_path: Path, am_hook: HttpReceiver, port: int) -> tuple[Any, str]:
    """The same Alertmanager (storage, port) started again."""
    from conftest import Proc, need_binary, wait_http

    work = tmp_path / "am"
    proc = Proc(
        [
            need_binary("prometheus-alertmanager"),
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        work / "am-2.log",
    )
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/ready", timeout=20)
    return proc, url
