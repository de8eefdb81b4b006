"""Receivers as kinds (issue 24 item 3): one module each under ``actions/receivers/`` (its
``Receiver`` subclass, its rendering and judging, its ``KIND``) and one registry line;
``build_receiver`` has no ``isinstance`` chain over them."""

from __future__ import annotations

import ast

from conftest import ROOT

from gpuwatchd.actions.receivers import BY_TYPE, KINDS, build_receiver
from gpuwatchd.config.actions import (
    RECEIVER_TYPES,
    AlertmanagerReceiver,
    PagerDutyReceiver,
    SlackReceiver,
    WebhookReceiver,
)


def test_every_type_the_config_accepts_has_a_kind() -> None:
    assert [k.type for k in KINDS] == list(RECEIVER_TYPES)
    assert set(BY_TYPE) == set(RECEIVER_TYPES)


def test_each_kind_builds_its_receiver_without_reading_secrets() -> None:
    configs = [
        WebhookReceiver("w", url_file="/nonexistent/url", hmac_secret_file="/nonexistent/k"),
        SlackReceiver("s", url_file="/nonexistent/url"),
        PagerDutyReceiver("p", routing_key_file="/nonexistent/key"),
        AlertmanagerReceiver("a", urls=("http://u:pw@127.0.0.1:9093",)),
    ]
    built = [build_receiver(c, {}, load_secrets=False) for c in configs]
    assert [r.kind for r in built] == ["webhook", "slack", "pagerduty", "alertmanager"]
    assert [type(r).__module__.rsplit(".", 1)[1] for r in built] == [
        "webhook",
        "slack",
        "pagerduty",
        "alertmanager",
    ]
    assert built[3].secrets == ("pw",)


def test_the_registry_names_no_kind_in_its_code() -> None:
    """Adding a kind touches its module and one line of the list, not ``build_receiver``."""
    text = (ROOT / "gpuwatchd" / "actions" / "receivers" / "registry.py").read_text()
    tree = ast.parse(text)
    build = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_receiver"
    )
    names = {n.id for n in ast.walk(build) if isinstance(n, ast.Name)}
    assert not any(name.endswith(("Receiver", "Sender")) and name != "Receiver" for name in names)
