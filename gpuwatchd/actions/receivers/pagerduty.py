"""The ``pagerduty`` receiver: Events API v2, one event per alert with a stable
``dedup_key`` (a resolve finds its trigger), within the API's size limits; a refused
event is sent once more trimmed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.model import clean_text, rfc3339, short_hash, xid_of
from gpuwatchd.actions.receivers.base import (
    HttpRequest,
    Outcome,
    Receiver,
    ReceiverKind,
    SecretReader,
    alert_title,
    annotation,
    classify_http,
    json_body,
    starts_at,
)
from gpuwatchd.config.receivers import (
    ReceiverReader,
    common_key,
    http_url,
    inline_secret,
    one_of,
    secret,
    secret_ref,
)
from gpuwatchd.config.yamlsrc import Node, Reader

PD_SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}
# Events API v2 limits (docs/actions.md): the whole event at most 512 KB, summary 1024
# characters, dedup_key 255; source, component, group and class are kept short too.
PD_MAX_EVENT_BYTES = 512 * 1024
PD_MAX_SUMMARY = 1024
PD_MAX_DEDUP = 255
PD_MAX_FIELD = 255
PD_MAX_DETAIL_TEXT = 4096  # one annotation or label value in custom_details
PD_MAX_DETAIL_ITEMS = 64  # labels or annotations of one alert in custom_details


PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"


@dataclass(frozen=True)
class PagerDutyReceiver:
    """PagerDuty Events API v2: trigger and resolve with a stable ``dedup_key``."""

    name: str
    type: str = "pagerduty"
    routing_key: str | None = secret()
    routing_key_file: str | None = None
    url: str = PAGERDUTY_URL
    timeout: float = 10.0
    send_resolved: bool = True


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
        "since": rfc3339(starts_at(alert)),
    }
    xid = xid_of(alert)
    if xid:
        details["xid"] = xid
    payload["custom_details"] = details
    runbook = annotation(alert, "runbook_url")
    if runbook and runbook.startswith(("http://", "https://")) and len(runbook) <= 2048:
        event["links"] = [{"href": runbook, "text": "runbook"}]
    if len(json_body(event)) > PD_MAX_EVENT_BYTES:  # cannot happen within the bounds above
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
            out.append(HttpRequest("POST", self.targets[0], headers, json_body(event)))
        return out

    def classify(self, status: int, headers: Mapping[str, str], body: str, now: float) -> Outcome:
        if status == 400:
            return Outcome("trim", None, "HTTP 400 invalid event")
        return classify_http(status, headers, now)


def _build(cfg: PagerDutyReceiver, read: SecretReader) -> Receiver:
    rk = cfg.routing_key or read(str(cfg.routing_key_file), "routing_key_file")
    p = PagerDutySender(cfg, (rk,), (cfg.url,))
    p.routing_key = rk
    return p


def _read_key(r: Reader, key: str, node: Node, where: str) -> Any:
    if key == "url":  # the endpoint (EU accounts use another one): not a secret
        return http_url(r, node, where, secret=False)
    if key == "routing_key":
        return inline_secret(r, node, where)
    if key == "routing_key_file":
        return secret_ref(r, node, where)
    return common_key(r, key, node, where)


def _check(r: Reader, node: Node, keys: dict[str, Node], what: str) -> None:
    one_of(r, node, keys, "routing_key", "routing_key_file", what)


KIND = ReceiverKind(
    "pagerduty", _build, ReceiverReader("pagerduty", PagerDutyReceiver, _read_key, _check)
)
