"""Issue 23 item 2: one page per fault across both alerting paths, on a real Alertmanager
(and a real Prometheus).

- The node pushes its alerts; Prometheus runs the shipped twins
  (packaging/prometheus/gpuwatchd-rules.yaml) with the shipped alert relabelling
  (gpuwatchd-alert-relabel.yaml): both reach the same Alertmanager with the same labels,
  so it holds one alert per fault and notifies once.
- The shipped inhibit rules (packaging/alertmanager/gpuwatchd-inhibit.yaml): GpuLost
  inhibits GpuXidFatal on the same GPU; a node-level fault inhibits the per-GPU alerts.

Before: two alerts per fault that Alertmanager could not merge (the twins had instance and
job, no node and no gpuwatchd_severity), two PagerDuty incidents for XID 79 (GpuXidFatal
and GpuLost), no inhibit rules."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_support import HttpReceiver, make_config, sink_for, transition
from alertmanager_support import am_alerts, start_alertmanager
from conftest import ROOT, need_binary
from prometheus_support import Prometheus, scrape_config

from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.clock import SystemClock

pytestmark = pytest.mark.slow

INHIBIT = ROOT / "packaging" / "alertmanager" / "gpuwatchd-inhibit.yaml"
RELABEL = ROOT / "packaging" / "prometheus" / "gpuwatchd-alert-relabel.yaml"
RULES = ROOT / "packaging" / "prometheus" / "gpuwatchd-rules.yaml"
UNHEALTHY = ROOT / "tests" / "data" / "check-unhealthy.yaml"


@pytest.fixture
def hook() -> Iterator[HttpReceiver]:
    rx = HttpReceiver(0).start()
    assert rx.server is not None
    rx.port = int(rx.server.server_address[1])
    yield rx
    rx.stop()


def am_config(hook_url: str) -> dict[str, Any]:
    """The shipped inhibit rules under one route to the test's webhook."""
    return {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname", "node", "gpu"],
            "group_wait": "1s",
            "group_interval": "1h",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "hook", "webhook_configs": [{"url": hook_url + "/hook"}]}],
        **yaml.safe_load(INHIBIT.read_text()),
    }


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def states(url: str) -> dict[tuple[str, str], str]:
    return {
        (a["labels"]["alertname"], a["labels"].get("gpu", "")): a["status"]["state"]
        for a in am_alerts(url)
    }


def test_shipped_inhibit_rules_on_a_real_alertmanager(tmp_path: Path, hook: HttpReceiver) -> None:
    am, url = start_alertmanager(tmp_path / "am", am_config(hook.url))
    config = make_config(
        tmp_path, f"receivers:\n  - {{name: am, type: alertmanager, urls: ['{url}']}}\n"
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        now = time.time()
        sink.deliver(
            [
                transition("GpuXidFatal", gpu=1, xid=None, at=now, seq=1),  # XID 79 first
                transition("GpuLost", gpu=1, xid=None, at=now + 0.4, seq=1),
                transition("GpuXidFatal", gpu=2, xid=None, at=now, seq=1),
                transition("GpuTemperatureHigh", gpu=3, xid=None, at=now, seq=1),
            ],
            now,
        )
        wait_for("4 alerts", lambda: len(am_alerts(url)) == 4)
        seen = wait_for(
            "GpuXidFatal on GPU 1 suppressed",
            lambda: (s := states(url)).get(("GpuXidFatal", "1")) == "suppressed" and s,
        )
        assert seen == {
            ("GpuXidFatal", "1"): "suppressed",  # the lost GPU's XID 79: GpuLost stands for it
            ("GpuLost", "1"): "active",
            ("GpuXidFatal", "2"): "active",  # another GPU: its own page
            ("GpuTemperatureHigh", "3"): "active",
        }
        # a node-level fault covers the node's per-GPU alerts
        sink.deliver(
            [
                transition(
                    "GpuCountBelowExpected", gpu=0, xid=None, at=now + 1, seq=1, extra={"gpu": ""}
                )
            ],
            now + 1,
        )
        # One listing of Alertmanager's alerts once showed the per-GPU alerts suppressed
        # while the node alert that suppresses them was not listed yet (CI, stop 31): the
        # list and the inhibition marks are read apart. Wait for the whole picture.
        seen = wait_for(
            "the node alert active and the per-GPU alerts suppressed",
            lambda: (
                (s := states(url)).get(("GpuTemperatureHigh", "3")) == "suppressed"
                and s.get(("GpuCountBelowExpected", "")) == "active"
                and s
            ),
        )
        assert {k: v for k, v in seen.items() if k[1]} == dict.fromkeys(
            [
                ("GpuXidFatal", "1"),
                ("GpuLost", "1"),
                ("GpuXidFatal", "2"),
                ("GpuTemperatureHigh", "3"),
            ],
            "suppressed",
        )
        time.sleep(2.0)  # past group_wait: what was sent
        sent = {
            (a["labels"]["alertname"], a["labels"].get("gpu", ""))
            for r in hook.requests
            for a in r.json()["alerts"]
        }
        assert ("GpuXidFatal", "1") not in sent, "XID 79 paged besides GpuLost"
    finally:
        sink.close()
        am.stop()


def test_node_alerts_and_prometheus_twins_merge_into_one_page(
    tmp_path: Path, hook: HttpReceiver, daemon_factory: Callable[..., tuple[Any, str]]
) -> None:
    """A daemon on a node with a lost GPU and a GPU asking for a reset pushes to
    Alertmanager; a real Prometheus scrapes it, runs the shipped twins with the shipped
    relabelling and sends to the same Alertmanager: one alert per fault, one message."""
    am, am_url = start_alertmanager(tmp_path / "am", am_config(hook.url))
    prom: Prometheus | None = None
    try:
        cfg = tmp_path / "gpuwatchd.yaml"
        cfg.write_text(
            "node_name: 127.0.0.1\nsources: {kernel_log: none}\n"
            f"receivers:\n  - {{name: am, type: alertmanager, urls: ['{am_url}']}}\n"
        )
        _, daemon_url = daemon_factory("-c", str(cfg), "--backend", f"scenario:{UNHEALTHY}")
        faults = {("GpuLost", "1"), ("GpuRecoveryActionRequired", "2")}
        wait_for("the node's pages", lambda: faults <= set(states(am_url)))
        relabel = yaml.safe_load(RELABEL.read_text())["alert_relabel_configs"]
        prom_cfg = {
            **scrape_config(gpuwatchd=daemon_url),
            "rule_files": [str(RULES)],
            "alerting": {
                "alert_relabel_configs": relabel,
                "alertmanagers": [
                    {"static_configs": [{"targets": [am_url.removeprefix("http://")]}]}
                ],
            },
        }
        prom = Prometheus(tmp_path, prom_cfg).wait_ready()
        prom_url = prom.url

        def prometheus_sent() -> bool:  # the twins fired and Prometheus sent them
            with urllib.request.urlopen(prom_url + "/metrics", timeout=5) as resp:
                text = resp.read().decode()
            sent = [
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("prometheus_notifications_sent_total")
            ]
            return bool(sent) and sum(sent) >= 2

        wait_for("Prometheus's twins sent", prometheus_sent)
        wait_for(
            "Alertmanager updated by Prometheus",
            lambda: all(
                "/graph" in a["generatorURL"]
                for a in am_alerts(am_url)
                if (a["labels"]["alertname"], a["labels"].get("gpu")) in faults
            ),
        )
        time.sleep(2.0)  # any second alert would be there by now
        alerts = am_alerts(am_url)
        for name, gpu in faults:
            same = [
                a
                for a in alerts
                if a["labels"]["alertname"] == name and a["labels"].get("gpu") == gpu
            ]
            assert len(same) == 1, [a["labels"] for a in alerts]
            assert same[0]["labels"]["node"] == "127.0.0.1"
            assert same[0]["labels"]["gpuwatchd_severity"] == "page"
            assert "instance" not in same[0]["labels"]
        pages = [
            r.json()
            for r in hook.requests
            if r.json()["commonLabels"].get("alertname") in ("GpuLost",)
        ]
        assert len(pages) == 1 and len(pages[0]["alerts"]) == 1, pages
    finally:
        if prom is not None:
            prom.stop()
        am.stop()


def test_the_inhibit_and_relabel_files_are_valid(tmp_path: Path) -> None:
    amtool = need_binary("amtool")
    config = {
        "route": {"receiver": "x"},
        "receivers": [{"name": "x"}],
        **yaml.safe_load(INHIBIT.read_text()),
    }
    (tmp_path / "am.yml").write_text(yaml.safe_dump(config))
    import subprocess

    res = subprocess.run(
        [amtool, "check-config", str(tmp_path / "am.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    promtool = need_binary("promtool")
    (tmp_path / "p.yml").write_text(
        yaml.safe_dump({"alerting": yaml.safe_load(RELABEL.read_text())})
    )
    res = subprocess.run(
        [promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert AlertSeverity.PAGE.value == "page"
