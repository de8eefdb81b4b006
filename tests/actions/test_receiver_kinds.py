"""Receivers as kinds (issue 24 item 3): one module each under ``actions/receivers/`` (its
``Receiver`` subclass, its rendering and judging, its ``KIND``) and one registry line;
``build_receiver`` has no ``isinstance`` chain over them."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

from gpuwatchd.actions.receivers import BY_TYPE, KINDS, build_receiver
from gpuwatchd.actions.receivers.alertmanager import AlertmanagerReceiver
from gpuwatchd.actions.receivers.pagerduty import PagerDutyReceiver
from gpuwatchd.actions.receivers.registry import READERS
from gpuwatchd.actions.receivers.slack import SlackReceiver
from gpuwatchd.actions.receivers.webhook import WebhookReceiver
from gpuwatchd.configfile.loader import load_config

RECEIVERS = ROOT / "gpuwatchd" / "actions" / "receivers"


def test_every_kind_reads_its_own_type() -> None:
    assert list(BY_TYPE) == [k.type for k in KINDS] == list(READERS)
    for kind in KINDS:
        assert kind.reader.type == kind.type
        # the config type is defined beside the kind's behaviour, in its own module
        assert kind.reader.config.__module__ == f"gpuwatchd.actions.receivers.{kind.type}"


def test_the_config_file_reaches_each_kind_through_the_registry(tmp_path: Path) -> None:
    """The loader knows no kind by name: each ``type`` is read by its module's reader."""
    cfg = tmp_path / "g.yaml"
    cfg.write_text(
        "receivers:\n"
        "  - {name: w, type: webhook, url: 'http://127.0.0.1:1/'}\n"
        "  - {name: s, type: slack, url_file: /run/s}\n"
        "  - {name: p, type: pagerduty, routing_key_file: pd-key}\n"
        "  - {name: a, type: alertmanager, urls: ['http://127.0.0.1:9093']}\n"
    )
    got = load_config(str(cfg), must_exist=True).receivers
    assert [type(rc) for rc in got] == [
        WebhookReceiver,
        SlackReceiver,
        PagerDutyReceiver,
        AlertmanagerReceiver,
    ]


def test_no_kind_is_named_outside_its_module_and_the_registry() -> None:
    """Adding a kind is one new file plus one registry line: the shared config reader and
    the loader name no kind (their classes, types or keys)."""
    for path in (
        ROOT / "gpuwatchd" / "config" / "receivers.py",
        ROOT / "gpuwatchd" / "config" / "actions.py",
        ROOT / "gpuwatchd" / "configfile" / "loader.py",
    ):
        text = path.read_text()
        for kind in ("webhook", "slack", "pagerduty", "alertmanager"):
            assert f'"{kind}"' not in text, (path.name, kind)
        for key in ("url_file", "routing_key", "hmac_secret", "resend_interval"):
            assert f'"{key}"' not in text, (path.name, key)


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
    text = (RECEIVERS / "registry.py").read_text()
    tree = ast.parse(text)
    build = next(
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_receiver"
    )
    names = {n.id for n in ast.walk(build) if isinstance(n, ast.Name)}
    assert not any(name.endswith(("Receiver", "Sender")) and name != "Receiver" for name in names)
