"""Receivers against a real HTTP server on loopback: payloads field by field, status codes,
retries, rate limits and secrets that never show."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from actions_support import T0, HttpReceiver, Received, make_config, sink_for, transition
from conftest import free_port

from gpuwatchd.actions import ActionsSink
from gpuwatchd.actions.model import GO_ZERO_TIME, notification_key, rfc3339
from gpuwatchd.actions.receivers import pagerduty_dedup_key
from gpuwatchd.core.alerts import AlertSeverity, AlertState
from gpuwatchd.core.clock import SystemClock, VirtualClock
from gpuwatchd.core.families import Families


@pytest.fixture
def rx() -> Iterator[HttpReceiver]:
    server = HttpReceiver(free_port()).start()
    yield server
    server.stop()


def metrics_text(sink: ActionsSink) -> str:
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    return fams.render().decode()


def sample(text: str, name: str, **labels: str) -> float:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{inner}}} ") or (not labels and line.startswith(name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name}{{{inner}}} not in metrics")


# -- generic webhook ---------------------------------------------------------------------
def test_webhook_payload_is_alertmanager_v4(tmp_path: Path, rx: HttpReceiver) -> None:
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "hook-token").write_text("Bearer tok-123\n")
    config = make_config(
        tmp_path,
        f"""
receivers:
  - name: ops
    type: webhook
    url: {rx.url}/alerts/gpu
    headers: {{X-Team: gpu-infra}}
    header_files: {{Authorization: hook-token}}
    hmac_secret: hmac-key-1
routing:
  group_wait: 0s
""",
    )
    clock = SystemClock()
    sink = sink_for(config, clock, environ={"CREDENTIALS_DIRECTORY": str(creds)}, start=True)
    try:
        since = time.time() - 30
        fire = transition(at=since + 30, since=since, seq=1)
        sink.deliver([fire], clock.now())
        req = rx.wait_for(1)[0]
        assert req.method == "POST" and req.path == "/alerts/gpu"
        assert req.headers["content-type"] == "application/json"
        assert req.headers["user-agent"].startswith("gpuwatchd/")
        assert req.headers["x-team"] == "gpu-infra"
        assert req.headers["authorization"] == "Bearer tok-123"
        gkey = '{}:{node="node17"}'
        assert req.headers["idempotency-key"] == notification_key(
            "ops", gkey, [fire.idempotency_key]
        )
        expected_sig = hmac.new(b"hmac-key-1", req.body, hashlib.sha256).hexdigest()
        assert req.headers["x-gpuwatchd-signature"] == f"sha256={expected_sig}"
        msg = req.json()
        assert msg["version"] == "4"
        assert msg["groupKey"] == gkey
        assert msg["truncatedAlerts"] == 0
        assert msg["status"] == "firing"
        assert msg["receiver"] == "ops"
        assert msg["groupLabels"] == {"node": "node17"}
        assert msg["externalURL"] == "http://node17:9835"  # no external_url: node, default port
        labels = {
            "alertname": "gpu_xid_fatal",
            "severity": "critical",
            "gpuwatchd_severity": "page",
            "node": "node17",
            "gpu": "3",
            "uuid": "GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a13",
            "pci_bus_id": "00000000:3E:00.0",
            "model": "NVIDIA H200",
            "xid": "79",
        }
        assert msg["commonLabels"] == dict(sorted(labels.items()))
        assert msg["commonAnnotations"] == dict(fire.annotations)
        (alert,) = msg["alerts"]
        assert alert == {
            "status": "firing",
            "labels": labels,
            "annotations": dict(fire.annotations),
            "startsAt": rfc3339(since),
            "endsAt": GO_ZERO_TIME,
            "generatorURL": f"http://node17:9835/#alert-{fire.fingerprint}",
            "fingerprint": fire.fingerprint,
        }
        assert list(msg) == [
            "version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels",
            "commonLabels", "commonAnnotations", "externalURL", "alerts",
        ]  # fmt: skip
        resolve_at = time.time()
        sink.deliver(
            [transition(state=AlertState.RESOLVED, at=resolve_at, since=since, seq=2)], resolve_at
        )
        msg = rx.wait_for(2)[1].json()
        assert msg["status"] == "resolved"
        assert msg["alerts"][0]["status"] == "resolved"
        assert msg["alerts"][0]["endsAt"] == rfc3339(resolve_at)
        assert msg["alerts"][0]["startsAt"] == rfc3339(since)
        assert sink.wait_idle(5)
        text = metrics_text(sink)
        assert sample(text, "gpuwatchd_notifications_sent_total", receiver="ops") == 2
        assert sample(text, "gpuwatchd_notification_delivery_seconds_count", receiver="ops") == 2
    finally:
        sink.close()


def test_cascade_pages_at_once_and_folds_the_rest_into_one_update(
    tmp_path: Path, rx: HttpReceiver
) -> None:
    """The first alert of a new group leaves as soon as it is committed, and so does a
    page that follows it; the rest of the cascade within group_wait (a ticket) is one
    update message at the end of the window."""
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\nrouting:\n  group_wait: "
        "1s\n",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        now = time.time()
        sink.deliver([transition("gpu_xid_fatal", at=now, xid=79)], now)
        (first,) = rx.wait_for(1, timeout=2)
        assert first.at - now < 0.5  # not after group_wait
        assert [a["labels"]["alertname"] for a in first.json()["alerts"]] == ["gpu_xid_fatal"]
        time.sleep(0.2)
        lost_at = time.time()
        sink.deliver([transition("gpu_lost", at=now, xid=None)], now)
        _, lost = rx.wait_for(2, timeout=2)
        assert lost.at - lost_at < 0.5  # a page: not folded
        assert [a["labels"]["alertname"] for a in lost.json()["alerts"]] == [
            "gpu_lost",
            "gpu_xid_fatal",
        ]
        time.sleep(0.2)
        sink.deliver(
            [transition("nvlink_errors", severity=AlertSeverity.TICKET, at=now, xid=None, gpu=4)],
            now,
        )
        time.sleep(1.5)
        assert sink.wait_idle(5)
        first_again, lost_again, update = rx.requests
        assert (first_again, lost_again) == (first, lost)
        msg = update.json()
        assert [a["labels"]["alertname"] for a in msg["alerts"]] == [
            "gpu_xid_fatal",
            "gpu_lost",
            "nvlink_errors",
        ]
        assert update.at - now >= 0.95  # at the end of the window after the first message
        assert msg["commonLabels"]["node"] == "node17"
        assert "gpu" not in msg["commonLabels"]
    finally:
        sink.close()


def test_routes_by_severity_and_labels(tmp_path: Path) -> None:
    servers = {n: HttpReceiver(free_port()).start() for n in ("pager", "chat", "gpu0", "ruled")}
    try:
        config = make_config(
            tmp_path,
            "receivers:\n"
            + "".join(
                f"  - {{name: {n}, type: webhook, url: '{s.url}/'}}\n" for n, s in servers.items()
            )
            + """routing:
  group_wait: 0s
  receivers: [chat]
  routes:
    - match: {severity: page}
      receivers: [pager, chat]
    - match_re: {gpu: "0|1"}
      match: {node: node17}
      receivers: [gpu0]
""",
        )
        sink = sink_for(config, SystemClock(), start=True)
        now = time.time()
        sink.deliver([transition("a_page", at=now, gpu=5)], now)  # page -> pager, chat
        sink.deliver(
            [transition("b_ticket", severity=AlertSeverity.TICKET, at=now, gpu=0)], now
        )  # gpu0
        sink.deliver(
            [transition("c_ticket", severity=AlertSeverity.TICKET, at=now, gpu=7)], now
        )  # default
        sink.deliver(
            [transition("d_info", severity=AlertSeverity.INFO, at=now, gpu=7)], now
        )  # nobody
        sink.deliver(
            [transition("e_routed", severity=AlertSeverity.INFO, at=now, routes=("ruled",))], now
        )
        assert sink.wait_idle(5)
        got = {
            n: [
                a["labels"]["alertname"]
                for r in s.requests
                for a in r.json()["alerts"]
                if a["status"] == "firing"
            ]
            for n, s in servers.items()
        }
        assert set(got["pager"]) == {"a_page"}
        assert set(got["gpu0"]) == {"b_ticket"}
        assert set(got["chat"]) == {"a_page", "c_ticket"}
        assert set(got["ruled"]) == {"e_routed"}
        sink.close()
    finally:
        for s in servers.values():
            s.stop()


def test_repeat_interval_resends_still_firing(tmp_path: Path, rx: HttpReceiver) -> None:
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\n"
        "routing:\n  group_wait: 0s\n  repeat_interval: 1h\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    sink = sink_for(config, clock)
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()
        clock.advance(1800)
        sink.run_pending()
        assert len(rx.requests) == 1
        clock.advance(1800)
        sink.run_pending()
        assert len(rx.requests) == 2
        repeat = rx.requests[1]
        assert repeat.json()["status"] == "firing"
        assert repeat.headers["idempotency-key"] != rx.requests[0].headers["idempotency-key"]
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        clock.advance(7200)
        sink.run_pending()
        assert [r.json()["status"] for r in rx.requests] == ["firing", "firing", "resolved"]
    finally:
        sink.close()


# -- Slack -------------------------------------------------------------------------------
def test_slack_blocks_and_resolve(tmp_path: Path, rx: HttpReceiver) -> None:
    (tmp_path / "slack.url").write_text(f"{rx.url}/services/T000/B000/XXXXSECRET\n")
    config = make_config(
        tmp_path,
        f"""
receivers:
  - name: chat
    type: slack
    url_file: {tmp_path / "slack.url"}
routing:
  group_wait: 0s
""",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        since = 1_767_225_600.0
        t = transition(
            "gpu_temperature_high",
            at=since + 300,
            since=since,
            xid=None,
            value=91.5,
            annotations={
                "summary": "GPU 3 at 91.5 C for 5m",
                "description": "Check the node's airflow.",
                "threshold": "85 C",
                "runbook_url": "https://runbooks.example/gpu-temp",
            },
        )
        x = transition(at=since + 300, since=since, gpu=5, seq=1)
        sink.deliver([t, x], since + 300)
        req = rx.wait_for(1)[0]
        assert req.path == "/services/T000/B000/XXXXSECRET"
        msg = req.json()
        assert msg["text"].startswith("[FIRING:2] GPU 3 at 91.5 C for 5m (+1 more) on node17")
        assert "- [page] GPU 3 at 91.5 C for 5m" in msg["text"]
        assert "- [page] XID 79 on GPU 5" in msg["text"]
        blocks = msg["blocks"]
        assert blocks[0] == {
            "type": "header",
            "text": {"type": "plain_text", "text": msg["text"].splitlines()[0], "emoji": False},
        }
        assert blocks[1]["type"] == "section"
        assert blocks[1]["text"]["text"] == (
            "*GPU 3 at 91.5 C for 5m*\nCheck the node's airflow.\n"
            "<https://runbooks.example/gpu-temp|Runbook>"
        )
        fields = [f["text"] for f in blocks[2]["fields"]]
        assert fields == [
            "*Severity*\npage",
            "*Node*\nnode17",
            "*GPU*\n3 `GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a13` `00000000:3E:00.0`",
            "*Value*\n91.5 (threshold 85 C)",
            "*Since*\n2026-01-01 00:00:00Z",
        ]
        xid_fields = [f["text"] for f in blocks[4]["fields"]]
        assert "*XID*\n79 \u2014 GPU has fallen off the bus" in xid_fields
        assert "*Action*\nDrain the node and reset the GPU" in xid_fields
        assert blocks[-1]["type"] == "context"
        assert "gpuwatchd" in blocks[-1]["elements"][0]["text"]
        # resolve message
        sink.deliver(
            [
                transition(
                    "gpu_temperature_high",
                    AlertState.RESOLVED,
                    at=since + 900,
                    since=since,
                    xid=None,
                    seq=2,
                    annotations=dict(t.annotations),
                )
            ],
            since + 900,
        )
        msg = rx.wait_for(2, timeout=5)[1].json()
        assert msg["text"].startswith("[FIRING:1] XID 79 on GPU 5")  # the other still fires
        resolved = [
            b
            for b in msg["blocks"]
            if b["type"] == "section" and "(resolved)" in b.get("text", {}).get("text", "")
        ]
        assert len(resolved) == 1
        assert any(
            f["text"] == "*Resolved*\n2026-01-01 00:15:00Z"
            for b in msg["blocks"]
            if "fields" in b
            for f in b["fields"]
        )
    finally:
        sink.close()


def test_slack_one_message_per_second_with_coalescing(tmp_path: Path, rx: HttpReceiver) -> None:
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: chat, type: slack, url: '{rx.url}/hook'}}\n"
        "routing:\n  group_wait: 0s\n  group_by: [node, gpu]\n",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        now = time.time()
        for gpu in range(6):
            sink.deliver([transition(at=now, gpu=gpu)], now)
        assert sink.wait_idle(5)
        reqs = rx.requests
        assert len(reqs) == 2, [r.json()["text"] for r in reqs]
        assert reqs[1].at - reqs[0].at >= 0.95
        # the first message goes at once; what comes in during the next second is merged
        lines = [r.json()["text"].splitlines() for r in reqs]
        assert lines[0][0].startswith("[FIRING:") and lines[0][1] == "- [page] XID 79 on GPU 0"
        listed = [ln for msg in lines for ln in msg[1:]]
        assert listed == [f"- [page] XID 79 on GPU {g}" for g in range(6)]
        text = metrics_text(sink)
        assert sample(text, "gpuwatchd_notifications_sent_total", receiver="chat") == 6
    finally:
        sink.close()


def test_slack_429_honours_retry_after(tmp_path: Path) -> None:
    answers = [(429, {"Retry-After": "1"}, b"rate_limited"), (200, {}, b"ok")]

    def respond(req: Received) -> tuple[int, dict[str, str], bytes]:
        return answers.pop(0) if answers else (200, {}, b"ok")

    rx = HttpReceiver(free_port(), respond).start()
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: chat, type: slack, url: '{rx.url}/hook', min_interval: 0s}}\n"
        "routing:\n  group_wait: 0s\n",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        start = time.time()
        sink.deliver([transition(at=start)], start)
        rx.wait_for(1, timeout=5)
        assert len(rx.rejected) == 1
        assert rx.requests[0].at - rx.rejected[0].at >= 0.95
        assert (
            sample(metrics_text(sink), "gpuwatchd_notifications_failed_total", receiver="chat") == 1
        )
    finally:
        sink.close()
        rx.stop()


# -- PagerDuty ---------------------------------------------------------------------------
def pd_responder(codes: list[int]) -> tuple[list[int], object]:
    def respond(req: Received) -> tuple[int, dict[str, str], bytes]:
        code = codes.pop(0) if codes else 202
        if code == 202:
            body = {
                "status": "success",
                "message": "Event processed",
                "dedup_key": req.json()["dedup_key"],
            }
            return 202, {"Content-Type": "application/json"}, json.dumps(body).encode()
        headers = {"Retry-After": "1"} if code == 429 else {}
        return code, headers, b'{"status":"invalid event","message":"Event object is invalid"}'

    return codes, respond


def pd_config(tmp_path: Path, rx: HttpReceiver) -> object:
    creds = tmp_path / "creds"
    creds.mkdir(exist_ok=True)
    (creds / "pd-key").write_text("R0UT1NGKEY0123456789abcdefABCDEF\n")
    return make_config(
        tmp_path,
        f"""
receivers:
  - name: pd
    type: pagerduty
    routing_key_file: pd-key
    url: {rx.url}/v2/enqueue
routing:
  group_wait: 0s
""",
    )


def test_pagerduty_trigger_and_resolve(tmp_path: Path) -> None:
    _, respond = pd_responder([])
    rx = HttpReceiver(free_port(), respond).start()  # type: ignore[arg-type]
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
    config = pd_config(tmp_path, rx)
    sink = sink_for(config, SystemClock(), environ=env, start=True)  # type: ignore[arg-type]
    try:
        since = 1_767_225_600.0
        fire = transition(at=since + 5, since=since)
        sink.deliver([fire], since + 5)
        req = rx.wait_for(1)[0]
        assert req.path == "/v2/enqueue"
        ev = req.json()
        dedup = ev["dedup_key"]
        assert dedup == pagerduty_dedup_key(
            {"rule": "gpu_xid_fatal", "severity": "page", "labels": fire.labels}, "node17"
        )
        # a page on a GPU: one key per node and GPU (a cascade is one incident)
        assert dedup.startswith("gpuwatchd/node17/gpu3/") and len(dedup) <= 255
        assert ev["routing_key"] == "R0UT1NGKEY0123456789abcdefABCDEF"
        assert ev["event_action"] == "trigger"
        assert ev["client"] == "gpuwatchd"
        p = ev["payload"]
        assert p["summary"] == "node17: XID 79 on GPU 3"
        assert p["source"] == "node17"
        assert p["severity"] == "critical"
        assert p["timestamp"] == rfc3339(since + 5)
        assert p["class"] == "gpu_xid_fatal"
        assert p["component"] == "gpu3"
        assert p["group"] == "node17"
        detail = p["custom_details"]
        assert detail["xid"] == "79"
        assert detail["labels"]["uuid"] == "GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a13"
        assert detail["since"] == rfc3339(since)
        sink.close()
        # a restart (new sink, same state) keeps the dedup_key: the resolve finds the alert
        sink = sink_for(config, SystemClock(), environ=env, start=True)  # type: ignore[arg-type]
        sink.deliver(
            [transition(state=AlertState.RESOLVED, at=since + 60, since=since, seq=2)], since + 60
        )
        ev = rx.wait_for(2)[1].json()
        assert ev == {
            "routing_key": "R0UT1NGKEY0123456789abcdefABCDEF",
            "dedup_key": dedup,
            "event_action": "resolve",
        }
        # a ticket maps to PagerDuty's "warning"
        sink.deliver(
            [
                transition(
                    "ecc_rising", severity=AlertSeverity.TICKET, at=since + 70, xid=None, gpu=1
                )
            ],
            since + 70,
        )
        assert rx.wait_for(3)[2].json()["payload"]["severity"] == "warning"
    finally:
        sink.close()
        rx.stop()


def test_pagerduty_400_is_retried_once_trimmed_but_429_and_5xx_are_retried(
    tmp_path: Path,
) -> None:
    codes, respond = pd_responder([400, 400, 500, 429])
    rx = HttpReceiver(free_port(), respond).start()  # type: ignore[arg-type]
    env = {"CREDENTIALS_DIRECTORY": str(tmp_path / "creds")}
    config = pd_config(tmp_path, rx)
    clock = VirtualClock(1_800_000_000.0)
    sink = sink_for(config, clock, environ=env)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), gpu=1)], clock.now())
        sink.run_pending()
        # 400: once more with a trimmed payload at once, then dropped for good
        assert len(rx.rejected) == 2 and not rx.requests
        full, trimmed = (r.json() for r in rx.rejected)
        assert "custom_details" in full["payload"]
        assert set(trimmed["payload"]) == {"summary", "source", "severity", "timestamp"}
        assert trimmed["dedup_key"] == full["dedup_key"]
        text = metrics_text(sink)
        assert (
            sample(text, "gpuwatchd_notifications_dropped_total", receiver="pd", reason="rejected")
            == 1
        )
        clock.advance(3600)
        sink.run_pending()
        assert len(rx.rejected) == 2
        # the next page: 500, then 429 (Retry-After: 1), then accepted
        sink.deliver([transition(at=clock.now(), gpu=2, node="node18")], clock.now())
        sink.run_pending()
        assert len(rx.rejected) == 3  # 500
        clock.advance(1.0)  # backoff: retry_initial 1s x jitter in [0.5, 1)
        sink.run_pending()
        assert len(rx.rejected) == 4  # 429 Retry-After: 1
        clock.advance(0.5)
        sink.run_pending()
        assert not rx.requests  # Retry-After not over yet
        clock.advance(0.5)
        sink.run_pending()
        assert len(rx.requests) == 1
        text = metrics_text(sink)
        assert sample(text, "gpuwatchd_notifications_failed_total", receiver="pd") == 4
        assert sample(text, "gpuwatchd_notifications_sent_total", receiver="pd") == 1
        assert not codes
    finally:
        sink.close()
        rx.stop()


# -- secrets -----------------------------------------------------------------------------
def test_secrets_never_in_logs_metrics_or_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # every line of the actions stage; the HTTP library's own lines are the service's
    # logging setup's (kept at WARNING there, and scrubbed of registered secrets)
    caplog.set_level(logging.DEBUG, logger="gpuwatchd")
    port = free_port()  # nothing listens: every attempt fails

    def echo(req: Received) -> tuple[int, dict[str, str], bytes]:  # an error page that echoes
        return 500, {}, (req.path + " " + req.body.decode()).encode()

    echoing = HttpReceiver(free_port(), echo).start()
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "slack").write_text(
        f"http://127.0.0.1:{port}/services/TSECRET1/BSECRET2/slacktoken3\n"
    )
    (creds / "pd").write_text("PDROUTINGKEYSECRET4\n")
    (creds / "auth").write_text("Bearer HEADERSECRET5\n")
    secrets = [
        "TSECRET1",
        "BSECRET2",
        "slacktoken3",
        "PDROUTINGKEYSECRET4",
        "HEADERSECRET5",
        "HMACSECRET6",
        "URLTOKEN7",
    ]
    config = make_config(
        tmp_path,
        f"""
receivers:
  - name: hook
    type: webhook
    url: {echoing.url}/hook/URLTOKEN7?token=URLTOKEN7
    hmac_secret: HMACSECRET6
    header_files: {{Authorization: auth}}
  - name: chat
    type: slack
    url_file: slack
  - name: pd
    type: pagerduty
    routing_key_file: pd
    url: {echoing.url}/v2/enqueue
routing:
  group_wait: 0s
  retry_initial: 50ms
""",
    )
    clock = SystemClock()
    sink = sink_for(config, clock, environ={"CREDENTIALS_DIRECTORY": str(creds)}, start=True)
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        deadline = time.time() + 5
        while time.time() < deadline:
            text = metrics_text(sink)
            if all(
                sample(text, "gpuwatchd_notifications_failed_total", receiver=r) >= 2
                for r in ("hook", "chat", "pd")
            ):
                break
            time.sleep(0.05)
        status = json.dumps(sink.status().as_json())
        assert "last_error" in status and "HTTP 500" in status
        shown = "\n".join([caplog.text, metrics_text(sink), status, json.dumps(config.as_dict())])
        for s in secrets:
            assert s not in shown, f"secret {s} leaked"
        assert config.as_dict()["receivers"][0]["url"] == "<secret>"
    finally:
        sink.close()
        echoing.stop()


def test_pagerduty_events_stay_within_the_api_limits() -> None:
    """Issue 14 item 6: custom_details were unbounded; an event over PagerDuty's 512 KB
    got a 400 and the page was dropped for good."""
    from gpuwatchd.actions.model import alert_record
    from gpuwatchd.actions.receivers import PD_MAX_EVENT_BYTES, pagerduty_events

    huge = "x" * 20_000  # 40 of them in labels and 40 in annotations: 1.6 MB
    t = transition(
        "r" * 5000,
        annotations={f"a{i}": huge for i in range(40)} | {"summary": "s" * 10_000},
        extra={f"l{i}": huge for i in range(40)},
    )
    note = {
        "group_labels": {"node": "n" * 3000},
        "node": "n" * 3000,
        "alerts": [alert_record(t, T0)],
        "changed": [t.fingerprint],
    }
    (event,) = pagerduty_events(note, "R0UT1NGKEY0123456789abcdefABCDEF")
    body = json.dumps(event, separators=(",", ":")).encode()
    assert len(body) <= PD_MAX_EVENT_BYTES
    assert len(event["dedup_key"]) <= 255
    assert len(event["payload"]["summary"]) <= 1024
    assert all(len(event["payload"][k]) <= 255 for k in ("source", "class", "group"))
    (trimmed,) = pagerduty_events(note, "R0UT1NGKEY0123456789abcdefABCDEF", trimmed=True)
    assert "custom_details" not in trimmed["payload"]
    assert trimmed["dedup_key"] == event["dedup_key"]
