"""Issue 23 item 4: a status page worth opening, at ``/``: each GPU's health, the firing
alerts with their texts and, for the memory-trend rule, a chart (inline SVG) of the
history it judged with the moment it fired; no JavaScript, no external asset; the
alert's generatorURL leads to its section. Looked at in headless Chromium, as a person
would (the screenshot's path is printed).

Before: ``/`` was a list of three links, and generatorURL pointed at raw JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import need_binary
from status_page_support import RULE, Dom, firing_sim

from gpuwatchd.actions.receivers import alertmanager_alerts
from gpuwatchd.core.statusdoc import StatusDocument
from gpuwatchd.exposition.httpd import HttpServer
from gpuwatchd.exposition.statuspage import render_page


def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    chromium = need_binary("chromium-headless-shell")
    sim = firing_sim(tmp_path)
    server = HttpServer(
        "127.0.0.1", 0, sim.renderer, lambda: (True, "ok"), sim.node.status_document
    )
    server.start()
    try:
        browse = [chromium, "--no-sandbox", "--disable-gpu", "--headless"]
        url = server.url + "/"
        dom_text = subprocess.run(
            [*browse, "--dump-dom", url], capture_output=True, text=True, timeout=120
        ).stdout
        shot = tmp_path / "status-page.png"
        subprocess.run(
            [*browse, "--window-size=1100,1400", f"--screenshot={shot}", url],
            capture_output=True,
            timeout=120,
        )
    finally:
        server.stop()
        sim.node.close()
    print(f"screenshot: {shot}")
    assert shot.exists() and shot.stat().st_size > 10_000
    dom = Dom()
    dom.feed(dom_text)
    assert dom.scripts == 0  # no JavaScript, no external asset
    (alert,) = [a for a in sim.node.status()["alerts"] if a["rule"] == RULE]
    section = f"alert-{alert['fingerprint']}"
    inside = [(tag, a) for tag, a, s in dom.elements if s == section]
    assert inside, f"no section {section} in {dom_text[:3000]}"
    bars = [a for tag, a in inside if tag == "rect" and a.get("class") == "day"]
    assert len(bars) == 14 and any(float(a["height"]) > 0 for a in bars)
    assert [a for tag, a in inside if tag == "line" and a.get("class") == "fired"]
    gpu = alert["labels"]["gpu"]
    assert f"GPU {gpu}" in "".join(dom.text[section])
    rows = [a["id"] for tag, a, _ in dom.elements if tag == "tr" and a.get("id")]
    assert rows == [f"gpu-{i}" for i in range(8)]
    failing = [a for tag, a, _ in dom.elements if tag == "span" and "h-failing" in a["class"]]
    assert failing, f"GPU {gpu} with a page on it is not shown failing"
    # the alert's messages lead to that section
    note = {"node": "n1", "alerts": [{**alert, "state": "firing", "timestamp": 0.0}]}
    (pushed,) = alertmanager_alerts(note, 0.0, 60.0, external_url="https://n1.example.org:9835")
    assert pushed["generatorURL"] == f"https://n1.example.org:9835/#{section}"


def test_everything_from_the_document_is_escaped() -> None:
    status: dict[str, Any] = {
        "node": "<b>n</b>",
        "gpus": [{"index": 0, "pci_bus_id": "x", "name": "<script>alert(1)</script>",
                  "health": "ok", "health_rules": []}],
        "alerts": [{"rule": "R", "severity": "page", "labels": {"gpu": "0"}, "since": 0,
                    "fingerprint": '"><script>x</script>', "annotations": {
                        "summary": "<img src=x onerror=alert(1)>",
                        "runbook_url": "javascript:alert(1)"}}],
    }  # fmt: skip
    page = render_page(StatusDocument.from_json(status)).decode()
    assert "<script" not in page and "<img" not in page and "<b>n" not in page
    assert "javascript:" not in page  # a runbook link is http(s) or a path, never a script
    json.dumps(status)  # the document stays plain data
