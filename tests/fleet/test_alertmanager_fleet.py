"""Issue 28 item 5: pages at fleet scale, on a real Alertmanager with the shipped fleet config
(packaging/alertmanager/gpuwatchd-fleet.yml and gpuwatchd-fleet.tmpl).

520 nodes push, concurrently, the alerts gpuwatchd's ``alertmanager`` receiver really builds
(the real pipeline over a scenario, the node's name replaced): 480 see XID 119 and 20 XID 120
(a driver event: one GPU each), 20 lose a GPU (XID 79 and GPU_IS_LOST). On-call gets one message per
alert name on each receiver, carrying the counts and the XIDs and a few kilobytes at most;
the shipped inhibit rules still hold (no node's XID 79 reaches the XID page).

Before: no fleet config was shipped; the grouping the docs recommended gave, with
Alertmanager's default templates, notifications of 0.4-1.1 MB listing every node."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from actions_support import HttpReceiver
from conftest import need_binary
from fleet_pages_support import (
    FALLEN_OFF_BUS,
    FLEET_CONFIG,
    INHIBIT,
    XID119,
    XID120,
    FleetAlertmanager,
    Notification,
    as_node,
    fleet_config,
    node_payload,
    storm,
)

pytestmark = pytest.mark.slow

XID_NODES = 500  # 480 with XID 119, 20 with XID 120
LOST_NODES = 20
GROUP_WAIT = 30.0  # the shipped route's


@pytest.fixture
def hook() -> Iterator[HttpReceiver]:
    rx = HttpReceiver(0).start()  # a port the OS picks
    yield rx
    rx.stop()


def test_the_fleet_config_keeps_the_shipped_inhibit_rules() -> None:
    fleet = yaml.safe_load(FLEET_CONFIG.read_text())
    assert fleet["inhibit_rules"] == yaml.safe_load(INHIBIT.read_text())["inhibit_rules"]
    route = fleet["route"]
    assert route["group_by"] == ["alertname", "cluster"]
    hooks = [w for r in fleet["receivers"] for w in r.get("webhook_configs", [])]
    assert hooks and all(0 < w["max_alerts"] <= 20 for w in hooks)


def test_the_fleet_config_is_valid(tmp_path: Path) -> None:
    import subprocess

    amtool = need_binary("amtool")
    config = fleet_config("http://127.0.0.1:1", tmp_path)
    res = subprocess.run([amtool, "check-config", str(config)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "1 templates" in res.stdout


def by_alert(sent: list[Notification], receiver: str) -> dict[str, list[Notification]]:
    out: dict[str, list[Notification]] = {}
    for n in sent:
        if n.receiver == receiver:
            out.setdefault(n.alertname, []).append(n)
    return out


def test_a_fleet_wide_xid_is_one_small_notification(tmp_path: Path, hook: HttpReceiver) -> None:
    xid = node_payload(XID119, 60.0, tmp_path)
    xid120 = node_payload(XID120, 60.0, tmp_path)
    lost = node_payload(FALLEN_OFF_BUS, 3600.0, tmp_path)
    bodies = [as_node(xid, f"gpu-{i:05d}") for i in range(XID_NODES - 20)]
    bodies += [as_node(xid120, f"gpu-x120-{i:03d}") for i in range(20)]
    bodies += [as_node(lost, f"gpu-lost-{i:03d}") for i in range(LOST_NODES)]
    am = FleetAlertmanager(tmp_path, hook)
    try:
        took = storm(am.url, bodies)
        # the storm is over long before group_wait ends: every alert is in the first message
        assert took < GROUP_WAIT - 5, f"the senders took {took:.1f}s"
        deadline = time.monotonic() + GROUP_WAIT + 60
        while len(am.notifications()) < 6 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5.0)  # anything more would be here by now (group_interval is 5m)
        sent = am.notifications()
    finally:
        am.stop()
    for n in sorted(sent, key=lambda n: (n.receiver, n.alertname)):
        print(f"{n.receiver:9} {n.alertname:12} {n.size:6} bytes  {n.title}")
    pagerduty = by_alert(sent, "pagerduty")
    slack = by_alert(sent, "slack")
    webhook = by_alert(sent, "webhook")
    # one message per alert name and receiver: 2 groups x 3 receivers, not 540 pages
    assert {k: len(v) for k, v in pagerduty.items()} == {"GpuXidFatal": 1, "GpuLost": 1}
    assert {k: len(v) for k, v in slack.items()} == {"GpuXidFatal": 1, "GpuLost": 1}
    assert {k: len(v) for k, v in webhook.items()} == {"GpuXidFatal": 1, "GpuLost": 1}
    assert len(sent) == 6
    # the count and the XIDs; the lost GPUs' XID 79 is inhibited by GpuLost, as shipped
    xid_title = (
        f"[FIRING:{XID_NODES}] GpuXidFatal on {XID_NODES} node(s): "
        "XID 119 on 480 GPU(s), XID 120 on 20 GPU(s)"
    )
    assert pagerduty["GpuXidFatal"][0].title == xid_title
    assert slack["GpuXidFatal"][0].title == xid_title
    assert pagerduty["GpuLost"][0].title == f"[FIRING:{LOST_NODES}] GpuLost on 20 node(s)"
    text = slack["GpuXidFatal"][0].body["attachments"][0]["text"]
    assert text.count("- XID 119 on GPU 0 (00000000:18:00.0) of gpu-") == 5
    assert f"... and {XID_NODES} in all (the first 5 shown)" in text
    details = pagerduty["GpuXidFatal"][0].body["payload"]["custom_details"]
    assert details["num_firing"] == str(XID_NODES)
    hook_msg = webhook["GpuXidFatal"][0].body
    assert len(hook_msg["alerts"]) == 10
    assert len(hook_msg["alerts"]) + hook_msg["truncatedAlerts"] == XID_NODES
    # small: a few kilobytes whatever the number of nodes
    for n in sent:
        assert n.size < (16_000 if n.receiver == "webhook" else 4_000), (n.receiver, n.size)
