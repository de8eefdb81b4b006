"""``gpuwatchd status`` as text: the lines for one ``core.statusdoc.StatusDocument``, the
same document the JSON and the status page show (each GPU's health verdict is the
document's, never judged again here)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuwatchd.cli.statusclient import printable
from gpuwatchd.core.statusdoc import ActionsState, StatusDocument


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def status_text(doc: StatusDocument, notes: list[str], problems: list[str]) -> list[str]:
    """The lines ``gpuwatchd status`` prints: the node, each GPU with its verdict and
    readings, the sources, restart-only config changes, the firing alerts, the actions
    stage's parts and ``problems`` (``check``'s, which also give the exit code)."""
    out = [f"node {doc.node}  gpuwatchd {doc.version}  backend {doc.backend}"]
    out += [printable(note) for note in notes]
    now = doc.now
    for g in doc.gpus:
        health = g.health.text()
        r = g.readings if g.health.answers else None
        if r is None:  # it does not answer: no reading is current
            last = g.last_readings or g.readings or {}
            at = g.last_readings_at
            temp = last.get("temperature_gpu")
            ago = f" {now - at:.0f}s ago" if now is not None and at else ""
            seen = f"temp={temp:.0f}C" if temp is not None else "no readings"
            out.append(f"  GPU {g.index} {g.pci_bus_id} {health}  (last poll{ago}: {seen})")
            continue
        temp = r.get("temperature_gpu")
        reasons = ",".join(g.clock_event_reasons or ()) or "-"
        out.append(
            f"  GPU {g.index} {g.pci_bus_id} {health:<6} "
            f"temp={'-' if temp is None else f'{temp:.0f}C'} "
            f"ecc_corr={r.get('ecc_corrected_volatile', '-')} "
            f"ecc_uncorr={r.get('ecc_uncorrected_volatile', '-')} reasons={reasons}"
        )
    for name, s in doc.sources.items():
        out.append(f"  source {name}: {'up' if s.up else 'DOWN'} {s.detail}")
    if doc.config is not None:
        for key, why in doc.config.restart_required.items():
            out.append(f"  config: {key} changed, NOT applied until a restart: {why}")
    alerts = doc.alerts or ()
    out.append(f"  alerts firing: {len(alerts)}")
    for a in alerts:
        out.append(f"    {a.rule} [{a.severity}] gpu={a.gpu or '-'}: {a.summary or ''}")
        waits = a.annotations.get("recovery")
        if waits:  # recovery on evidence: what the alert (and its drain) waits for
            out.append(f"      recovery: {printable(waits)}")
    out += actions_lines(doc.actions)  # deliveries, silences, drain (when configured)
    out += [f"  problem: {problem}" for problem in problems]
    return out


def actions_lines(actions: ActionsState) -> list[str]:
    """Lines for the actions stage's part: deliveries, silences, drain (when present)."""
    out: list[str] = []
    deliveries = actions.deliveries
    if deliveries is not None:
        out.append(f"  deliveries pending: {deliveries.pending}")
        if deliveries.state_problem:
            out.append(f"    OUTBOX IN MEMORY ONLY: {deliveries.state_problem}")
        for r in deliveries.receivers:
            line = f"    receiver {r.name} ({r.type}): {r.pending} pending"
            if r.oldest_pending_seconds is not None:
                line += f", oldest {r.oldest_pending_seconds:.0f}s"
            if r.last_error:
                line += f", last error: {r.last_error}"
            out.append(line)
        for a in deliveries.firing:
            muted = f" (silenced by {a.silenced_by})" if a.silenced_by else ""
            out.append(
                f"    firing {a.rule} [{a.severity}] gpu={a.labels.get('gpu', '-')} "
                f"since {_when(a.since)}{muted}"
            )
    if actions.silences is not None:
        active = [s for s in actions.silences if s.active]
        out.append(f"  silences active: {len(active)}")
        for s in active:
            what = f"GPU {s.gpu}" if s.gpu else "node"
            out.append(f"    {s.id} {what} until {_when(s.ends_at)}: {s.reason} ({s.author})")
    drain = actions.drain
    if drain is not None and drain.configured:
        line = f"  drain ({drain.mode}{', dry run' if drain.dry_run else ''}): {drain.state}"
        if drain.state == "drain_pending":
            line += f" at {_when(drain.drain_at)}"
        if drain.reason:
            line += f" - {drain.reason}"
        line += f" [{drain.drains_in_window}/{drain.max_drains} drains in window]"
        out.append(line)
    return out
