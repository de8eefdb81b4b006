"""Receivers: turn a group notification into an HTTP request, and judge the answer.

A notification (built by the outbox at a group flush) is a dict::

    {"receiver": "ops", "group_key": '{}:{node="n1"}', "group_labels": {"node": "n1"},
     "status": "firing" | "resolved", "kind": "notify" | "update" | "repeat", "node": "n1",
     "alerts": [<alert record: AlertTransition.as_dict() + idempotency_key, received>],
     "changed": [<fingerprints of the alerts this message is news about>]}

Each receiver renders it at send time (so ``endsAt`` and signatures are fresh, and the
database never holds a secret) into one or more requests (PagerDuty: one event per
alert) and classifies the response: ``ok``, ``retry`` (maybe with a ``Retry-After``),
``reject`` (a permanent 4xx; retrying cannot help) or ``trim`` (PagerDuty's 400: sent
once more with a trimmed payload, then dropped).
"""

from __future__ import annotations

import email.utils
import hashlib
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gpuwatchd import __version__
from gpuwatchd.actions.model import (
    GO_ZERO_TIME,
    am_labels,
    clean_text,
    new_pages,
    rfc3339,
    short_hash,
    xid_of,
)
from gpuwatchd.actions.secrets import read_secret as _read_secret
from gpuwatchd.actions.secrets import url_secrets
from gpuwatchd.config.actions import (
    DEFAULT_SEVERITY_LABELS,
    AlertmanagerReceiver,
    PagerDutyReceiver,
    ReceiverConfig,
    SlackReceiver,
    WebhookReceiver,
)

USER_AGENT = f"gpuwatchd/{__version__}"
MAX_RETRY_AFTER = 3600.0
SLACK_MAX_ALERTS = 10  # alert sections per Slack message (Slack allows 50 blocks)
PD_SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}


@dataclass(frozen=True)
class HttpRequest:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok | retry | reject
    retry_after: float | None = None
    detail: str = ""


def retry_after_seconds(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from now: an integer, or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now
    if not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER)


def classify_http(
    status: int, headers: Mapping[str, str], now: float, *, ok: Sequence[int] = ()
) -> Outcome:
    """The common judgement: 2xx ok; 408/429/5xx retry; any other 4xx is permanent."""
    if (200 <= status < 300) or status in ok:
        return Outcome("ok")
    if status == 429:
        return Outcome(
            "retry", retry_after_seconds(headers.get("retry-after"), now), "429 rate limited"
        )
    if status == 408 or status >= 500:
        after = retry_after_seconds(headers.get("retry-after"), now) if status == 503 else None
        return Outcome("retry", after, f"HTTP {status}")
    return Outcome("reject", None, f"HTTP {status}")


class Receiver:
    """Base: one configured receiver with its secrets read."""

    # Alertmanager groups and repeats by itself: flush at once, resend on its own interval.
    group_wait_override: float | None = None
    repeat_override: float | None = None
    coalesce = False  # may merge several pending messages into one (Slack)

    def __init__(
        self,
        config: ReceiverConfig,
        secrets: tuple[str, ...] = (),
        targets: tuple[str, ...] = (),
        extra_headers: dict[str, str] | None = None,
    ) -> None:
        self.config = config
        self.secrets = secrets
        self.targets = targets  # destination URLs (one delivery row per target)
        self.extra_headers = dict(extra_headers or {})
        self.min_interval = 0.0  # least time between two messages (Slack: 1s)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def kind(self) -> str:
        return self.config.type

    @property
    def send_resolved(self) -> bool:
        return self.config.send_resolved

    @property
    def timeout(self) -> float:
        return self.config.timeout

    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        raise NotImplementedError

    def render_all(
        self,
        notes: list[dict[str, Any]],
        target: int,
        key: str,
        now: float,
        *,
        trimmed: bool = False,
    ) -> list[HttpRequest]:
        """Every request of one message, in order (``trimmed``: the smallest payload the
        receiver accepts, after it refused the full one)."""
        return [self.render(notes, target, key, now)]

    def classify(self, status: int, headers: Mapping[str, str], body: str, now: float) -> Outcome:
        return classify_http(status, headers, now)

    def _headers(self, key: str) -> dict[str, str]:
        return {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Idempotency-Key": key,
            **self.extra_headers,
        }


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _common(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return dict(sorted(common.items()))


def _starts_at(a: Mapping[str, Any]) -> float:
    return float(a.get("active_since") or a.get("timestamp") or 0.0)


# -- Alertmanager conventions (webhook and Alertmanager receivers) ------------------------
RULE_SEVERITY_LABEL = "severity_label"
"""A rule label that sets the ``severity`` label sent for that rule's alerts itself."""
SOURCE_SEVERITY_LABEL = "gpuwatchd_severity"
"""The gpuwatchd severity (page, ticket, info), kept next to the mapped ``severity``."""


def external_labels(
    rec: Mapping[str, Any], severity_labels: Mapping[str, str] = DEFAULT_SEVERITY_LABELS
) -> dict[str, str]:
    """The labels Alertmanager and webhooks see: ``severity`` in Alertmanager's convention
    (``severity_labels``, or the rule's own ``severity_label``), the gpuwatchd severity in
    ``gpuwatchd_severity``."""
    labels = am_labels(rec)
    internal = str(rec["severity"])
    own = labels.pop(RULE_SEVERITY_LABEL, None)
    labels["severity"] = own or severity_labels.get(internal, internal)
    labels[SOURCE_SEVERITY_LABEL] = internal
    return dict(sorted(labels.items()))


def daemon_url(external_url: str | None, node: str) -> str:
    """Where people reach this node's gpuwatchd: the receiver's ``external_url``, else
    ``http://NODE:9835`` (the node name and the default port)."""
    from gpuwatchd.config.loader import DEFAULT_PORT

    return (external_url or f"http://{node}:{DEFAULT_PORT}").rstrip("/")


def generator_url(base: str, fingerprint: str = "") -> str:
    """The page that produced the alert: the node's status page, at the alert's own
    section (its texts, the GPU's health and, for trend rules, the chart they judged)."""
    return f"{base}/#alert-{fingerprint}" if fingerprint else f"{base}/"


def webhook_message(
    note: Mapping[str, Any],
    receiver: str,
    severity_labels: Mapping[str, str] = DEFAULT_SEVERITY_LABELS,
    external_url: str | None = None,
) -> dict[str, Any]:
    """Alertmanager's webhook payload, version 4."""
    base = daemon_url(external_url, str(note["node"]))
    alerts = []
    for a in note["alerts"]:
        resolved = a["state"] == "resolved"
        alerts.append(
            {
                "status": "resolved" if resolved else "firing",
                "labels": external_labels(a, severity_labels),
                "annotations": dict(sorted((a.get("annotations") or {}).items())),
                "startsAt": rfc3339(_starts_at(a)),
                "endsAt": rfc3339(float(a["timestamp"])) if resolved else GO_ZERO_TIME,
                "generatorURL": generator_url(base, str(a.get("fingerprint") or "")),
                "fingerprint": a["fingerprint"],
            }
        )
    return {
        "version": "4",
        "groupKey": note["group_key"],
        "truncatedAlerts": 0,
        "status": note["status"],
        "receiver": receiver,
        "groupLabels": dict(sorted(note["group_labels"].items())),
        "commonLabels": _common([x["labels"] for x in alerts]),
        "commonAnnotations": _common([x["annotations"] for x in alerts]),
        "externalURL": base,
        "alerts": alerts,
    }


class WebhookSender(Receiver):
    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        cfg = self.config
        assert isinstance(cfg, WebhookReceiver)
        body = _json(webhook_message(notes[0], self.name, cfg.severity_labels, cfg.external_url))
        headers = self._headers(key)
        hmac_key = self._hmac_key
        if hmac_key:
            digest = hmac.new(hmac_key.encode(), body, hashlib.sha256).hexdigest()
            headers[cfg.signature_header] = f"sha256={digest}"
        return HttpRequest("POST", self.targets[target], headers, body)

    _hmac_key: str = ""


# -- Slack ---------------------------------------------------------------------------------
def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _ann(a: Mapping[str, Any], *names: str) -> str | None:
    ann = a.get("annotations") or {}
    for n in names:
        if ann.get(n):
            return str(ann[n])
    return None


def alert_title(a: Mapping[str, Any]) -> str:
    summary = _ann(a, "summary", "title")
    if summary:
        return clean_text(summary, 200)
    labels = a.get("labels") or {}
    gpu = labels.get("gpu")
    xid = labels.get("xid")
    parts = [str(a["rule"])]
    if xid:
        parts.append(f"XID {xid}")
    if gpu not in (None, ""):
        parts.append(f"GPU {gpu}")
    return clean_text(" ".join(parts), 200)


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
        meaning = _ann(a, "xid_meaning", "xid_description", "meaning") or (
            entry.description if entry else None
        )
        out.append(f"*XID*\n{xid}" + (f" \u2014 {clean_text(meaning, 300)}" if meaning else ""))
    action = _ann(a, "xid_action", "recommended_action", "action") or (
        entry.action_text if entry else None
    )
    if action:
        out.append(f"*Action*\n{clean_text(action, 300)}")
    threshold = _ann(a, "threshold")
    value = _fmt_value(a.get("value"))
    if a.get("value") is not None or threshold:
        out.append(
            f"*Value*\n{value}" + (f" (threshold {clean_text(threshold, 60)})" if threshold else "")
        )
    out.append(f"*Since*\n{_when(_starts_at(a))}")
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
        desc = _ann(a, "description")
        text = f"*{_mrkdwn_escape(title)}*"
        if a["state"] == "resolved":
            text = ":white_check_mark: " + text + " (resolved)"
        if desc:
            text += "\n" + _mrkdwn_escape(clean_text(desc, 2000))
        runbook = _ann(a, "runbook_url")
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
        return HttpRequest("POST", self.targets[0], headers, _json(slack_message(notes)))


# -- PagerDuty -----------------------------------------------------------------------------
# Events API v2 limits (docs/actions.md): the whole event at most 512 KB, summary 1024
# characters, dedup_key 255; source, component, group and class are kept short too.
PD_MAX_EVENT_BYTES = 512 * 1024
PD_MAX_SUMMARY = 1024
PD_MAX_DEDUP = 255
PD_MAX_FIELD = 255
PD_MAX_DETAIL_TEXT = 4096  # one annotation or label value in custom_details
PD_MAX_DETAIL_ITEMS = 64  # labels or annotations of one alert in custom_details


def pagerduty_dedup_key(alert: Mapping[str, Any], node: str) -> str:
    """Stable across restarts (a resolve finds the trigger; the next incident opens anew).
    A page on a GPU: one key per node and GPU (a hash of its UUID), so a cascade (XID 79,
    then GpuLost) is one incident; any other alert: node, rule and a hash of its fingerprint."""
    labels = alert.get("labels") or {}
    gpu = labels.get("uuid") or labels.get("gpu")
    if str(alert.get("severity")) == "page" and gpu not in (None, ""):
        readable = _short(f"{node[:100]}/gpu{str(labels.get('gpu', ''))[:20]}", 200)
        return f"gpuwatchd/{readable}/{short_hash(str(gpu), n=16)}"[:PD_MAX_DEDUP]
    readable = _short(f"{node[:100]}/{str(alert['rule'])[:100]}", 200)
    key = f"gpuwatchd/{readable}/{short_hash(str(alert['fingerprint']), n=16)}"
    return key[:PD_MAX_DEDUP]


def _short(value: Any, limit: int) -> str:
    """One line of at most ``limit`` characters, without scanning a huge value whole."""
    return clean_text(str(value)[: 4 * limit], limit)


def _bounded_map(values: Mapping[str, Any]) -> dict[str, str]:
    items = sorted(values.items())[:PD_MAX_DETAIL_ITEMS]
    return {_short(k, 128): _short(v, PD_MAX_DETAIL_TEXT) for k, v in items}


def pagerduty_event(
    alert: Mapping[str, Any], node: str, routing_key: str, *, trimmed: bool = False
) -> dict[str, Any]:
    """The Events API v2 event for one alert, within the API's limits. ``trimmed``: only
    what PagerDuty requires (after it refused the full event with a 400)."""
    dedup = pagerduty_dedup_key(alert, node)
    if alert["state"] == "resolved":
        return {"routing_key": routing_key, "dedup_key": dedup, "event_action": "resolve"}
    node = node or str((alert.get("labels") or {}).get("node", ""))
    labels = alert.get("labels") or {}
    payload: dict[str, Any] = {
        "summary": _short(f"{node[:PD_MAX_FIELD]}: {alert_title(alert)}", PD_MAX_SUMMARY),
        "source": _short(node or "gpuwatchd", PD_MAX_FIELD),
        "severity": PD_SEVERITY.get(str(alert["severity"]), "error"),
        "timestamp": rfc3339(float(alert["timestamp"])),
    }
    event: dict[str, Any] = {
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": dedup,
        "payload": payload,
        "client": "gpuwatchd",
    }
    if trimmed:
        return event
    payload["class"] = _short(alert["rule"], PD_MAX_FIELD)
    payload["group"] = _short(node, PD_MAX_FIELD)
    if labels.get("gpu") not in (None, ""):
        payload["component"] = _short(f"gpu{labels['gpu']}", PD_MAX_FIELD)
    details: dict[str, Any] = {
        "rule": _short(alert["rule"], PD_MAX_FIELD),
        "severity": str(alert["severity"]),
        "labels": _bounded_map(labels),
        "annotations": _bounded_map(alert.get("annotations") or {}),
        "value": alert.get("value"),
        "since": rfc3339(_starts_at(alert)),
    }
    xid = xid_of(alert)
    if xid:
        details["xid"] = xid
    payload["custom_details"] = details
    runbook = _ann(alert, "runbook_url")
    if runbook and runbook.startswith(("http://", "https://")) and len(runbook) <= 2048:
        event["links"] = [{"href": runbook, "text": "runbook"}]
    if len(_json(event)) > PD_MAX_EVENT_BYTES:  # cannot happen within the bounds above
        payload["custom_details"] = {"rule": details["rule"], "trimmed": True}
    return event


def pagerduty_events(
    note: Mapping[str, Any], routing_key: str, *, trimmed: bool = False
) -> list[dict[str, Any]]:
    """The events of one notification: one per alert it is news about (its ``changed``
    alerts; every alert for a repeat), firing ones first. A resolve is not sent while
    another firing alert of the notification holds its key (a GPU's cascade)."""
    node = str(note.get("node") or note["group_labels"].get("node", ""))
    news = set(note.get("changed") or [a["fingerprint"] for a in note["alerts"]])
    held = {pagerduty_dedup_key(a, node) for a in note["alerts"] if a["state"] != "resolved"}
    alerts = [
        a
        for a in note["alerts"]
        if a["fingerprint"] in news
        and (a["state"] != "resolved" or pagerduty_dedup_key(a, node) not in held)
    ]
    alerts.sort(key=lambda a: a["state"] == "resolved")
    return [pagerduty_event(a, node, routing_key, trimmed=trimmed) for a in alerts]


class PagerDutySender(Receiver):
    routing_key: str = ""

    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        return self.render_all(notes, target, key, now)[0]

    def render_all(
        self,
        notes: list[dict[str, Any]],
        target: int,
        key: str,
        now: float,
        *,
        trimmed: bool = False,
    ) -> list[HttpRequest]:
        out = []
        for i, event in enumerate(pagerduty_events(notes[0], self.routing_key, trimmed=trimmed)):
            headers = self._headers(f"{key}-{i}" if i else key)
            out.append(HttpRequest("POST", self.targets[0], headers, _json(event)))
        return out

    def classify(self, status: int, headers: Mapping[str, str], body: str, now: float) -> Outcome:
        if status == 400:
            return Outcome("trim", None, "HTTP 400 invalid event")
        return classify_http(status, headers, now)


# -- Alertmanager --------------------------------------------------------------------------
def alertmanager_alerts(
    note: Mapping[str, Any],
    now: float,
    resend_interval: float,
    severity_labels: Mapping[str, str] = DEFAULT_SEVERITY_LABELS,
    external_url: str | None = None,
) -> list[dict[str, Any]]:
    base = daemon_url(external_url, str(note["node"]))
    out = []
    for a in note["alerts"]:
        resolved = a["state"] == "resolved"
        ends = min(float(a["timestamp"]), now) if resolved else now + 4 * resend_interval
        out.append(
            {
                "labels": external_labels(a, severity_labels),
                "annotations": dict(sorted((a.get("annotations") or {}).items())),
                "startsAt": rfc3339(_starts_at(a)),
                "endsAt": rfc3339(ends),
                "generatorURL": generator_url(base, str(a.get("fingerprint") or "")),
            }
        )
    return out


class AlertmanagerSender(Receiver):
    group_wait_override = 0.0

    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        cfg = self.config
        assert isinstance(cfg, AlertmanagerReceiver)
        body = _json(
            alertmanager_alerts(
                notes[0], now, cfg.resend_interval, cfg.severity_labels, cfg.external_url
            )
        )
        url = self.targets[target].rstrip("/") + "/api/v2/alerts"
        return HttpRequest("POST", url, self._headers(key), body)


def build_receiver(
    cfg: ReceiverConfig, environ: Mapping[str, str] | None = None, *, load_secrets: bool = True
) -> Receiver:
    """A ready receiver; reads its secrets (``SecretError`` when one cannot be read).

    ``load_secrets=False`` (simulate, which records instead of sending) reads nothing and
    uses placeholders."""
    what = f"receiver {cfg.name!r}"
    secrets: list[str] = []

    def read_secret(ref: str, environ: Mapping[str, str] | None, *, what: str) -> str:
        if not load_secrets:
            return "http://secret.invalid/" if what.endswith("url_file") else "secret"
        return _read_secret(ref, environ, what=what)

    if isinstance(cfg, WebhookReceiver):
        url = cfg.url or read_secret(str(cfg.url_file), environ, what=f"{what} url_file")
        extra = dict(cfg.headers)
        for header, ref in cfg.header_files.items():
            extra[header] = read_secret(ref, environ, what=f"{what} header_files.{header}")
            secrets.append(extra[header])
        key = cfg.hmac_secret or (
            read_secret(cfg.hmac_secret_file, environ, what=f"{what} hmac_secret_file")
            if cfg.hmac_secret_file
            else ""
        )
        if key:
            secrets.append(key)
        secrets.extend(url_secrets(url))
        w = WebhookSender(cfg, tuple(secrets), (url,), extra)
        w._hmac_key = key
        return w
    if isinstance(cfg, SlackReceiver):
        url = cfg.url or read_secret(str(cfg.url_file), environ, what=f"{what} url_file")
        s = SlackSender(cfg, tuple(url_secrets(url)), (url,))
        s.min_interval = cfg.min_interval
        return s
    if isinstance(cfg, PagerDutyReceiver):
        rk = cfg.routing_key or read_secret(
            str(cfg.routing_key_file), environ, what=f"{what} routing_key_file"
        )
        p = PagerDutySender(cfg, (rk,), (cfg.url,))
        p.routing_key = rk
        return p
    import urllib.parse

    passwords = tuple(pw for u in cfg.urls if (pw := urllib.parse.urlsplit(u).password))
    am = AlertmanagerSender(cfg, passwords, tuple(cfg.urls))
    am.repeat_override = cfg.resend_interval
    return am
