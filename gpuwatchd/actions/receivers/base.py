"""What every receiver kind shares: the request it renders, how an answer is judged, the
``Receiver`` base class, the ``ReceiverKind`` registry entry, and the helpers several kinds
use (Alertmanager's label conventions, an alert's title).

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
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC
from typing import Any

from gpuwatchd import __version__
from gpuwatchd.actions.model import am_labels, clean_text
from gpuwatchd.config.receivers import DEFAULT_SEVERITY_LABELS, ReceiverConfig, ReceiverReader

USER_AGENT = f"gpuwatchd/{__version__}"
MAX_RETRY_AFTER = 3600.0


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


SecretReader = Callable[[str, str], str]
"""``(reference, what)`` -> the secret (``what`` names the key in errors); raises
``SecretError`` when it cannot be read."""


@dataclass(frozen=True)
class ReceiverKind:
    """One receiver kind: the ``type`` it serves in the config, how a configured one
    becomes a ready ``Receiver`` (its secrets read through the ``SecretReader``) and how
    its config is read (``reader``: its config class and key readers)."""

    type: str
    build: Callable[[Any, SecretReader], Receiver]
    reader: ReceiverReader


def json_body(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def common_map(maps: list[dict[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    common = dict(maps[0])
    for m in maps[1:]:
        common = {k: v for k, v in common.items() if m.get(k) == v}
    return dict(sorted(common.items()))


def starts_at(a: Mapping[str, Any]) -> float:
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
    from gpuwatchd.config.sections import DEFAULT_PORT

    return (external_url or f"http://{node}:{DEFAULT_PORT}").rstrip("/")


def generator_url(base: str, fingerprint: str = "") -> str:
    """The page that produced the alert: the node's status page, at the alert's own
    section (its texts, the GPU's health and, for trend rules, the chart they judged)."""
    return f"{base}/#alert-{fingerprint}" if fingerprint else f"{base}/"


def annotation(a: Mapping[str, Any], *names: str) -> str | None:
    ann = a.get("annotations") or {}
    for n in names:
        if ann.get(n):
            return str(ann[n])
    return None


def alert_title(a: Mapping[str, Any]) -> str:
    summary = annotation(a, "summary", "title")
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
