"""The real Alertmanager (Debian prometheus-alertmanager) receives pushed alerts from two
"URLs" (two instances), forwards them to a webhook, and the resolve flows through."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from actions_support import HttpReceiver, make_config, sink_for, transition
from alertmanager_support import am_alerts, parse_time, start_for_webhook
from conftest import free_port

from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import SystemClock


@pytest.fixture
def hook() -> Iterator[HttpReceiver]:
    rx = HttpReceiver(free_port()).start()
    yield rx
    rx.stop()


def test_alertmanager_push_forward_and_resolve(tmp_path: Path, hook: HttpReceiver) -> None:
    am1, url1 = start_for_webhook(tmp_path, "am1", hook.url + "/am1")
    am2, url2 = start_for_webhook(tmp_path, "am2", hook.url + "/am2")
    config = make_config(
        tmp_path,
        f"""receivers:
  - name: am
    type: alertmanager
    urls: ["{url1}", "{url2}/"]
    resend_interval: 1s
routing:
  group_wait: 10s  # ignored for Alertmanager receivers: Alertmanager groups itself
""",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        since = time.time() - 60
        sink.deliver([transition(at=since + 60, since=since)], time.time())
        for path in ("/am1", "/am2"):
            deadline = time.time() + 10
            while not any(r.path == path for r in hook.requests):
                assert time.time() < deadline, f"no webhook from {path}: {am1.output()}"
                time.sleep(0.05)
        for url in (url1, url2):
            (alert,) = am_alerts(url)
            assert alert["labels"] == {
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
            assert alert["annotations"]["summary"] == "XID 79 on GPU 3"
            assert alert["status"]["state"] == "active"
            assert abs(parse_time(alert["startsAt"]) - since) < 0.01
            ends = parse_time(alert["endsAt"])
            assert time.time() + 2 < ends <= time.time() + 4.5  # now + 4 x resend_interval
        fired = next(r for r in hook.requests if r.path == "/am1").json()
        assert fired["version"] == "4" and fired["status"] == "firing"
        assert fired["alerts"][0]["labels"]["alertname"] == "gpu_xid_fatal"
        # firing alerts are re-sent: endsAt keeps moving ahead
        first_end = parse_time(am_alerts(url1)[0]["endsAt"])
        time.sleep(2.5)
        assert parse_time(am_alerts(url1)[0]["endsAt"]) > first_end + 1
        sink.deliver(
            [transition(state=AlertState.RESOLVED, seq=2, at=time.time(), since=since)], time.time()
        )
        deadline = time.time() + 15
        while True:
            resolved = [r.json() for r in hook.requests if r.json()["status"] == "resolved"]
            paths = {r.path for r in hook.requests if r.json()["status"] == "resolved"}
            if paths == {"/am1", "/am2"}:
                break
            assert time.time() < deadline, "no resolved webhook from both Alertmanagers"
            time.sleep(0.05)
        assert resolved[0]["alerts"][0]["status"] == "resolved"
        assert not am_alerts(url1) and not am_alerts(url2)
        time.sleep(1.5)  # no more re-sends after the resolve: Alertmanager stays clear
        assert not am_alerts(url1)
    finally:
        sink.close()
        am1.stop()
        am2.stop()


def test_one_alertmanager_down_does_not_stop_resends_to_the_other(
    tmp_path: Path, hook: HttpReceiver
) -> None:
    from gpuwatchd.core.clock import VirtualClock

    down = f"http://127.0.0.1:{free_port()}"
    config = make_config(
        tmp_path,
        f"receivers:\n  - {{name: am, type: alertmanager, urls: ['{hook.url}', '{down}'], "
        "resend_interval: 1m}\n",
    )
    clock = VirtualClock(1_800_000_000.0)
    sink = sink_for(config, clock)
    try:
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()
        for _ in range(3):
            clock.advance(60)
            sink.run_pending()
        pushes = [r for r in hook.requests if r.path == "/api/v2/alerts"]
        assert len(pushes) == 4
        body = pushes[0].json()
        assert isinstance(body, list) and set(body[0]) == {
            "labels",
            "annotations",
            "startsAt",
            "endsAt",
            "generatorURL",
        }
        ends = [parse_time(p.json()[0]["endsAt"]) for p in pushes]
        assert ends == sorted(ends) and ends[-1] - ends[0] == pytest.approx(180, abs=1)
        assert ends[0] == pytest.approx(1_800_000_000.0 + 240, abs=1)  # 4 x resend_interval
        queue = sink.status().as_json()["deliveries"]["queue"]
        assert [q["target"] for q in queue] == [1]  # only the first push waits for the other
    finally:
        sink.close()
