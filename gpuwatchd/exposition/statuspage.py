"""The status page at ``/``: the node's status API document as one small HTML page.

No JavaScript, no external asset (inline CSS and SVG only), so it opens from any browser
that reaches the node, through a proxy too. It shows each GPU's health verdict (the one
``status`` and ``check`` show), its current readings (or the last ones, marked as such),
and every firing alert in a section whose anchor is ``#alert-<fingerprint>`` (the
``generatorURL`` of the alert's messages points there) with its texts, a runbook link
when the rule has one, and, for the memory-trend and XID-recurrence rules, a chart of the
history they judged: counts per day, and the moment the alert fired.

It renders a ``core.statusdoc.StatusDocument``, the same one the JSON and the text of
``gpuwatchd status`` come from: the page never re-derives a verdict.

Everything from the document is escaped: a process name from the kernel log is text here.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from typing import Any

from gpuwatchd.core.statusdoc import FiringAlert, GpuEntry, StatusDocument

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.4em;margin:0 0 .2em} h2{font-size:1.15em;margin:1.2em 0 .4em}
table{border-collapse:collapse}
td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left}
.health{font-weight:600;padding:.1em .5em;border-radius:.3em}
.h-ok{background:#dff3df}.h-degraded{background:#fff0c2}
.h-failing,.h-lost,.h-stale,.h-error{background:#ffd6d6}
.alert{border:1px solid #ccc;border-radius:.4em;padding:.6em .9em;margin:.6em 0}
.alert:target{border-color:#c00;box-shadow:0 0 0 2px #fbb}
.sev-page{color:#b00}.sev-ticket{color:#a60}.muted{color:#777}
svg text{font:11px system-ui,sans-serif}
"""

CHART_W, CHART_H, PAD = 560, 160, 28


def _e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _when(ts: object) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(ts)))


def _readings(g: GpuEntry) -> str:
    r = g.readings if g.health.answers else None
    if r is not None:
        temp = r.get("temperature_gpu")
        parts = [f"{temp:.0f} &deg;C" if isinstance(temp, (int, float)) else "-"]
        for key, name in (
            ("ecc_corrected_volatile", "ECC corr"),
            ("ecc_uncorrected_volatile", "uncorr"),
        ):
            if isinstance(r.get(key), (int, float)):
                parts.append(f"{name} {r[key]:.0f}")
        return ", ".join(parts)
    last = g.last_readings or g.readings
    if last is not None and isinstance(last.get("temperature_gpu"), (int, float)):
        return (
            f'<span class="muted">last poll {_e(_when(g.last_readings_at))}: '
            f"{last['temperature_gpu']:.0f} &deg;C</span>"
        )
    return '<span class="muted">no readings</span>'


def chart(history: Mapping[str, Any]) -> str:
    """An inline SVG bar chart: one bar per day, a red line where the alert fired."""
    starts = [float(t) for t in history.get("day_starts") or []]
    values = [float(v) for v in history.get("per_day") or []]
    if not starts or len(starts) != len(values):
        return ""
    top = max(values) or 1.0
    n = len(values)
    inner_w, inner_h = CHART_W - 2 * PAD, CHART_H - 2 * PAD
    bar_w = inner_w / n
    out = [
        f'<svg class="chart" width="{CHART_W}" height="{CHART_H}" role="img" '
        f'aria-label="{_e(history.get("what"))} per day" xmlns="http://www.w3.org/2000/svg">',
        f'<text x="{PAD}" y="14">{_e(history.get("what"))} per day (max {top:g})</text>',
        f'<line x1="{PAD}" y1="{CHART_H - PAD}" x2="{CHART_W - PAD}" y2="{CHART_H - PAD}" '
        'stroke="#999"/>',
    ]
    for i, v in enumerate(values):
        h = inner_h * v / top
        x = PAD + i * bar_w
        out.append(
            f'<rect class="day" x="{x + 1:.1f}" y="{CHART_H - PAD - h:.1f}" '
            f'width="{max(bar_w - 2, 1):.1f}" height="{h:.1f}" fill="#4a7bd0">'
            f"<title>{_e(time.strftime('%Y-%m-%d', time.gmtime(starts[i])))}: {v:g}</title>"
            "</rect>"
        )
    fired = history.get("fired_at")
    if isinstance(fired, (int, float)):
        pos = (float(fired) - starts[0]) / 86400.0
        if 0 <= pos <= n:
            x = PAD + pos * bar_w
            out.append(
                f'<line class="fired" x1="{x:.1f}" y1="{PAD - 6}" x2="{x:.1f}" '
                f'y2="{CHART_H - PAD}" stroke="#c00" stroke-width="2"/>'
                f'<text x="{min(x + 3, CHART_W - 60):.1f}" y="{PAD + 4}" fill="#c00">fired</text>'
            )
    out.append(
        f'<text x="{PAD}" y="{CHART_H - 8}">{_e(time.strftime("%m-%d", time.gmtime(starts[0])))}'
        f'</text><text x="{CHART_W - PAD - 30}" y="{CHART_H - 8}">today</text></svg>'
    )
    return "".join(out)


def _alert(a: FiringAlert) -> str:
    notes = a.annotations
    where = f"GPU {_e(a.gpu)}" if a.gpu is not None else "node"
    sev = a.severity
    parts = [
        f'<section class="alert" id="alert-{_e(a.fingerprint)}">',
        f'<h3><span class="sev-{_e(sev)}">[{_e(sev)}]</span> {_e(a.rule)} '
        f'<span class="muted">on {where}, since {_e(_when(a.since))}</span></h3>',
    ]
    for key in ("summary", "evidence", "action", "recovery", "description"):
        if notes.get(key):
            parts.append(f'<p class="{key}"><b>{key}:</b> {_e(notes[key])}</p>')
    url = str(notes.get("runbook_url") or "")
    if url.startswith(("https://", "http://", "file:///", "/")):
        parts.append(f'<p><a class="runbook" href="{_e(url)}">runbook</a></p>')
    if a.history is not None:
        parts.append(chart(a.history))
    parts.append("</section>")
    return "".join(parts)


def render_page(doc: StatusDocument) -> bytes:
    """The page for one status document (the one /api/v1/status gives as JSON)."""
    alerts = doc.alerts or ()
    rows = []
    for g in doc.gpus:
        health = g.health.health
        rules = ", ".join(g.health.rules)
        rows.append(
            f'<tr id="gpu-{_e(g.index)}"><td>{_e(g.index)}</td>'
            f"<td>{_e(g.pci_bus_id)}</td><td>{_e(g.name)}</td>"
            f'<td><span class="health h-{_e(health)}">{_e(health)}</span> {_e(rules)}</td>'
            f"<td>{_readings(g)}</td></tr>"
        )
    body = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>gpuwatchd {_e(doc.node)}</title><style>{_CSS}</style></head><body>",
        f"<h1>gpuwatchd on {_e(doc.node)}</h1>",
        f'<p class="muted">version {_e(doc.version)}, backend '
        f"{_e(doc.backend)}, at {_e(_when(doc.now))}. "
        '<a href="/metrics">/metrics</a> <a href="/api/v1/status">/api/v1/status</a> '
        '<a href="/healthz">/healthz</a></p>',
        "<h2>GPUs</h2><table><tr><th>GPU</th><th>PCI</th><th>model</th><th>health</th>"
        "<th>readings</th></tr>",
        *rows,
        "</table>",
        f"<h2>Firing alerts ({len(alerts)})</h2>",
        *(_alert(a) for a in alerts),
        "</body></html>\n",
    ]
    if not alerts:
        body.insert(-1, '<p class="muted">none</p>')
    return "".join(body).encode("utf-8")
