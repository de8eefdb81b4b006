"""Alertmanager conventions: routes written for severity="critical" match gpuwatchd's pages,
a rule can choose its own severity label, and generatorURL / externalURL lead somewhere."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from actions_support import HttpReceiver, make_config, sink_for, transition
from alertmanager_support import start_alertmanager
from conftest import free_port

from gpuwatchd.actions.receivers import external_labels
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.rules.loader import parse_rules

# A routing tree as operators write it for Prometheus alerts: by severity="critical" etc.
AM_ROUTES = """\
route:
  receiver: other
  group_by: [alertname, gpu]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - matchers: ['severity="critical"']
      receiver: critical
    - matchers: ['severity="warning"']
      receiver: warning
    - matchers: ['severity="p1"']
      receiver: p1
receivers:
  - name: other
    webhook_configs: [{{url: "{hook}/other"}}]
  - name: critical
    webhook_configs: [{{url: "{hook}/critical"}}]
  - name: warning
    webhook_configs: [{{url: "{hook}/warning"}}]
  - name: p1
    webhook_configs: [{{url: "{hook}/p1"}}]
"""


@pytest.fixture
def hook() -> Iterator[HttpReceiver]:
    rx = HttpReceiver(free_port()).start()
    yield rx
    rx.stop()


def test_severity_routes_of_a_real_alertmanager_match(tmp_path: Path, hook: HttpReceiver) -> None:
    am, url = start_alertmanager(tmp_path / "am", AM_ROUTES.format(hook=hook.url))
    config = make_config(
        tmp_path,
        f"""receivers:
  - name: am
    type: alertmanager
    urls: ["{url}"]
    external_url: https://gpu-a17.example.org:9835/
""",
    )
    sink = sink_for(config, SystemClock(), start=True)
    try:
        now = time.time()
        sink.deliver(
            [
                transition("GpuXidFatal", gpu=1, at=now, seq=1),
                transition("GpuEccCorrectedRising", severity=AlertSeverity.TICKET, gpu=2, xid=None,
                           at=now, seq=2),
                transition("SiteRule", gpu=3, xid=None, extra={"severity_label": "p1"}, at=now,
                           seq=3),
            ],
            now,
        )  # fmt: skip
        deadline = time.time() + 15
        paths = {"/critical", "/warning", "/p1"}
        while not paths <= {r.path for r in hook.requests}:
            assert time.time() < deadline, (
                f"routes reached: {sorted({r.path for r in hook.requests})}\n{am.output()}"
            )
            time.sleep(0.05)
    finally:
        sink.close()
        am.stop()
    by_path = {r.path: r.json() for r in hook.requests}
    assert "/other" not in by_path  # every alert matched a severity route
    critical = by_path["/critical"]["alerts"][0]
    assert critical["labels"]["alertname"] == "GpuXidFatal"
    assert critical["labels"]["gpuwatchd_severity"] == "page"
    fp = critical["labels"]  # the status page, at the alert's own section
    assert critical["generatorURL"].startswith("https://gpu-a17.example.org:9835/#alert-"), fp
    assert by_path["/warning"]["alerts"][0]["labels"]["alertname"] == "GpuEccCorrectedRising"
    p1 = by_path["/p1"]["alerts"][0]["labels"]
    assert p1["alertname"] == "SiteRule" and "severity_label" not in p1


def test_mapping_is_configurable_per_receiver_and_merges_with_the_default(
    tmp_path: Path,
) -> None:
    config = make_config(
        tmp_path,
        """receivers:
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/x
    severity_labels: {ticket: minor}
""",
    )
    (rc,) = config.receivers
    assert rc.severity_labels == {"page": "critical", "ticket": "minor", "info": "info"}  # type: ignore[union-attr]
    rec = transition(severity=AlertSeverity.TICKET).as_dict()
    assert external_labels(rec, rc.severity_labels)["severity"] == "minor"  # type: ignore[union-attr]
    assert external_labels(rec)["severity"] == "warning"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{urgent: critical}", "'urgent' is not a gpuwatchd severity (page, ticket, info)"),
        ('{page: "very bad"}', "'very bad' is not a severity label value"),
        ("critical", "expected a mapping"),
    ],
)
def test_bad_mapping_names_file_line_and_field(tmp_path: Path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        make_config(
            tmp_path,
            f"""receivers:
  - name: hook
    type: webhook
    url: http://127.0.0.1:9/x
    severity_labels: {entry}
""",
        )
    text = "\n".join(err.value.lines())
    assert "gpuwatchd.yaml:7:" in text and "receivers[0].severity_labels" in text, text
    assert message in text, text


def test_a_rule_file_may_set_its_own_severity_label() -> None:
    (rule,) = parse_rules(
        """rules:
- name: SiteHot
  severity: ticket
  labels: {severity_label: p1}
  condition:
    threshold: {field: temperature_gpu, op: '>', value: 90}
""",
        "site.yaml",
    )
    assert rule.labels["severity_label"] == "p1"
