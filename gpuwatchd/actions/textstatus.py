"""The actions part of ``gpuwatchd status`` as text: deliveries, silences, drain."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def status_lines(status: dict[str, Any]) -> list[str]:
    """Lines for the deliveries, silences and drain keys of /api/v1/status (if present)."""
    out: list[str] = []
    deliveries = status.get("deliveries")
    if deliveries:
        out.append(f"  deliveries pending: {deliveries['pending']}")
        if deliveries.get("state_problem"):
            out.append(f"    OUTBOX IN MEMORY ONLY: {deliveries['state_problem']}")
        for r in deliveries["receivers"]:
            line = f"    receiver {r['name']} ({r['type']}): {r['pending']} pending"
            if r.get("oldest_pending_seconds") is not None:
                line += f", oldest {r['oldest_pending_seconds']:.0f}s"
            if r.get("last_error"):
                line += f", last error: {r['last_error']}"
            out.append(line)
        for a in deliveries.get("firing", []):
            labels = a.get("labels") or {}
            muted = f" (silenced by {a['silenced_by']})" if a.get("silenced_by") else ""
            out.append(
                f"    firing {a['rule']} [{a['severity']}] gpu={labels.get('gpu', '-')} "
                f"since {_when(a.get('since'))}{muted}"
            )
    silences = status.get("silences")
    if silences is not None:
        active = [s for s in silences if s.get("active")]
        out.append(f"  silences active: {len(active)}")
        for s in active:
            what = f"GPU {s['gpu']}" if s.get("gpu") else "node"
            out.append(
                f"    {s['id']} {what} until {_when(s['ends_at'])}: {s['reason']} ({s['author']})"
            )
    drain = status.get("drain")
    if drain and drain.get("mode", "none") != "none":
        line = f"  drain ({drain['mode']}{', dry run' if drain.get('dry_run') else ''}): "
        line += drain["state"]
        if drain["state"] == "drain_pending":
            line += f" at {_when(drain.get('drain_at'))}"
        if drain.get("reason"):
            line += f" - {drain['reason']}"
        line += f" [{drain['drains_in_window']}/{drain['max_drains']} drains in window]"
        out.append(line)
    return out
