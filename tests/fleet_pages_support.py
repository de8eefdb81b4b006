"""A page storm on a real Alertmanager: many nodes push the alerts gpuwatchd really builds.

``node_payload`` runs the real pipeline (``Simulation``) over a scenario once, with the
``alertmanager`` receiver sending through a capturing transport, and keeps the body it
POSTs to ``/api/v2/alerts`` at the fault (timed so that the fault is now). ``storm`` posts
that body as many nodes (the node's name replaced), concurrently from a few threads, to a
running Alertmanager. ``FleetAlertmanager`` starts one on the shipped
packaging/alertmanager/gpuwatchd-fleet.yml with its receivers pointed at a local capture.
Used by tests/fleet/test_alertmanager_fleet.py and bench/fleet_pages.py.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from actions_support import HttpReceiver
from conftest import ROOT, Proc, free_port, need_binary, wait_http

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario
from gpuwatchd.service.assembly import Wiring

FLEET_CONFIG = ROOT / "packaging" / "alertmanager" / "gpuwatchd-fleet.yml"
FLEET_TEMPLATE = ROOT / "packaging" / "alertmanager" / "gpuwatchd-fleet.tmpl"
INHIBIT = ROOT / "packaging" / "alertmanager" / "gpuwatchd-inhibit.yaml"
XID119 = ROOT / "tests" / "data" / "fleet-xid119.yaml"
XID120 = ROOT / "tests" / "data" / "fleet-xid120.yaml"
FALLEN_OFF_BUS = ROOT / "scenarios" / "fallen-off-bus.yaml"
TEMPLATE_NODE = "gpu-template-node"


def node_payload(scenario: Path, fault_at: float, tmp_path: Path) -> bytes:
    """The alerts one node pushes at its fault (``fault_at`` seconds into ``scenario``),
    as its ``alertmanager`` receiver renders them: the fault happens now, in real time."""
    posted: list[tuple[float, list[dict[str, Any]]]] = []
    clock = VirtualClock(time.time() - fault_at)

    def capture(request: httpx.Request) -> httpx.Response:
        posted.append((clock.now(), json.loads(request.content)))
        return httpx.Response(200)

    cfg = tmp_path / f"node-{scenario.stem}.yaml"
    cfg.write_text(
        f"node_name: {TEMPLATE_NODE}\n"
        "receivers:\n  - {name: am, type: alertmanager, urls: ['http://127.0.0.1:9']}\n"
    )
    sim = Simulation(
        load_scenario(str(scenario)),
        load_config(str(cfg), must_exist=True, environ={}),
        clock=clock,
        wiring=Wiring(send_recorded=True, transport=httpx.MockTransport(capture)),
    )
    t0 = sim.t0
    step = sim.scenario.step
    t = 0.0
    while t <= fault_at + 2 * step:  # the fault, and what follows it within two polls
        sim.step()
        t += step
        sim.advance_to(t0 + t)
    sim.finish()
    first = min(at for at, _ in posted)
    merged: dict[str, dict[str, Any]] = {}
    for at, alerts in posted:
        if at <= first + 10:  # the fault's pushes, not the repeats a minute later
            for a in alerts:
                merged[json.dumps(a["labels"], sort_keys=True)] = a
    return json.dumps(list(merged.values())).encode()


def as_node(body: bytes, node: str) -> bytes:
    return body.replace(TEMPLATE_NODE.encode(), node.encode())


def storm(url: str, bodies: list[bytes], threads: int = 8) -> float:
    """POST every body to Alertmanager from ``threads`` threads; the seconds it took."""

    def post(body: bytes) -> int:
        req = urllib.request.Request(
            url + "/api/v2/alerts",
            data=body,
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)

    started = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        codes = list(pool.map(post, bodies))
    assert codes == [200] * len(bodies), sorted(set(codes))
    return time.monotonic() - started


@dataclass
class Notification:
    receiver: str  # pagerduty, slack or webhook
    size: int  # bytes of the request body
    body: dict[str, Any]

    @property
    def title(self) -> str:
        """The group's one-line title (PagerDuty's summary, Slack's title, webhook: none)."""
        if self.receiver == "pagerduty":
            return str(self.body["payload"]["summary"])
        if self.receiver == "slack":
            return str(self.body["attachments"][0]["title"])
        return ""

    @property
    def alertname(self) -> str:
        if self.receiver == "webhook":
            return str(self.body["groupLabels"]["alertname"])
        return self.title.split("] ", 1)[1].split(" ", 1)[0]


def fleet_config(hook: str, tmp_path: Path) -> Path:
    """The shipped config with its secrets' files, template path and URLs made local."""
    config = yaml.safe_load(FLEET_CONFIG.read_text())
    (tmp_path / "slack.url").write_text(hook + "/slack\n")
    (tmp_path / "pagerduty.key").write_text("0123456789abcdef0123456789abcdef\n")
    config["templates"] = [str(FLEET_TEMPLATE)]
    for receiver in config["receivers"]:
        for pd in receiver.get("pagerduty_configs", []):
            pd["routing_key_file"] = str(tmp_path / "pagerduty.key")
            pd["url"] = hook + "/pagerduty"
        for slack in receiver.get("slack_configs", []):
            slack["api_url_file"] = str(tmp_path / "slack.url")
        for hook_cfg in receiver.get("webhook_configs", []):
            hook_cfg["url"] = hook + "/webhook"
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


class FleetAlertmanager:
    """A real Alertmanager on the shipped fleet config (or ``config``, written already),
    notifying ``hook``."""

    def __init__(self, tmp_path: Path, hook: HttpReceiver, config: Path | None = None) -> None:
        binary = need_binary("prometheus-alertmanager")
        config = config or fleet_config(hook.url, tmp_path)
        (tmp_path / "am-data").mkdir()
        port = free_port()
        self.hook = hook
        self.proc = Proc(
            [
                binary,
                f"--config.file={config}",
                f"--storage.path={tmp_path / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            tmp_path / "am.log",
        )
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_http(self.url + "/-/ready", timeout=20)
        except AssertionError:
            self.proc.stop()
            raise

    def notifications(self) -> list[Notification]:
        return [
            Notification(r.path.strip("/").split("/")[0], len(r.body), r.json())
            for r in list(self.hook.requests)
        ]

    def stop(self) -> None:
        self.proc.stop()
