"""XID overrides from the config reach the page: the action text (the new action's words or
the site's own ``text``) on every page and message, and ``fatal`` moving a code into or out of
the fatal set that ``GpuXidFatal`` pages and drains on."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest
from rulekit import Node, rules

from gpuwatchd.actions.receivers import slack_alert_fields
from gpuwatchd.config.yamlsrc import parse
from gpuwatchd.configfile.loader import Config, load_config
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.rules.conditions.xid import XidMatch
from gpuwatchd.rules.engine import Engine
from gpuwatchd.rules.loader import RuleParser
from gpuwatchd.rules.model import Rule
from gpuwatchd.scenario.model import load_scenario
from gpuwatchd.service.assembly import Wiring
from gpuwatchd.xid.catalog import Catalog

RULE = """
rules:
- name: Fatal
  severity: page
  condition:
    xid: {codes: [79]}
  annotations: {action: '{action}'}
"""


def _page_action(catalog: Catalog) -> str:
    n = Node(RULE, gpus=2)
    n.engine = Engine(rules(RULE), n.store, n.clock, catalog=catalog)
    n.poll()
    n.xid(1, 79)
    n.step(10)
    tr = next(tr for _, tr in n.transitions if tr.rule == "Fatal")
    return tr.annotations["action"]


def test_an_overridden_action_changes_the_action_text_on_the_page() -> None:
    assert _page_action(Catalog.default()) == "Reboot the node."
    moved = Catalog.default().with_overrides({79: {"action": "investigate"}})
    text = _page_action(moved)
    assert text != "Reboot the node." and text.startswith("Investigate")


def parse_rules_with(text: str, catalog: Catalog) -> list[Rule]:
    parser = RuleParser(catalog)
    found = parser.file(parse(textwrap.dedent(text), "r.yaml"), "r.yaml")
    parser.r.raise_if_any()
    return found


# -- the config keys: fatal and text ---------------------------------------------------------
def _config(tmp_path: Path, text: str) -> Config:
    path = tmp_path / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(str(path), must_exist=True, environ={})


def _errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _config(tmp_path, text)
    return [line.removeprefix(str(tmp_path) + "/") for line in info.value.lines()]


def test_fatal_and_text_are_read_and_printed_back(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        "xid:\n  overrides:\n    94: {fatal: true, text: Open a vendor case.}\n"
        "    119: {fatal: false, severity: warning}\n",
    )
    assert cfg.xid.overrides == (
        (94, (("fatal", True), ("text", "Open a vendor case."))),
        (119, (("fatal", False), ("severity", "warning"))),
    )
    assert cfg.as_dict()["xid"] == {
        "overrides": {
            94: {"fatal": True, "text": "Open a vendor case."},
            119: {"fatal": False, "severity": "warning"},
        }
    }
    catalog = cfg.xid.catalog()
    assert 94 in catalog.fatal_codes() and 119 not in catalog.fatal_codes()


def test_bad_override_values_are_errors_at_their_place(tmp_path: Path) -> None:
    """Failed on the old code: ``fatal`` and ``text`` were unknown keys, and an empty
    override (``79: {}``) passed silently."""
    head = "xid:\n  overrides:\n"
    assert _errors(tmp_path, head + "    94: {fatal: maybe}\n") == [
        "cfg.yaml:3:17: xid.overrides.94.fatal: expected true or false, got string"
    ]
    assert _errors(tmp_path, head + "    94: {text: ''}\n") == [
        "cfg.yaml:3:16: xid.overrides.94.text: XID 94 override: text is empty"
    ]
    (line,) = _errors(tmp_path, head + '    94: {text: "one\\ntwo"}\n')
    assert line.startswith("cfg.yaml:3:16: xid.overrides.94.text: ") and "one line" in line
    assert _errors(tmp_path, head + "    79: {}\n") == [
        "cfg.yaml:3:9: xid.overrides.79: name at least one of severity, action, text, fatal"
    ]
    assert _errors(tmp_path, head + "    79: {fatal: true}\n    '79': {fatal: false}\n") == [
        "cfg.yaml:4:5: duplicate key '79'"
    ]
    (line,) = _errors(tmp_path, head + "    79: {fatl: true}\n")
    assert line.startswith("cfg.yaml:3:10: xid.overrides.79: unknown key 'fatl'"), line


def test_a_bad_fatal_in_a_rule_is_an_error_at_its_place() -> None:
    with pytest.raises(ConfigError) as info:
        rules("rules:\n- name: R\n  severity: page\n  condition:\n    xid: {fatal: yes please}\n")
    assert info.value.lines() == [
        "r.yaml:5:18: rule 'R'.condition.xid.fatal: expected true or false, got string"
    ]


def test_fatal_selects_the_fatal_set_and_narrows_other_selections() -> None:
    moved = Catalog.default().with_overrides({94: {"fatal": True}, 119: {"fatal": False}})
    text = """
    rules:
    - {name: F, severity: page, condition: {xid: {fatal: true}}}
    - {name: A, severity: info, condition: {xid: {buckets: [RESTART_APP], fatal: false}}}
    """
    parsed = {r.name: r.condition for r in parse_rules_with(text, moved)}
    fatal, app = parsed["F"], parsed["A"]
    assert isinstance(fatal, XidMatch) and isinstance(app, XidMatch)
    assert fatal.codes == moved.fatal_codes() and 94 in fatal.codes and 119 not in fatal.codes
    assert 13 in app.codes and 94 not in app.codes


# -- what the page says ----------------------------------------------------------------------
def test_a_reload_with_new_overrides_changes_the_action_on_the_next_page() -> None:
    """Failed on the old code: the engine took the new catalog, but the rules' templates
    read the snapshot's, which kept the overrides of the start."""
    n = Node(RULE, gpus=2)
    n.poll()
    n.engine.catalog = Catalog.default().with_overrides({79: {"action": "contact_support"}})
    n.xid(1, 79)
    n.step(10)
    tr = next(tr for _, tr in n.transitions if tr.rule == "Fatal")
    assert tr.annotations["action"] == "Contact your support organization."


def test_an_xid_rule_without_an_action_annotation_still_carries_the_overridden_action() -> None:
    """Failed on the old code: no action annotation, so Slack fell back to NVIDIA's words
    for XID 79 ("Reboot the node.") whatever the override said."""
    text = "rules:\n- {name: Bare, severity: page, condition: {xid: {codes: [79]}}}\n"
    n = Node(text, gpus=2)
    n.engine.catalog = Catalog.default().with_overrides({79: {"action": "contact_support"}})
    n.poll()
    n.xid(1, 79)
    n.step(10)
    tr = next(tr for _, tr in n.transitions if tr.rule == "Bare")
    assert tr.annotations == {"action": "Contact your support organization."}
    fields = slack_alert_fields({**tr.as_dict(), "annotations": dict(tr.annotations)}, "n")
    assert "*Action*\nContact your support organization." in fields


def test_xid_recurrence_rules_can_say_the_action_too() -> None:
    text = """
    rules:
    - name: Many
      severity: ticket
      condition: {xid_recurrence: {codes: [92], signal: node}}
      annotations: {action: '{action}', summary: 'XID {xid}: {xid_text}'}
    """
    n = Node(text, gpus=4)
    n.engine.catalog = Catalog.default().with_overrides({92: {"text": "Check the driver."}})
    n.poll()
    for gpu in (0, 1, 2):
        n.xid(gpu, 92)
    n.step(60)
    tr = next(tr for _, tr in n.transitions if tr.rule == "Many")
    assert tr.annotations["action"] == "Check the driver."
    assert tr.annotations["summary"].startswith("XID 92: ")


# -- end to end: the scenario backend, the shipped rules, real message bodies -------------------
SCENARIO = """
name: xid-overrides
description: XID 94 (contained error) on GPU 1, then XID 119 (GSP timeout) on GPU 2.
duration: 20m
step: 10s
gpus: {count: 4, model: NVIDIA H100 80GB HBM3}
timeline:
  - at: 5m
    kernel_log: "NVRM: Xid (PCI:0000:2a:00): 94, pid=4242, name=python3,\\
      \\ Contained: SM (0x1). RST: No, D-RST: No"
  - at: 10m
    kernel_log: "NVRM: Xid (PCI:0000:3a:00): 119, pid=4242, name=python3,\\
      \\ Timeout after 6s of waiting for RPC response from GPU2 GSP!"
"""
CONFIG = """
drain: {mode: exec, exec: {command: [/bin/true]}}
receivers:
  - {name: chat, type: slack, url: "https://hooks.slack.invalid/T0/B0/x"}
  - {name: oncall, type: pagerduty, routing_key: rk-123}
  - {name: hook, type: webhook, url: "https://hook.invalid/gpuwatchd"}
"""
RUNBOOK = "Drain the GPU and open a vendor case (runbook XR-94)."


def _simulate(tmp_path: Path, overrides: str) -> tuple[list[dict[str, Any]], list[str]]:
    scenario = tmp_path / "sc.yaml"
    scenario.write_text(SCENARIO, encoding="utf-8")
    cfg = _config(tmp_path, CONFIG + overrides)
    bodies: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.content.decode())
        return httpx.Response(202 if "pagerduty" in str(request.url) else 200, text="ok")

    records: list[dict[str, Any]] = []
    wiring = Wiring(send_recorded=True, transport=httpx.MockTransport(answer))
    sim = Simulation(load_scenario(str(scenario)), cfg, on_record=records.append, wiring=wiring)
    sim.run()
    return records, bodies


def test_overrides_move_codes_in_and_out_of_paging_end_to_end(tmp_path: Path) -> None:
    def pages(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        return {
            str(r["gpu"]): r
            for r in records
            if r.get("record") == "alert" and r["severity"] == "page" and r["state"] == "firing"
        }

    def drains(records: list[dict[str, Any]]) -> list[str]:
        return [str(r["reason"]) for r in records if r.get("record") == "drain"]

    before, _ = _simulate(tmp_path, "")
    assert set(pages(before)) == {"2"}  # XID 119 pages, XID 94 (an application error) not
    assert drains(before) == ["gpuwatchd: XID 119 GPU 2 00000000:3A:00.0"]

    overrides = f"xid:\n  overrides:\n    94: {{fatal: true, text: '{RUNBOOK}'}}\n"
    overrides += "    119: {fatal: false}\n"
    after, bodies = _simulate(tmp_path, overrides)
    paged = pages(after)
    assert set(paged) == {"1"} and paged["1"]["rule"] == "GpuXidFatal"
    assert paged["1"]["annotations"]["action"] == RUNBOOK
    assert drains(after) == ["gpuwatchd: XID 94 GPU 1 00000000:2A:00.0"]
    # no second notice of the same XID from the application rule, nothing for XID 119
    assert not [r for r in after if r.get("record") == "alert" and r["gpu"] == "2"]
    assert not [r for r in after if r.get("rule") == "GpuXidApplication"]
    # Slack, PagerDuty and the webhook each carried the site's words
    assert len(bodies) == 3
    for body in bodies:
        assert RUNBOOK in json.dumps(json.loads(body), ensure_ascii=False), body


def test_xid_explain_shows_the_overridden_words_and_the_fatal_set() -> None:
    from gpuwatchd.cli.xid import explain_text

    moved = Catalog.default().with_overrides({94: {"fatal": True, "text": RUNBOOK}})
    entry = moved.lookup(94)
    assert entry is not None
    text = explain_text(entry, moved)
    assert f"restart_app: {RUNBOOK}" in " ".join(text.split())
    assert "Fatal set:        yes" in text
    plain = Catalog.default().lookup(94)
    assert plain is not None and "Fatal set:        no" in explain_text(plain, Catalog.default())
