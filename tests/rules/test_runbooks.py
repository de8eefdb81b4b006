"""Issue 23 item 4: every shipped rule, on the node and its Prometheus twin, carries a
runbook_url to its own section of docs/runbooks/, and the package installs those pages
where the URL points.

Before: no shipped rule had a runbook link."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from conftest import ROOT

from gpuwatchd.rules.loader import parse_rules

INSTALLED = "file:///usr/share/doc/gpuwatchd/docs/runbooks/"
RUNBOOKS = ROOT / "docs" / "runbooks"


def sections(page: Path) -> set[str]:
    return {m.lower() for m in re.findall(r"^## (\w+)$", page.read_text(), re.M)}


def check(name: str, url: str) -> None:
    assert url.startswith(INSTALLED), (name, url)
    page, _, anchor = url.removeprefix(INSTALLED).partition("#")
    assert (RUNBOOKS / page).is_file(), (name, url)
    assert anchor == name.lower() and anchor in sections(RUNBOOKS / page), (name, url)


def test_every_node_rule_links_its_runbook_section() -> None:
    names = []
    for path in sorted((ROOT / "rules").glob("*.yaml")):
        for rule in parse_rules(path.read_text(), str(path)):
            check(rule.name, rule.annotations["runbook_url"].render({}))
            names.append(rule.name)
    assert len(names) >= 30


def test_every_prometheus_twin_links_the_same_runbook() -> None:
    doc = yaml.safe_load((ROOT / "packaging" / "prometheus" / "gpuwatchd-rules.yaml").read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert len(alerts) >= 33
    for rule in alerts:
        check(rule["alert"], rule["annotations"]["runbook_url"])


def test_the_package_installs_the_runbooks() -> None:
    rules = (ROOT / "packaging" / "debian" / "rules").read_text()
    assert "usr/share/doc/gpuwatchd/docs/runbooks docs/runbooks/*.md" in rules
    assert "docs/runbooks/*.md" in (ROOT / "packaging" / "build-deb.sh").read_text()
