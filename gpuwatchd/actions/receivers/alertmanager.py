"""The ``alertmanager`` receiver: alerts pushed to every Alertmanager in ``urls``
(POST /api/v2/alerts) as Prometheus does; Alertmanager groups and repeats them itself."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.actions.model import rfc3339
from gpuwatchd.actions.receivers.base import (
    HttpRequest,
    Receiver,
    ReceiverKind,
    SecretReader,
    daemon_url,
    external_labels,
    generator_url,
    json_body,
    starts_at,
)
from gpuwatchd.config.receivers import (
    DEFAULT_SEVERITY_LABELS,
    ReceiverReader,
    common_key,
    duration,
    http_url,
)
from gpuwatchd.config.yamlsrc import Node, Reader


@dataclass(frozen=True)
class AlertmanagerReceiver:
    """Pushes alerts to every Alertmanager in ``urls`` (POST /api/v2/alerts)."""

    name: str
    type: str = "alertmanager"
    urls: tuple[str, ...] = ()
    resend_interval: float = 60.0
    timeout: float = 10.0
    send_resolved: bool = True
    severity_labels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SEVERITY_LABELS))
    external_url: str | None = None


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
                "startsAt": rfc3339(starts_at(a)),
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
        body = json_body(
            alertmanager_alerts(
                notes[0], now, cfg.resend_interval, cfg.severity_labels, cfg.external_url
            )
        )
        url = self.targets[target].rstrip("/") + "/api/v2/alerts"
        return HttpRequest("POST", url, self._headers(key), body)


def _build(cfg: AlertmanagerReceiver, read: SecretReader) -> Receiver:
    passwords = tuple(pw for u in cfg.urls if (pw := urllib.parse.urlsplit(u).password))
    am = AlertmanagerSender(cfg, passwords, tuple(cfg.urls))
    am.repeat_override = cfg.resend_interval
    return am


def _read_key(r: Reader, key: str, node: Node, where: str) -> Any:
    if key == "urls":
        items = r.sequence(node, where)
        urls = [http_url(r, i, where, secret=False) for i in items or []]
        if items is not None and not items:
            r.error(node.loc, f"{where}: needs at least one Alertmanager URL")
        return None if items is None or None in urls or not urls else tuple(urls)
    if key == "resend_interval":
        return duration(r, node, where, positive=True)
    return common_key(r, key, node, where)


def _check(r: Reader, node: Node, keys: dict[str, Node], what: str) -> None:
    if "urls" not in keys:
        r.error(node.loc, f"{what}: missing required key 'urls'")


KIND = ReceiverKind(
    "alertmanager",
    _build,
    ReceiverReader("alertmanager", AlertmanagerReceiver, _read_key, _check),
)
