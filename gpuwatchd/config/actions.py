"""Config sections of the actions stage: ``receivers``, ``routing`` and ``drain``.

Kept apart from ``config.py`` so that the sections other engineers add do not collide;
``config.py`` registers the three readers in its ``_ENTRIES`` table. Every value is checked
here and every problem is reported as ``PATH:LINE:COL: message``. A secret given inline
(``url``, ``routing_key``, ``hmac_secret``) is never echoed in an error message: errors
about it name the key, not the value. The schema is documented in docs/config.md and
docs/actions.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatchd.config.saferegex import regex_problem
from gpuwatchd.config.yamlsrc import Node, Reader, type_name

SEVERITIES = ("page", "ticket", "info")
RECEIVER_TYPES = ("webhook", "slack", "pagerduty", "alertmanager")
DRAIN_MODES = ("none", "exec", "slurm", "kubernetes")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
SIGNATURE_HEADER = "X-Gpuwatchd-Signature"
DEFAULT_STATE_FILE = "/run/gpuwatchd/health.json"
DEFAULT_SEVERITY_LABELS: dict[str, str] = {"page": "critical", "ticket": "warning", "info": "info"}
"""The ``severity`` label Alertmanager and webhook receivers see for each gpuwatchd severity
(Alertmanager's and most routing trees' convention); ``severity_labels`` changes it."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_CREDENTIAL_RE = re.compile(r"[A-Za-z0-9_.@-]{1,255}")
_HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TAINT_KEY_RE = re.compile(
    r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_SELECTOR_RE = re.compile(r"[A-Za-z0-9_./=!,() -]{1,1024}")
_CONDITION_RE = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")
# Headers gpuwatchd sets itself; a configured header must not replace them.
_RESERVED_HEADERS = {"content-type", "content-length", "host", "idempotency-key"}


# -- receivers -----------------------------------------------------------------------------
def _secret() -> Any:
    return field(default=None, metadata={"secret": True})


@dataclass(frozen=True)
class WebhookReceiver:
    """POSTs Alertmanager webhook v4 JSON to ``url``."""

    name: str
    type: str = "webhook"
    url: str | None = _secret()
    url_file: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    header_files: dict[str, str] = field(default_factory=dict)
    hmac_secret: str | None = _secret()
    hmac_secret_file: str | None = None
    signature_header: str = SIGNATURE_HEADER
    timeout: float = 10.0
    send_resolved: bool = True
    severity_labels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_SEVERITY_LABELS))
    external_url: str | None = None


@dataclass(frozen=True)
class SlackReceiver:
    """A Slack incoming webhook: text fallback plus Block Kit blocks."""

    name: str
    type: str = "slack"
    url: str | None = _secret()
    url_file: str | None = None
    min_interval: float = 1.0
    timeout: float = 10.0
    send_resolved: bool = True


@dataclass(frozen=True)
class PagerDutyReceiver:
    """PagerDuty Events API v2: trigger and resolve with a stable ``dedup_key``."""

    name: str
    type: str = "pagerduty"
    routing_key: str | None = _secret()
    routing_key_file: str | None = None
    url: str = PAGERDUTY_URL
    timeout: float = 10.0
    send_resolved: bool = True


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


ReceiverConfig = WebhookReceiver | SlackReceiver | PagerDutyReceiver | AlertmanagerReceiver

_RECEIVER_CLASSES: dict[str, type] = {
    "webhook": WebhookReceiver,
    "slack": SlackReceiver,
    "pagerduty": PagerDutyReceiver,
    "alertmanager": AlertmanagerReceiver,
}


# -- routing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouteConfig:
    """Alerts whose labels match go to ``receivers`` (every matching route applies)."""

    receivers: tuple[str, ...]
    match: dict[str, str] = field(default_factory=dict)
    match_re: dict[str, str] = field(default_factory=dict)
    group_by: tuple[str, ...] | None = None
    group_wait: float | None = None
    repeat_interval: float | None = None


@dataclass(frozen=True)
class RoutingConfig:
    receivers: tuple[str, ...] | None = None
    min_severity: str = "ticket"
    group_by: tuple[str, ...] = ("node",)
    group_wait: float = 5.0
    repeat_interval: float = 4 * 3600.0
    ticket_repeat_interval: float = 86400.0  # the shortest repeat of a ticket or info alert
    routes: tuple[RouteConfig, ...] = ()
    queue_size: int = 1000
    retry_initial: float = 1.0
    retry_max: float = 300.0
    give_up_after: float = 86400.0


# -- drain ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExecDrainConfig:
    command: tuple[str, ...] = ()


@dataclass(frozen=True)
class SlurmDrainConfig:
    scontrol: str = "scontrol"
    sinfo: str = "sinfo"


@dataclass(frozen=True)
class KubernetesDrainConfig:
    kubeconfig: str | None = None
    taint: bool = True
    taint_key: str = "gpuwatchd.io/gpu-unhealthy"
    taint_effect: str = "NoSchedule"
    condition: bool = True
    condition_type: str = "GpuUnhealthy"
    events: bool = True
    event_namespace: str = "default"
    budget_namespace: str = "gpuwatchd"


@dataclass(frozen=True)
class FleetDrainConfig:
    """``drain.fleet``: a budget of nodes gpuwatchd may hold drained across the cluster."""

    max_nodes: int | None = None
    max_percent: float | None = None
    partition: str | None = None  # Slurm: count only this partition's nodes
    selector: str | None = None  # Kubernetes: count only nodes matching this label selector
    window: float | None = None  # count only drains younger than this (None: every drain)
    recheck: float = 60.0  # how often an incident held back by the budget asks again
    jitter: float = 1.0  # a drain's first check waits up to this (random): storms spread
    # when more nodes want to drain at once than the budget allows, stop draining
    # fleet-wide until an operator runs ``gpuwatchd fleet reset``
    breaker: bool = False
    correlate: float = 600.0  # the same XID on several nodes within this is named as such
    # drain.mode exec only: who counts the fleet. "slurm" (the default with exec): the daemon
    # runs sinfo itself (no privilege needed) while claims, drains and resumes go through
    # the exec command (the root drain helper: the recommended privilege split)
    census: str | None = None

    @property
    def enabled(self) -> bool:
        return self.max_nodes is not None or self.max_percent is not None


@dataclass(frozen=True)
class DrainConfig:
    mode: str = "none"
    dry_run: bool = False
    node: str | None = None
    grace: float = 0.0
    rule_grace: dict[str, float] = field(default_factory=dict)
    notify_command: tuple[str, ...] = ()
    state_file: str | None = DEFAULT_STATE_FILE
    max_drains: int = 3
    window: float = 3600.0
    resume: bool = False
    resume_hold: float = 1800.0
    timeout: float = 30.0
    attempts: int = 5
    hold_interval: float = 30.0
    fleet: FleetDrainConfig = field(default_factory=FleetDrainConfig)
    exec: ExecDrainConfig = field(default_factory=ExecDrainConfig)
    slurm: SlurmDrainConfig = field(default_factory=SlurmDrainConfig)
    kubernetes: KubernetesDrainConfig = field(default_factory=KubernetesDrainConfig)


# -- small readers -------------------------------------------------------------------------
def _keys(r: Reader, node: Node | None, allowed: list[str], what: str) -> dict[str, Node]:
    if node is None or node.value is None:
        return {}
    return r.mapping(node, allowed, what) or {}


def _duration(r: Reader, node: Node, what: str, *, positive: bool = False) -> float | None:
    seconds = r.duration(node, what)
    if seconds is None:
        return None
    if not math.isfinite(seconds):
        r.error(node.loc, f"{what}: must be a finite duration, got {node.value!r}")
        return None
    if positive and seconds <= 0:
        r.error(node.loc, f"{what}: must be more than 0s, got {node.value!r}")
        return None
    return seconds


def _strings(
    r: Reader, node: Node, what: str, *, non_empty: bool = False
) -> tuple[str, ...] | None:
    items = r.sequence(node, what)
    if items is None:
        return None
    out: list[str] = []
    ok = True
    for item in items:
        text = r.string(item, what)
        if text is None:
            ok = False
        elif non_empty and not text:
            r.error(item.loc, f"{what}: empty string")
            ok = False
        else:
            out.append(text)
    return tuple(out) if ok else None


def _string_map(
    r: Reader, node: Node, what: str, key_re: re.Pattern[str] | None = None, key_what: str = ""
) -> dict[str, str] | None:
    if node.value is None:
        return {}
    if not node.is_mapping():
        r.error(node.loc, f"{what}: expected a mapping, got {type_name(node.value)}")
        return None
    out: dict[str, str] = {}
    ok = True
    for key_node, value_node in node.items():
        key = str(key_node.value)
        if key_re is not None and not key_re.fullmatch(key):
            r.error(key_node.loc, f"{what}: {key!r} is not {key_what}")
            ok = False
            continue
        value = value_node.value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            r.error(value_node.loc, f"{what}.{key}: expected a string, got {type_name(value)}")
            ok = False
            continue
        out[key] = str(value)
    return out if ok else None


def _http_url(r: Reader, node: Node, what: str, *, secret: bool) -> str | None:
    if not isinstance(node.value, str):
        r.error(node.loc, f"{what}: expected a string, got {type_name(node.value)}")
        return None
    text = node.value.strip()
    parsed = urllib.parse.urlsplit(text)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        shown = "the value" if secret else repr(text)
        r.error(node.loc, f"{what}: {shown} is not an http:// or https:// URL")
        return None
    return text


def _secret_ref(r: Reader, node: Node, what: str) -> str | None:
    """An absolute file path, or the name of a systemd credential (no ``/``)."""
    text = r.string(node, what)
    if text is None:
        return None
    if text.startswith("/") or _CREDENTIAL_RE.fullmatch(text):
        return text
    r.error(
        node.loc,
        f"{what}: {text!r} is neither an absolute path nor a credential name "
        "(a file in $CREDENTIALS_DIRECTORY: letters, digits, '_', '.', '@', '-')",
    )
    return None


def _one_of(
    r: Reader,
    node: Node,
    keys: dict[str, Node],
    inline: str,
    file_key: str,
    what: str,
) -> None:
    """Exactly one of ``inline`` and ``file_key`` must be given."""
    if inline in keys and file_key in keys:
        r.error(keys[file_key].loc, f"{what}: give either {inline!r} or {file_key!r}, not both")
    elif inline not in keys and file_key not in keys:
        r.error(node.loc, f"{what}: missing {inline!r} or {file_key!r}")


# -- receivers -----------------------------------------------------------------------------
def _read_receiver(r: Reader, node: Node, what: str) -> ReceiverConfig | None:
    if not node.is_mapping():
        r.error(node.loc, f"{what}: expected a mapping, got {type_name(node.value)}")
        return None
    type_node = node.get("type")
    if type_node is None:
        r.error(node.loc, f"{what}: missing required key 'type' ({', '.join(RECEIVER_TYPES)})")
        return None
    kind = r.string(type_node, f"{what}.type", RECEIVER_TYPES)
    if kind is None:
        return None
    cls = _RECEIVER_CLASSES[kind]
    allowed = [f.name for f in dataclasses.fields(cls)]
    keys = r.mapping(node, allowed, f"{what} ({kind})", required=("name",))
    if keys is None:
        return None
    # An explicit null means "not set" (what `check-config --print` writes for unset keys).
    keys = {k: v for k, v in keys.items() if v.value is not None or k in ("name", "type")}
    values: dict[str, Any] = {}
    bad = False
    if "name" in keys:
        name = r.string(keys["name"], f"{what}.name")
        if name is not None and not _NAME_RE.fullmatch(name):
            r.error(
                keys["name"].loc,
                f"{what}.name: {name!r} is not a receiver name "
                "(letters, digits, '_', '.', '-'; at most 63; starts with a letter or digit)",
            )
            name = None
        if name is None:
            bad = True
        values["name"] = name
    else:
        bad = True
    for key, value_node in keys.items():
        where = f"{what}.{key}"
        value: Any
        if key in ("name", "type"):
            continue
        if key in ("url",) and kind in ("webhook", "slack"):
            value = _http_url(r, value_node, where, secret=True)
        elif key == "url":  # pagerduty: the endpoint (EU accounts use another one)
            value = _http_url(r, value_node, where, secret=False)
        elif key == "urls":
            items = r.sequence(value_node, where)
            urls = [_http_url(r, i, where, secret=False) for i in items or []]
            if items is not None and not items:
                r.error(value_node.loc, f"{where}: needs at least one Alertmanager URL")
            value = None if items is None or None in urls or not urls else tuple(urls)
        elif key in ("url_file", "routing_key_file", "hmac_secret_file"):
            value = _secret_ref(r, value_node, where)
        elif key in ("routing_key", "hmac_secret"):
            value = value_node.value if isinstance(value_node.value, str) else None
            if value is None or not value.strip():
                r.error(value_node.loc, f"{where}: expected a non-empty string")
                value = None
            else:
                value = value.strip()
        elif key == "headers":
            value = _string_map(r, value_node, where, _HEADER_RE, "an HTTP header name")
            value = _no_reserved(r, value_node, where, value)
        elif key == "header_files":
            value = _string_map(r, value_node, where, _HEADER_RE, "an HTTP header name")
            value = _no_reserved(r, value_node, where, value)
            for hname, ref in (value or {}).items():
                if not (ref.startswith("/") or _CREDENTIAL_RE.fullmatch(ref)):
                    r.error(
                        value_node.loc,
                        f"{where}.{hname}: {ref!r} is neither an absolute path nor a "
                        "credential name",
                    )
                    value = None
        elif key == "signature_header":
            value = r.string(value_node, where)
            if value is not None and not _HEADER_RE.fullmatch(value):
                r.error(value_node.loc, f"{where}: {value!r} is not an HTTP header name")
                value = None
        elif key in ("timeout", "min_interval", "resend_interval"):
            value = _duration(r, value_node, where, positive=key != "min_interval")
        elif key == "send_resolved":
            value = r.boolean(value_node, where)
        elif key == "severity_labels":
            value = read_severity_labels(r, value_node, where)
        elif key == "external_url":
            value = _http_url(r, value_node, where, secret=False)
            value = value.rstrip("/") if value else None
        else:  # pragma: no cover - every dataclass field is handled above
            raise AssertionError(key)
        if value is None:
            bad = True
        else:
            values[key] = value
    if kind in ("webhook", "slack"):
        _one_of(r, node, keys, "url", "url_file", what)
    elif kind == "pagerduty":
        _one_of(r, node, keys, "routing_key", "routing_key_file", what)
    elif kind == "alertmanager" and "urls" not in keys:
        r.error(node.loc, f"{what}: missing required key 'urls'")
    if kind == "webhook" and "hmac_secret" in keys and "hmac_secret_file" in keys:
        r.error(
            keys["hmac_secret_file"].loc,
            f"{what}: give either 'hmac_secret' or 'hmac_secret_file', not both",
        )
    if bad:
        return None
    values["type"] = kind
    result: ReceiverConfig = cls(**values)
    return result


_SEVERITY_VALUE_RE = re.compile(r"[A-Za-z0-9_.-]{1,63}")


def read_severity_labels(r: Reader, node: Node, what: str) -> dict[str, str] | None:
    """``{page: critical, ...}``: gpuwatchd severity -> the ``severity`` label value sent.

    Severities left out keep their default (``DEFAULT_SEVERITY_LABELS``)."""
    given = _string_map(r, node, what)
    if given is None:
        return None
    bad = False
    for key_node, value_node in node.items() if node.is_mapping() else ():
        key = str(key_node.value)
        if key not in SEVERITIES:
            r.error(
                key_node.loc,
                f"{what}: {key!r} is not a gpuwatchd severity ({', '.join(SEVERITIES)})",
            )
            bad = True
        elif not _SEVERITY_VALUE_RE.fullmatch(given[key]):
            r.error(
                value_node.loc,
                f"{what}.{key}: {given[key]!r} is not a severity label value "
                "(letters, digits, '_', '.', '-'; at most 63)",
            )
            bad = True
    return None if bad else {**DEFAULT_SEVERITY_LABELS, **given}


def _no_reserved(
    r: Reader, node: Node, what: str, headers: dict[str, str] | None
) -> dict[str, str] | None:
    if headers is None:
        return None
    for name in headers:
        if name.lower() in _RESERVED_HEADERS:
            r.error(node.loc, f"{what}: {name!r} is set by gpuwatchd and cannot be configured")
            return None
    return headers


def read_receivers(r: Reader, node: Node | None) -> tuple[ReceiverConfig, ...]:
    if node is None or node.value is None:
        return ()
    items = r.sequence(node, "receivers")
    out: list[ReceiverConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(items or []):
        what = f"receivers[{i}]"
        rc = _read_receiver(r, item, what)
        if rc is None:
            continue
        if rc.name in seen:
            name_node = item.get("name")
            r.error((name_node or item).loc, f"{what}.name: {rc.name!r} is used twice")
            continue
        seen.add(rc.name)
        out.append(rc)
    return tuple(out)


# -- routing -------------------------------------------------------------------------------
def _label_list(r: Reader, node: Node, what: str) -> tuple[str, ...] | None:
    names = _strings(r, node, what)
    if names is None:
        return None
    for item, name in zip(node.value, names, strict=True):
        if not _LABEL_RE.fullmatch(name):
            r.error(item.loc, f"{what}: {name!r} is not a label name")
            return None
    return names


def _receiver_refs(
    r: Reader, node: Node, what: str, known: set[str], *, allow_empty: bool
) -> tuple[str, ...] | None:
    names = _strings(r, node, what)
    if names is None:
        return None
    if not names and not allow_empty:
        r.error(node.loc, f"{what}: name at least one receiver")
        return None
    for item, name in zip(node.value, names, strict=True):
        if name not in known:
            import difflib

            hint = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            r.error(item.loc, f"{what}: no receiver is named {name!r}{suggestion}")
            return None
    return names


def _read_route(r: Reader, node: Node, what: str, known: set[str]) -> RouteConfig | None:
    allowed = list(RouteConfig.__dataclass_fields__)
    keys = r.mapping(node, allowed, what, required=("receivers",))
    if keys is None or "receivers" not in keys:
        return None
    receivers = _receiver_refs(r, keys["receivers"], f"{what}.receivers", known, allow_empty=False)
    values: dict[str, Any] = {}
    bad = receivers is None
    for key in ("match", "match_re"):
        if key in keys:
            m = _string_map(r, keys[key], f"{what}.{key}", _LABEL_RE, "a label name")
            if m is None:
                bad = True
                continue
            if key == "match_re":
                for label, pattern in m.items():
                    problem = regex_problem(pattern)
                    if problem is not None:
                        r.error(keys[key].loc, f"{what}.match_re.{label}: {pattern!r} {problem}")
                        bad = True
            values[key] = m
    if "group_by" in keys and keys["group_by"].value is not None:
        values["group_by"] = _label_list(r, keys["group_by"], f"{what}.group_by")
        bad = bad or values["group_by"] is None
    for key in ("group_wait", "repeat_interval"):
        if key in keys and keys[key].value is not None:
            values[key] = _duration(r, keys[key], f"{what}.{key}", positive=key != "group_wait")
            bad = bad or values[key] is None
    if bad or receivers is None:
        return None
    return RouteConfig(receivers=receivers, **values)


def read_routing(
    r: Reader, node: Node | None, receivers: tuple[ReceiverConfig, ...]
) -> RoutingConfig:
    allowed = list(RoutingConfig.__dataclass_fields__)
    keys = _keys(r, node, allowed, "routing")
    known = {rc.name for rc in receivers}
    d = RoutingConfig()
    values: dict[str, Any] = {}
    if "receivers" in keys and keys["receivers"].value is not None:
        values["receivers"] = _receiver_refs(
            r, keys["receivers"], "routing.receivers", known, allow_empty=True
        )
    if "min_severity" in keys:
        values["min_severity"] = r.string(keys["min_severity"], "routing.min_severity", SEVERITIES)
    if "group_by" in keys:
        values["group_by"] = _label_list(r, keys["group_by"], "routing.group_by")
    if "group_wait" in keys:
        values["group_wait"] = _duration(r, keys["group_wait"], "routing.group_wait")
    for key in (
        "repeat_interval",
        "ticket_repeat_interval",
        "retry_initial",
        "retry_max",
        "give_up_after",
    ):
        if key in keys:
            values[key] = _duration(r, keys[key], f"routing.{key}", positive=True)
    if "queue_size" in keys:
        values["queue_size"] = r.integer(keys["queue_size"], "routing.queue_size", minimum=1)
    if "routes" in keys and keys["routes"].value is not None:
        items = r.sequence(keys["routes"], "routing.routes")
        routes = [
            _read_route(r, n, f"routing.routes[{i}]", known) for i, n in enumerate(items or [])
        ]
        values["routes"] = None if None in routes or items is None else tuple(routes)
    initial = values.get("retry_initial") or d.retry_initial
    maximum = values.get("retry_max") or d.retry_max
    if "retry_max" in keys and values.get("retry_max") is not None and maximum < initial:
        r.error(
            keys["retry_max"].loc, "routing.retry_max: must not be less than routing.retry_initial"
        )
    return RoutingConfig(**{k: v for k, v in {**_plain(d), **values}.items() if v is not None})


def _plain(d: Any) -> dict[str, Any]:
    return {name: getattr(d, name) for name in d.__dataclass_fields__}


# -- drain ---------------------------------------------------------------------------------
def _read_drain_sub(r: Reader, node: Node | None, cls: type, what: str) -> Any:
    d = cls()
    keys = _keys(r, node, [f.name for f in dataclasses.fields(cls)], what)
    values: dict[str, Any] = {}
    for key, value_node in keys.items():
        where = f"{what}.{key}"
        default = getattr(d, key)
        value: Any
        if key == "command":
            value = _strings(r, value_node, where, non_empty=True)
        elif isinstance(default, bool):
            value = r.boolean(value_node, where)
        elif key == "kubeconfig":
            value = None
            if value_node.value is not None:
                value = r.string(value_node, where)
                if value is not None and not value.startswith("/"):
                    r.error(value_node.loc, f"{where}: {value!r} is not an absolute path")
                    value = None
                if value is None:
                    continue
        elif key == "taint_effect":
            value = r.string(value_node, where, TAINT_EFFECTS)
        elif key == "taint_key":
            value = r.string(value_node, where)
            if value is not None and (len(value) > 316 or not _TAINT_KEY_RE.fullmatch(value)):
                r.error(value_node.loc, f"{where}: {value!r} is not a Kubernetes taint key")
                value = None
        elif key in ("event_namespace", "budget_namespace"):
            value = r.string(value_node, where)
            if value is not None and not _NAMESPACE_RE.fullmatch(value):
                r.error(value_node.loc, f"{where}: {value!r} is not a Kubernetes namespace name")
                value = None
        elif key == "condition_type":
            value = r.string(value_node, where)
            if value is not None and not _CONDITION_RE.fullmatch(value):
                r.error(value_node.loc, f"{where}: {value!r} is not a condition type (CamelCase)")
                value = None
        else:  # scontrol, sinfo: a program name or path
            value = r.string(value_node, where)
            if value is not None and (not value or any(c.isspace() for c in value)):
                r.error(value_node.loc, f"{where}: {value!r} is not a program name or path")
                value = None
        if value is not None:
            values[key] = value
    return cls(**{**_plain(d), **values})


def read_drain(r: Reader, node: Node | None) -> DrainConfig:
    allowed = list(DrainConfig.__dataclass_fields__)
    keys = _keys(r, node, allowed, "drain")
    d = DrainConfig()
    values: dict[str, Any] = {}
    for key, value_node in keys.items():
        where = f"drain.{key}"
        value: Any = None
        if key == "mode":
            value = r.string(value_node, where, DRAIN_MODES)
        elif key in ("dry_run", "resume"):
            value = r.boolean(value_node, where)
        elif key == "node":
            if value_node.value is None:
                continue
            value = r.string(value_node, where)
            if value is not None and (
                not value
                or len(value) > 253
                or any(not c.isprintable() or c.isspace() for c in value)
            ):
                r.error(value_node.loc, f"{where}: {value!r} is not a node name")
                value = None
        elif key in ("grace", "resume_hold"):
            value = _duration(r, value_node, where)
        elif key in ("window", "timeout", "hold_interval"):
            value = _duration(r, value_node, where, positive=True)
        elif key == "rule_grace":
            value = _rule_grace(r, value_node, where)
        elif key == "notify_command":
            value = _strings(r, value_node, where, non_empty=True)
        elif key == "state_file":
            if value_node.value is None:
                values[key] = None
                continue
            value = r.string(value_node, where)
            if value is not None and not value.startswith("/"):
                r.error(value_node.loc, f"{where}: {value!r} is not an absolute path")
                value = None
        elif key == "max_drains":
            value = r.integer(value_node, where, minimum=1)
        elif key == "attempts":
            value = r.integer(value_node, where, minimum=1, maximum=100)
        elif key == "exec":
            value = _read_drain_sub(r, value_node, ExecDrainConfig, where)
        elif key == "slurm":
            value = _read_drain_sub(r, value_node, SlurmDrainConfig, where)
        elif key == "kubernetes":
            value = _read_drain_sub(r, value_node, KubernetesDrainConfig, where)
        elif key == "fleet":
            value = _read_fleet(r, value_node, where)
        if value is not None:
            values[key] = value
    result = DrainConfig(**{**_plain(d), **values})
    if result.fleet.enabled and result.mode == "exec" and result.fleet.census is None:
        # the documented secure setup (exec through the root drain helper) has the budget:
        # the daemon counts with sinfo, the helper writes the claims (docs/fleet.md)
        result = replace(result, fleet=replace(result.fleet, census="slurm"))
    if result.fleet.census is not None and result.mode != "exec" and "fleet" in keys:
        r.error(
            keys["fleet"].loc,
            f"drain.fleet.census: only for drain.mode exec (mode {result.mode} counts by itself)",
        )
    if result.mode == "exec" and not result.exec.command and "mode" in keys:
        r.error(
            keys["mode"].loc,
            "drain.mode: 'exec' needs drain.exec.command (a list: program and arguments)",
        )
    return result


def _read_fleet(r: Reader, node: Node, what: str) -> FleetDrainConfig | None:
    keys = _keys(r, node, list(FleetDrainConfig.__dataclass_fields__), what)
    values: dict[str, Any] = {}
    for key, value_node in keys.items():
        where = f"{what}.{key}"
        value: Any = None
        if value_node.value is None and key in (
            "max_nodes",
            "max_percent",
            "partition",
            "selector",
            "window",
            "census",
        ):
            continue
        if key == "max_nodes":
            value = r.integer(value_node, where, minimum=1)
        elif key == "max_percent":
            value = r.number(value_node, where, minimum=0.01, maximum=100)
        elif key == "partition":
            value = r.string(value_node, where)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
                r.error(value_node.loc, f"{where}: {value!r} is not a Slurm partition name")
                value = None
        elif key == "selector":
            value = r.string(value_node, where)
            if value is not None and not _SELECTOR_RE.fullmatch(value):
                r.error(value_node.loc, f"{where}: {value!r} is not a Kubernetes label selector")
                value = None
        elif key in ("window", "recheck", "correlate"):
            value = _duration(r, value_node, where, positive=True)
        elif key == "jitter":
            value = _duration(r, value_node, where)
        elif key == "breaker":
            value = r.boolean(value_node, where)
        elif key == "census":
            value = r.string(value_node, where)
            if value is not None and value != "slurm":
                r.error(value_node.loc, f"{where}: {value!r} is not one of: slurm")
                value = None
        if value is not None:
            values[key] = value
    return FleetDrainConfig(**values)


def _rule_grace(r: Reader, node: Node, what: str) -> dict[str, float] | None:
    if node.value is None:
        return {}
    if not node.is_mapping():
        r.error(
            node.loc,
            f"{what}: expected a mapping of rule name to duration, got {type_name(node.value)}",
        )
        return None
    out: dict[str, float] = {}
    for key_node, value_node in node.items():
        seconds = _duration(r, value_node, f"{what}.{key_node.value}")
        if seconds is None:
            return None
        out[str(key_node.value)] = seconds
    return out


def parse_duration_text(text: str) -> float | None:
    """A duration as written in config (``5m``) or a number of seconds; ``None`` if bad."""
    from gpuwatchd.config.yamlsrc import parse_duration

    try:
        value = float(text)
    except ValueError:
        return parse_duration(text)
    return value if math.isfinite(value) and value >= 0 else None
