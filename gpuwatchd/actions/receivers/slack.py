"""The ``slack`` receiver: a Slack incoming webhook, a text fallback plus Block Kit blocks;
messages pending while rate limited are coalesced into one."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwatchd import __version__
from gpuwatchd.actions.model import clean_text, new_pages, xid_of
from gpuwatchd.actions.receivers.base import (
    USER_AGENT,
    HttpRequest,
    Receiver,
    ReceiverKind,
    SecretReader,
    alert_title,
    annotation,
    json_body,
    starts_at,
)
from gpuwatchd.actions.secrets import url_secrets
from gpuwatchd.config.receivers import (
    ReceiverReader,
    common_key,
    duration,
    http_url,
    one_of,
    secret,
    secret_ref,
)
from gpuwatchd.config.yamlsrc import Node, Reader

SLACK_MAX_ALERTS = 10  # alert sections per Slack message (Slack allows 50 blocks)


@dataclass(frozen=True)
class SlackReceiver:
    """A Slack incoming webhook: text fallback plus Block Kit blocks."""

    name: str
    type: str = "slack"
    url: str | None = secret()
    url_file: str | None = None
    min_interval: float = 1.0
    timeout: float = 10.0
    send_resolved: bool = True


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _fmt_value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and v == int(v) and abs(v) < 1e15:
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _mrkdwn_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _catalog_entry(xid: str | None) -> Any:
    """NVIDIA's catalog entry for an XID (meaning and recommended action), if known."""
    if not xid or not xid.isdigit():
        return None
    from gpuwatchd.xid import lookup

    return lookup(int(xid))


def slack_alert_fields(a: Mapping[str, Any], node: str) -> list[str]:
    """``*Name*\\nvalue`` field texts for one alert (at most 10, Slack's limit)."""
    labels = a.get("labels") or {}
    out = [f"*Severity*\n{a['severity']}", f"*Node*\n{labels.get('node', node)}"]
    gpu = labels.get("gpu")
    if gpu not in (None, "") or labels.get("uuid") or labels.get("pci_bus_id"):
        ids = [f"{gpu}" if gpu not in (None, "") else "?"]
        for k in ("uuid", "pci_bus_id"):
            if labels.get(k):
                ids.append(f"`{labels[k]}`")
        out.append("*GPU*\n" + " ".join(ids))
    xid = xid_of(a)
    entry = _catalog_entry(xid)
    if xid:
        meaning = annotation(a, "xid_meaning", "xid_description", "meaning") or (
            entry.description if entry else None
        )
        out.append(f"*XID*\n{xid}" + (f" \u2014 {clean_text(meaning, 300)}" if meaning else ""))
    action = annotation(a, "xid_action", "recommended_action", "action") or (
        entry.action_text if entry else None
    )
    if action:
        out.append(f"*Action*\n{clean_text(action, 300)}")
    threshold = annotation(a, "threshold")
    value = _fmt_value(a.get("value"))
    if a.get("value") is not None or threshold:
        out.append(
            f"*Value*\n{value}" + (f" (threshold {clean_text(threshold, 60)})" if threshold else "")
        )
    out.append(f"*Since*\n{_when(starts_at(a))}")
    if a["state"] == "resolved":
        out.append(f"*Resolved*\n{_when(float(a['timestamp']))}")
    return [_mrkdwn_escape(t) for t in out[:10]]


def slack_message(notes: list[dict[str, Any]]) -> dict[str, Any]:
    """One Slack message for one or more notifications (coalesced while rate limited)."""
    alerts: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for note in notes:  # the latest state of each alert wins
        for a in note["alerts"]:
            if a["fingerprint"] in seen:
                alerts[seen[a["fingerprint"]]] = a
            else:
                seen[a["fingerprint"]] = len(alerts)
                alerts.append(a)
    node = str(notes[-1].get("node") or notes[-1]["group_labels"].get("node", ""))
    paged: dict[str, int] = {}  # the pages these messages announce: they head it
    for n in notes:
        for fp in new_pages(n):
            paged.setdefault(fp, len(paged))
    firing = [a for a in alerts if a["state"] != "resolved"]
    firing.sort(key=lambda a: paged.get(a["fingerprint"], len(paged)))
    resolved = [a for a in alerts if a["state"] == "resolved"]
    repeat = all(n.get("kind") == "repeat" for n in notes)
    status = "FIRING" if firing else "RESOLVED"
    where = f" on {node}" if node else ""
    if firing:
        head = f"[{status}:{len(firing)}] {alert_title(firing[0])}"
        if len(firing) > 1:
            head += f" (+{len(firing) - 1} more)"
    else:
        head = f"[{status}] {alert_title(resolved[0])}"
        if len(resolved) > 1:
            head += f" (+{len(resolved) - 1} more)"
    update = not repeat and not paged and any(n.get("kind") == "update" for n in notes)
    tail = " - still firing" if repeat else " - update" if update else ""
    head = clean_text(head + where + tail, 150)
    lines = [head]
    for a in firing + resolved:
        mark = "resolved" if a["state"] == "resolved" else str(a["severity"])
        lines.append(f"- [{mark}] {alert_title(a)}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": head, "emoji": False}}
    ]
    for a in (firing + resolved)[:SLACK_MAX_ALERTS]:
        title = alert_title(a)
        desc = annotation(a, "description")
        text = f"*{_mrkdwn_escape(title)}*"
        if a["state"] == "resolved":
            text = ":white_check_mark: " + text + " (resolved)"
        if desc:
            text += "\n" + _mrkdwn_escape(clean_text(desc, 2000))
        runbook = annotation(a, "runbook_url")
        if runbook and runbook.startswith(("http://", "https://")):
            text += f"\n<{runbook}|Runbook>"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text[:2900]}})
        blocks.append(
            {
                "type": "section",
                "fields": [{"type": "mrkdwn", "text": t} for t in slack_alert_fields(a, node)],
            }
        )
    hidden = len(firing) + len(resolved) - SLACK_MAX_ALERTS
    context = f"gpuwatchd {__version__} \u2022 rule {_mrkdwn_escape(str(alerts[0]['rule']))}"
    if hidden > 0:
        context += f" \u2022 +{hidden} more alert(s) not shown"
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": context}]})
    if len(lines) > 30:
        lines = [*lines[:30], f"- ... {len(lines) - 30} more"]
    return {"text": "\n".join(lines)[:3000], "blocks": blocks}


class SlackSender(Receiver):
    coalesce = True

    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
        return HttpRequest("POST", self.targets[0], headers, json_body(slack_message(notes)))


def _build(cfg: SlackReceiver, read: SecretReader) -> Receiver:
    url = cfg.url or read(str(cfg.url_file), "url_file")
    s = SlackSender(cfg, tuple(url_secrets(url)), (url,))
    s.min_interval = cfg.min_interval
    return s


def _read_key(r: Reader, key: str, node: Node, where: str) -> Any:
    if key == "url":
        return http_url(r, node, where, secret=True)
    if key == "url_file":
        return secret_ref(r, node, where)
    if key == "min_interval":
        return duration(r, node, where)
    return common_key(r, key, node, where)


def _check(r: Reader, node: Node, keys: dict[str, Node], what: str) -> None:
    one_of(r, node, keys, "url", "url_file", what)


KIND = ReceiverKind("slack", _build, ReceiverReader("slack", SlackReceiver, _read_key, _check))
