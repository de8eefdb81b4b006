"""Plain data shared by the outbox, the routers and the receivers.

An alert travels through the outbox as the JSON of ``AlertTransition.as_dict()`` plus the
time it was handed to the sink; a notification is one group's alerts at one flush. Both
are stored as JSON in SQLite, so everything here is dicts of plain values.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.digest import sha256_hex

GO_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt while an alert fires
REASON_PREFIX = "gpuwatchd:"
SEVERITY_RANK = {s.value: s.rank for s in AlertSeverity}


def rfc3339(ts: float) -> str:
    """``2026-01-02T03:04:05.123Z`` (UTC, milliseconds)."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def alert_record(t: AlertTransition, received: float) -> dict[str, Any]:
    """What the outbox keeps of a transition (its ``as_dict`` plus arrival time)."""
    record = t.as_dict()
    record["idempotency_key"] = t.idempotency_key
    record["received"] = received
    return record


def transition_from_record(rec: Mapping[str, Any]) -> AlertTransition:
    return AlertTransition(
        rule=str(rec["rule"]),
        state=AlertState(rec["state"]),
        severity=AlertSeverity(rec["severity"]),
        labels=dict(rec.get("labels") or {}),
        annotations=dict(rec.get("annotations") or {}),
        value=rec.get("value"),
        active_since=float(rec.get("active_since") or 0.0),
        timestamp=float(rec.get("timestamp") or 0.0),
        drain=bool(rec.get("drain")),
        routes=tuple(rec.get("routes") or ()),
        sequence=int(rec.get("sequence") or 0),
    )


def match_labels(rec: Mapping[str, Any]) -> dict[str, str]:
    """The labels routes and silences match on: the alert's, plus rule and severity."""
    labels = {str(k): str(v) for k, v in (rec.get("labels") or {}).items()}
    labels.setdefault("alertname", str(rec["rule"]))
    labels["rule"] = str(rec["rule"])
    labels.setdefault("severity", str(rec["severity"]))
    return labels


def am_labels(rec: Mapping[str, Any]) -> dict[str, str]:
    """Labels as Alertmanager sees them: ``alertname`` is the rule, plus ``severity``."""
    labels = {str(k): str(v) for k, v in (rec.get("labels") or {}).items()}
    labels["alertname"] = str(rec["rule"])
    labels.setdefault("severity", str(rec["severity"]))
    return dict(sorted(labels.items()))


def group_key(receiver: str, group_labels: Mapping[str, str]) -> str:
    """Alertmanager-style group key: ``{}:{node="gpu-a17"}`` (receiver kept apart)."""
    inner = ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(group_labels.items()))
    return "{}:{" + inner + "}"


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def short_hash(*parts: str, n: int = 32) -> str:
    return sha256_hex("\x1f".join(parts).encode())[:n]


def notification_key(
    receiver: str, gkey: str, transition_keys: Iterable[str], extra: str = ""
) -> str:
    """The idempotency key of one notification: stable for the same receiver, group and
    transitions (a resend after a crash carries the same key)."""
    return short_hash(receiver, gkey, *sorted(transition_keys), extra)


def new_pages(note: Mapping[str, Any]) -> list[str]:
    """The fingerprints of the pages a notification announces: alerts it is news about
    (``changed``) that fire with severity ``page``; in the notification's order."""
    news = set(note.get("changed") or ())
    return [
        str(a["fingerprint"])
        for a in note["alerts"]
        if a["fingerprint"] in news and a["state"] == "firing" and a["severity"] == "page"
    ]


def max_severity(alerts: Iterable[Mapping[str, Any]]) -> str:
    best = "info"
    for a in alerts:
        if SEVERITY_RANK.get(str(a["severity"]), 0) > SEVERITY_RANK[best]:
            best = str(a["severity"])
    return best


_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")


def clean_text(text: str, limit: int) -> str:
    """One line of printable text, at most ``limit`` characters."""
    text = _CONTROL.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


_XID_IN_TEXT = re.compile(r"\bXID (\d{1,4})\b")


def xid_of(rec: Mapping[str, Any]) -> str | None:
    """The XID an alert is about: its ``xid`` label, an ``xid`` annotation, or "XID N" in
    its summary (rules that do not split by code put the number only there)."""
    labels = rec.get("labels") or {}
    ann = rec.get("annotations") or {}
    if labels.get("xid"):
        return str(labels["xid"])
    if str(ann.get("xid", "")).isdigit():
        return str(ann["xid"])
    m = _XID_IN_TEXT.search(str(ann.get("summary", "")))
    return m.group(1) if m else None


def short_reason(rec: Mapping[str, Any], limit: int = 120) -> str:
    """``gpuwatchd: XID 79 GPU 3 00000000:3B:00.0`` - the drain reason a scheduler shows."""
    labels = rec.get("labels") or {}
    parts: list[str] = []
    xid = xid_of(rec)
    if xid:
        parts.append(f"XID {xid}")
    else:
        parts.append(str(rec.get("rule", "alert")))
    if labels.get("gpu") not in (None, ""):
        parts.append(f"GPU {labels['gpu']}")
    if labels.get("pci_bus_id"):
        parts.append(str(labels["pci_bus_id"]))
    elif labels.get("uuid"):
        parts.append(str(labels["uuid"]))
    # Schedulers and the drain helper accept a plain ASCII reason: keep only safe characters.
    text = _UNSAFE.sub("-", " ".join(parts)).strip()[: limit - len(REASON_PREFIX) - 1]
    return f"{REASON_PREFIX} {text}"


_UNSAFE = re.compile(r"[^A-Za-z0-9 :._,/()#=+@%\[\]-]+")


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
