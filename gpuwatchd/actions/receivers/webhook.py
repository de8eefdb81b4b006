"""The ``webhook`` receiver: Alertmanager's webhook JSON (version 4) POSTed to one URL,
optionally signed with an HMAC of the body."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.actions.model import GO_ZERO_TIME, rfc3339
from gpuwatchd.actions.receivers.base import (
    HttpRequest,
    Receiver,
    ReceiverKind,
    SecretReader,
    common_map,
    daemon_url,
    external_labels,
    generator_url,
    json_body,
    starts_at,
)
from gpuwatchd.actions.secrets import url_secrets
from gpuwatchd.config.receivers import (
    DEFAULT_SEVERITY_LABELS,
    HEADER_RE,
    ReceiverReader,
    common_key,
    headers,
    http_url,
    inline_secret,
    is_secret_ref,
    one_of,
    secret,
    secret_ref,
)
from gpuwatchd.config.yamlsrc import Node, Reader

SIGNATURE_HEADER = "X-Gpuwatchd-Signature"


@dataclass(frozen=True)
class WebhookReceiver:
    """POSTs Alertmanager webhook v4 JSON to ``url``."""

    name: str
    type: str = "webhook"
    url: str | None = secret()
    url_file: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    header_files: dict[str, str] = field(default_factory=dict)
    hmac_secret: str | None = secret()
    hmac_secret_file: str | None = None
    signature_header: str = SIGNATURE_HEADER
    timeout: float = 10.0
    send_resolved: bool = True
    severity_labels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SEVERITY_LABELS))
    external_url: str | None = None


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
                "startsAt": rfc3339(starts_at(a)),
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
        "commonLabels": common_map([x["labels"] for x in alerts]),
        "commonAnnotations": common_map([x["annotations"] for x in alerts]),
        "externalURL": base,
        "alerts": alerts,
    }


class WebhookSender(Receiver):
    def render(self, notes: list[dict[str, Any]], target: int, key: str, now: float) -> HttpRequest:
        cfg = self.config
        assert isinstance(cfg, WebhookReceiver)
        body = json_body(
            webhook_message(notes[0], self.name, cfg.severity_labels, cfg.external_url)
        )
        headers = self._headers(key)
        hmac_key = self._hmac_key
        if hmac_key:
            digest = hmac.new(hmac_key.encode(), body, hashlib.sha256).hexdigest()
            headers[cfg.signature_header] = f"sha256={digest}"
        return HttpRequest("POST", self.targets[target], headers, body)

    _hmac_key: str = ""


def _build(cfg: WebhookReceiver, read: SecretReader) -> Receiver:
    url = cfg.url or read(str(cfg.url_file), "url_file")
    extra = dict(cfg.headers)
    secrets: list[str] = []
    for header, ref in cfg.header_files.items():
        extra[header] = read(ref, f"header_files.{header}")
        secrets.append(extra[header])
    key = cfg.hmac_secret or (
        read(cfg.hmac_secret_file, "hmac_secret_file") if cfg.hmac_secret_file else ""
    )
    if key:
        secrets.append(key)
    secrets.extend(url_secrets(url))
    w = WebhookSender(cfg, tuple(secrets), (url,), extra)
    w._hmac_key = key
    return w


def _read_key(r: Reader, key: str, node: Node, where: str) -> Any:
    if key == "url":
        return http_url(r, node, where, secret=True)
    if key in ("url_file", "hmac_secret_file"):
        return secret_ref(r, node, where)
    if key == "hmac_secret":
        return inline_secret(r, node, where)
    if key == "headers":
        return headers(r, node, where)
    if key == "header_files":
        refs = headers(r, node, where)
        for name, ref in (refs or {}).items():
            if not is_secret_ref(ref):
                r.error(
                    node.loc,
                    f"{where}.{name}: {ref!r} is neither an absolute path nor a credential name",
                )
                return None
        return refs
    if key == "signature_header":
        value = r.string(node, where)
        if value is not None and not HEADER_RE.fullmatch(value):
            r.error(node.loc, f"{where}: {value!r} is not an HTTP header name")
            return None
        return value
    return common_key(r, key, node, where)


def _check(r: Reader, node: Node, keys: dict[str, Node], what: str) -> None:
    one_of(r, node, keys, "url", "url_file", what)
    if "hmac_secret" in keys and "hmac_secret_file" in keys:
        r.error(
            keys["hmac_secret_file"].loc,
            f"{what}: give either 'hmac_secret' or 'hmac_secret_file', not both",
        )


KIND = ReceiverKind(
    "webhook", _build, ReceiverReader("webhook", WebhookReceiver, _read_key, _check)
)
