"""Issue 24 item 5: one typed status document (``core.statusdoc``) rendered three ways.
The JSON (/api/v1/status, the status socket, ``gpuwatchd status --json``), the text of
``gpuwatchd status`` and the status page at ``/`` are read here from a real node (the
ECC-leak scenario, stepped until the memory-trend rule pages on GPU 4) and must agree:
each GPU's health verdict and the firing alerts."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from actions_support import make_config
from conftest import ROOT
from status_page_support import RULE, Dom, firing_sim

from gpuwatchd.actions.silences import add_silence, path_in
from gpuwatchd.cli.main import _print_status
from gpuwatchd.cli.statustext import status_text
from gpuwatchd.core.statusdoc import StatusDocument
from gpuwatchd.exposition.httpd import HttpServer
from gpuwatchd.exposition.statuspage import render_page
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario


def _page_view(page: str) -> tuple[dict[str, str], list[str]]:
    """Each GPU row's health and the firing alerts' section ids, from the page."""
    dom = Dom()
    dom.feed(page)
    health: dict[str, str] = {}
    row = ""
    for tag, attrs, _ in dom.elements:
        if tag == "tr" and attrs.get("id", "").startswith("gpu-"):
            row = attrs["id"][4:]
        if tag == "span" and "health" in attrs.get("class", "").split() and row:
            health[row] = attrs["class"].split("h-", 1)[1]
    sections = [a["id"] for tag, a, _ in dom.elements if tag == "section"]
    return health, sections


def _text_view(lines: list[str]) -> tuple[dict[str, str], list[str], int]:
    """Each GPU's health, the firing alerts' rules and their count, from the text."""
    health: dict[str, str] = {}
    rules: list[str] = []
    count = -1
    for line in lines:
        if m := re.match(r"  GPU (\S+) \S+ (\w+)", line):
            health[m[1]] = m[2]
        elif m := re.match(r"  alerts firing: (\d+)$", line):
            count = int(m[1])
        elif m := re.match(r"    (\w+) \[(\w+)\] gpu=", line):
            rules.append(m[1])
    return health, rules, count


def test_json_text_and_page_show_one_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = firing_sim(tmp_path)
    server = HttpServer(
        "127.0.0.1", 0, sim.renderer, lambda: (True, "ok"), sim.node.status_document
    )
    server.start()
    try:
        with urllib.request.urlopen(server.url + "/api/v1/status", timeout=30) as r:
            wire: dict[str, Any] = json.loads(r.read())
        with urllib.request.urlopen(server.url + "/", timeout=30) as r:
            page = r.read().decode()
    finally:
        server.stop()
    doc = StatusDocument.from_json(wire)
    # the JSON is the document: read back, it gives the same JSON, key for key
    assert doc.as_json() == wire
    built = sim.node.status_document()  # the simulation's clock stands still between reads
    assert StatusDocument.from_json(built.as_json()) == built == doc
    by_json = {str(g["index"]): g["health"] for g in wire["gpus"]}
    assert by_json["4"] == "failing" and "ok" in by_json.values()  # both kinds are shown
    firing = [a["rule"] for a in wire["alerts"]]
    assert RULE in firing

    page_health, sections = _page_view(page)
    assert page_health == by_json
    assert sections == [f"alert-{a['fingerprint']}" for a in wire["alerts"]]

    text_health, text_rules, count = _text_view(status_text(doc, [], []))
    assert text_health == by_json
    assert text_rules == firing and count == len(firing)

    # what ``gpuwatchd status`` prints from the wire: the same lines, and a failing GPU
    # makes it exit 1; ``--json`` prints the very JSON the API gave
    assert _print_status(wire, [], False) == 1
    printed = capsys.readouterr().out.splitlines()
    assert _text_view(printed)[:2] == (by_json, firing)
    assert _print_status(wire, [], True) == 1
    assert json.loads(capsys.readouterr().out) == wire
    assert render_page(doc).decode() == page


def test_a_document_without_verdicts_gets_the_same_verdict_everywhere() -> None:
    """An older daemon sent no ``health``: the document judges it once, with
    ``core.health``, and the text and the page show that one verdict."""
    wire = {
        "node": "n1",
        "gpus": [
            {"index": 0, "pci_bus_id": "00000000:01:00.0", "status": "ok"},
            {"index": 1, "pci_bus_id": "00000000:02:00.0", "status": "ok"},
            {"index": 2, "pci_bus_id": "00000000:03:00.0", "status": "lost"},
        ],
        "sources": {},
        "alerts": [
            {"rule": "GpuHot", "severity": "ticket", "labels": {"gpu": "1"}, "fingerprint": "f1"}
        ],
    }
    doc = StatusDocument.from_json(wire)
    want = {"0": "ok", "1": "degraded", "2": "lost"}
    assert {str(g.index): g.health.health for g in doc.gpus} == want
    assert _page_view(render_page(doc).decode())[0] == want
    assert _text_view(status_text(doc, [], []))[0] == want


def test_the_actions_part_reads_the_same_in_json_and_text(tmp_path: Path) -> None:
    """Deliveries, silences and the drain: typed in the document, the same in the JSON
    (key for key) and in the text of ``gpuwatchd status``."""
    config = make_config(
        tmp_path,
        'receivers:\n  - {name: ops, type: webhook, url: "http://127.0.0.1:9/hook"}\n'
        'drain:\n  mode: exec\n  exec: {command: ["/bin/true"]}\n',
    )
    sim = Simulation(load_scenario(str(ROOT / "scenarios" / "ecc-leak.yaml")), config)
    silence = add_silence(  # simulate reads no silences file: its entry is added below
        path_in(config.state_dir),
        node=config.node_name,
        gpu="3",
        rule=None,
        duration=7200.0,
        reason="reseat GPU 3",
        author="ops",
        now=sim.t0,
    )
    for n in range(1, 4):
        sim.step()
        sim.advance_to(sim.t0 + n * sim.scenario.step)
    built = sim.node.status()
    assert StatusDocument.from_json(built) == sim.node.status_document()
    wire = {**built, "silences": [silence.as_dict(sim.clock.now())]}  # as the daemon's sink
    doc = StatusDocument.from_json(wire)
    assert doc.as_json() == wire
    assert doc.actions.drain is not None and doc.actions.drain.mode == "exec"
    assert [s.gpu for s in doc.actions.silences or ()] == ["3"]
    text = "\n".join(status_text(doc, [], []))
    assert f"deliveries pending: {wire['deliveries']['pending']}" in text
    assert "receiver ops (webhook): " in text
    assert (
        f"silences active: 1\n    {silence.id} GPU 3 until " in text
        and "reseat GPU 3 (ops)" in text
    )
    drain = wire["drain"]
    assert f"drain (exec): {drain['state']}" in text
    assert f"[{drain['drains_in_window']}/{drain['max_drains']} drains in window]" in text
