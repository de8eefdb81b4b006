"""Issue 23 item 1: annotations follow the values while an alert fires, as Prometheus
re-renders them at every evaluation; every later message (a repeat, an update, the
resolve, the status API) says what holds now.

Before: the text was rendered once, when the alert fired; a counter at 64 still read
"1 corrected ECC error(s) in 1d" in the status API and in every 4-hourly repeat."""

from __future__ import annotations

import re
from pathlib import Path

from actions_support import HttpReceiver, make_config
from conftest import ROOT
from rulekit import Node

from gpuwatchd.core.alerts import AlertState
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario
from gpuwatchd.service.assembly import Wiring

ECC_RULE = """
rules:
  - name: EccRising
    severity: ticket
    condition:
      increase: {field: ecc_corrected_volatile, window: 1d}
    annotations:
      summary: 'GPU {gpu}: {value:.0f} corrected ECC error(s) in {window}'
"""


def test_a_firing_alerts_text_follows_its_counter() -> None:
    node = Node(ECC_RULE, gpus=2)
    node.poll()
    node.add(1, ecc_corrected_volatile=1.0)
    fired = [t for t in node.step() if t.state is AlertState.FIRING]
    assert [t.annotations["summary"] for t in fired] == ["GPU 1: 1 corrected ECC error(s) in 1d"]
    for _ in range(63):
        node.add(1, ecc_corrected_volatile=1.0)
        assert not [t for t in node.step() if t.state is not AlertState.PENDING]
    (alert,) = node.engine.alerts(AlertState.FIRING)
    assert alert.annotations["summary"] == "GPU 1: 64 corrected ECC error(s) in 1d"
    assert node.engine.current(alert.rule, alert.fingerprint) == (alert.annotations, 64.0)


def test_the_pending_text_follows_too_and_the_page_says_the_value_at_firing() -> None:
    node = Node(
        """
        rules:
          - name: Hot
            severity: page
            for: 1m
            condition: {threshold: {field: temperature_gpu, op: '>', value: 85}}
            annotations: {summary: 'GPU {gpu} at {value:.0f} C'}
        """,
        gpus=1,
    )
    node.set(0, temperature_gpu=86.0)
    node.step()
    node.set(0, temperature_gpu=90.0)
    node.step()
    (pending,) = node.engine.alerts(AlertState.PENDING)
    assert pending.annotations["summary"] == "GPU 0 at 90 C"
    node.set(0, temperature_gpu=93.0)
    fired = [t for t in node.run(60.0) if t.state is AlertState.FIRING]
    assert [t.annotations["summary"] for t in fired] == ["GPU 0 at 93 C"]


def _crc_counts(requests: list[dict[str, object]]) -> list[tuple[str, int]]:
    out = []
    for body in requests:
        for alert in body["alerts"]:  # type: ignore[attr-defined]
            if alert["labels"]["alertname"] != "NvlinkCrcErrorsRising":
                continue
            m = re.search(r": (\d+) CRC errors in 10m", alert["annotations"]["summary"])
            assert m is not None, alert["annotations"]
            out.append((str(body["status"]), int(m.group(1))))
    return out


def test_every_message_of_a_firing_alert_carries_the_current_count(tmp_path: Path) -> None:
    """The shipped NVLink rule on the bundled CRC storm, delivered to a real HTTP
    receiver: the first message counts a few errors, the repeats during the storm count
    tens of thousands, as Prometheus's twin of the rule would say at the same moment."""
    rx = HttpReceiver(0).start()  # a port the OS picks
    try:
        config = make_config(
            tmp_path,
            f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\n"
            "routing:\n  group_wait: 0s\n  repeat_interval: 10m\n  ticket_repeat_interval: 10m\n"
            "  group_by: [node, gpu]\n",
        )
        scenario = load_scenario(str(ROOT / "scenarios" / "nvlink-crc-storm.yaml"))
        sim = Simulation(scenario, config, wiring=Wiring(send_recorded=True))
        sim.run()
        sim.node.close()
        counts = _crc_counts([r.json() for r in rx.requests])
    finally:
        rx.stop()
    firing = [n for status, n in counts if status == "firing"]
    assert len(firing) >= 4, counts
    assert firing[0] < 100, counts  # the trickle: a few errors a minute
    assert max(firing) > 10_000, counts  # 200 a second for ten minutes
    assert len(set(firing)) > 2, f"the text froze at first firing: {counts}"
