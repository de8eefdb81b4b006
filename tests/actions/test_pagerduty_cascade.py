"""Issue 23 item 2: PagerDuty dedup so that a cascade is one incident.

A GPU that falls off the bus logs XID 79 (GpuXidFatal) and answers GPU_IS_LOST (GpuLost)
0.4 s later. Both are pages on the same GPU: they carry one dedup_key (node and GPU), so
PagerDuty opens one incident, and it resolves with the cascade's last page, not its first.

Before: one dedup_key per alert (node, rule, fingerprint): two incidents for one fault."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
from conftest import ROOT

from gpuwatchd.actions.receivers import pagerduty_dedup_key, pagerduty_events
from gpuwatchd.configfile.loader import load_config
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario
from gpuwatchd.service.assembly import Wiring

KEY = "R0UT1NGKEY0123456789abcdefABCDEF"


def pagerduty_from_the_pipeline(tmp_path: Path, scenario: Path) -> list[dict[str, Any]]:
    """The PagerDuty events the real pipeline sends over ``scenario``."""
    events: list[dict[str, Any]] = []

    def capture(request: httpx.Request) -> httpx.Response:
        events.append(json.loads(request.content))
        return httpx.Response(202, json={"status": "success"})

    (tmp_path / "pd.key").write_text(KEY + "\n")
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(
        "node_name: gpu-a17\n"
        "receivers:\n"
        f"  - {{name: pd, type: pagerduty, routing_key_file: {tmp_path / 'pd.key'},"
        " url: 'http://pagerduty.invalid/v2/enqueue'}\n"
    )
    sim = Simulation(
        load_scenario(str(scenario)),
        load_config(str(cfg), must_exist=True, environ={}),
        wiring=Wiring(send_recorded=True, transport=httpx.MockTransport(capture)),
    )
    sim.run()
    return events


def test_xid_79_and_the_lost_gpu_are_one_pagerduty_incident(tmp_path: Path) -> None:
    events = pagerduty_from_the_pipeline(tmp_path, ROOT / "scenarios" / "fallen-off-bus.yaml")
    triggers = [e for e in events if e["event_action"] == "trigger"]
    rules = {e["payload"]["class"] for e in triggers}
    assert {"GpuXidFatal", "GpuLost"} <= rules, rules
    cascade = [e for e in triggers if e["payload"]["class"] in ("GpuXidFatal", "GpuLost")]
    assert len({e["dedup_key"] for e in cascade}) == 1, "one incident for the lost GPU"
    (key,) = {e["dedup_key"] for e in cascade}
    assert key.startswith("gpuwatchd/gpu-a17/gpu3/") and len(key) <= 255


def alert(rule: str, state: str, gpu: str = "3", severity: str = "page") -> dict[str, Any]:
    labels = {"node": "gpu-a17", "gpu": gpu, "uuid": f"GPU-0000-{gpu}"}
    return {
        "rule": rule,
        "state": state,
        "severity": severity,
        "labels": labels,
        "annotations": {"summary": f"{rule} on GPU {gpu}"},
        "fingerprint": f"{rule}-{gpu}",
        "timestamp": 1_767_225_600.0,
        "active_since": 1_767_225_600.0,
        "value": 1.0,
    }


def note(*alerts: dict[str, Any], changed: list[str]) -> dict[str, Any]:
    return {
        "node": "gpu-a17",
        "group_labels": {"node": "gpu-a17"},
        "alerts": list(alerts),
        "changed": changed,
    }


def test_the_incident_resolves_with_the_cascade_s_last_page() -> None:
    xid, lost = alert("GpuXidFatal", "resolved"), alert("GpuLost", "firing")
    # the XID page resolves (its quiet hour is over) while the GPU is still lost: no resolve
    assert pagerduty_events(note(xid, lost, changed=["GpuXidFatal-3"]), KEY) == []
    # the GPU comes back: the incident resolves
    lost_done = alert("GpuLost", "resolved")
    (event,) = pagerduty_events(note(xid, lost_done, changed=["GpuLost-3"]), KEY)
    assert event["event_action"] == "resolve"
    assert event["dedup_key"] == pagerduty_dedup_key(xid, "gpu-a17")


def test_other_gpus_and_tickets_keep_their_own_incidents() -> None:
    keys = {
        pagerduty_dedup_key(a, "gpu-a17")
        for a in (
            alert("GpuXidFatal", "firing", gpu="3"),
            alert("GpuXidFatal", "firing", gpu="4"),  # another GPU
            alert("NvlinkDown", "firing", gpu="3", severity="ticket"),  # not a page
        )
    }
    assert len(keys) == 3
    # a ticket that resolves is sent even while a page on its GPU fires
    ticket = alert("NvlinkDown", "resolved", severity="ticket")
    page = alert("GpuLost", "firing")
    (event,) = pagerduty_events(note(ticket, page, changed=["NvlinkDown-3"]), KEY)
    assert event["event_action"] == "resolve"
