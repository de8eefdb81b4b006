"""What every receiver kind's config shares: the ``receivers`` list, the keys all kinds
have (``name``, ``type``, ``timeout``, ``send_resolved``) and the value readers several
kinds use (URLs, secret references, headers, severity labels).

A kind's own config type and reader live in its module (``actions/receivers/<kind>.py``)
and reach the list through a ``ReceiverReader``: its ``type``, its frozen config class,
how it reads its own keys and which keys it needs together. The whole-config loader hands
``read_receivers`` the registry's readers, so nothing here names a kind. Every problem is
reported as ``PATH:LINE:COL: message``; a secret given inline (``url``, ``routing_key``,
``hmac_secret``) is never echoed: errors about it name the key, not the value.
"""

from __future__ import annotations

import builtins
import dataclasses
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuwatchd.config.actions import SEVERITIES, _duration, _string_map
from gpuwatchd.config.yamlsrc import Node, Reader, type_name

DEFAULT_SEVERITY_LABELS: dict[str, str] = {"page": "critical", "ticket": "warning", "info": "info"}
"""The ``severity`` label Alertmanager and webhook receivers see for each gpuwatchd severity
(Alertmanager's and most routing trees' convention); ``severity_labels`` changes it."""

_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_CREDENTIAL_RE = re.compile(r"[A-Za-z0-9_.@-]{1,255}")
HEADER_RE = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SEVERITY_VALUE_RE = re.compile(r"[A-Za-z0-9_.-]{1,63}")
# Headers gpuwatchd sets itself; a configured header must not replace them.
_RESERVED_HEADERS = {"content-type", "content-length", "host", "idempotency-key"}


class ReceiverConfig(Protocol):
    """A configured receiver of any kind (each kind's frozen dataclass has these keys)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> str: ...

    @property
    def timeout(self) -> float: ...

    @property
    def send_resolved(self) -> bool: ...


def secret() -> Any:
    """A dataclass field holding a secret: never shown by ``as_plain``."""
    return field(default=None, metadata={"secret": True})


KeyReader = Callable[[Reader, str, Node, str], Any]
"""``(reader, key, value node, where)`` -> the value, or ``None`` after recording a problem."""
KeysCheck = Callable[[Reader, Node, dict[str, Node], str], None]
"""``(reader, receiver node, its keys, where)``: rules between keys (one of two is given)."""


@dataclass(frozen=True)
class ReceiverReader:
    """How the ``receivers`` list reads one kind: its ``type``, its config class, its own
    keys (``read_key``; the shared ones go to ``common_key``) and ``check``."""

    type: str
    config: builtins.type[Any]
    read_key: KeyReader
    check: KeysCheck


def read_receivers(
    r: Reader, node: Node | None, readers: Mapping[str, ReceiverReader]
) -> tuple[ReceiverConfig, ...]:
    """The ``receivers`` list; ``readers`` maps each ``type`` to its kind's reader."""
    if node is None or node.value is None:
        return ()
    items = r.sequence(node, "receivers")
    out: list[ReceiverConfig] = []
    seen: set[str] = set()
    for i, item in enumerate(items or []):
        what = f"receivers[{i}]"
        rc = _read_receiver(r, item, what, readers)
        if rc is None:
            continue
        if rc.name in seen:
            name_node = item.get("name")
            r.error((name_node or item).loc, f"{what}.name: {rc.name!r} is used twice")
            continue
        seen.add(rc.name)
        out.append(rc)
    return tuple(out)


def _read_receiver(
    r: Reader, node: Node, what: str, readers: Mapping[str, ReceiverReader]
) -> ReceiverConfig | None:
    if not node.is_mapping():
        r.error(node.loc, f"{what}: expected a mapping, got {type_name(node.value)}")
        return None
    type_node = node.get("type")
    if type_node is None:
        r.error(node.loc, f"{what}: missing required key 'type' ({', '.join(readers)})")
        return None
    kind = r.string(type_node, f"{what}.type", tuple(readers))
    if kind is None:
        return None
    reader = readers[kind]
    allowed = [f.name for f in dataclasses.fields(reader.config)]
    keys = r.mapping(node, allowed, f"{what} ({kind})", required=("name",))
    if keys is None:
        return None
    # An explicit null means "not set" (what `check-config --print` writes for unset keys).
    keys = {k: v for k, v in keys.items() if v.value is not None or k in ("name", "type")}
    values: dict[str, Any] = {}
    bad = "name" not in keys
    if "name" in keys:
        values["name"] = _read_name(r, keys["name"], f"{what}.name")
        bad = values["name"] is None
    for key, value_node in keys.items():
        if key in ("name", "type"):
            continue
        value = reader.read_key(r, key, value_node, f"{what}.{key}")
        if value is None:
            bad = True
        else:
            values[key] = value
    reader.check(r, node, keys, what)
    if bad:
        return None
    result: ReceiverConfig = reader.config(type=kind, **values)
    return result


def _read_name(r: Reader, node: Node, what: str) -> str | None:
    name = r.string(node, what)
    if name is not None and not _NAME_RE.fullmatch(name):
        r.error(
            node.loc,
            f"{what}: {name!r} is not a receiver name "
            "(letters, digits, '_', '.', '-'; at most 63; starts with a letter or digit)",
        )
        return None
    return name


def common_key(r: Reader, key: str, node: Node, where: str) -> Any:
    """The keys every kind has (``timeout``, ``send_resolved``) and the ones several share
    (``severity_labels``, ``external_url``)."""
    if key == "timeout":
        return duration(r, node, where, positive=True)
    if key == "send_resolved":
        return r.boolean(node, where)
    if key == "severity_labels":
        return read_severity_labels(r, node, where)
    if key == "external_url":
        value = http_url(r, node, where, secret=False)
        return value.rstrip("/") if value else None
    raise AssertionError(key)  # pragma: no cover - a kind's fields are all read


def duration(r: Reader, node: Node, what: str, *, positive: bool = False) -> float | None:
    """A finite duration (``30s``, ``5m``); ``positive``: more than 0s."""
    return _duration(r, node, what, positive=positive)


def http_url(r: Reader, node: Node, what: str, *, secret: bool) -> str | None:
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


def is_secret_ref(text: str) -> bool:
    return text.startswith("/") or bool(_CREDENTIAL_RE.fullmatch(text))


def secret_ref(r: Reader, node: Node, what: str) -> str | None:
    """An absolute file path, or the name of a systemd credential (no ``/``)."""
    text = r.string(node, what)
    if text is None:
        return None
    if is_secret_ref(text):
        return text
    r.error(
        node.loc,
        f"{what}: {text!r} is neither an absolute path nor a credential name "
        "(a file in $CREDENTIALS_DIRECTORY: letters, digits, '_', '.', '@', '-')",
    )
    return None


def inline_secret(r: Reader, node: Node, what: str) -> str | None:
    value = node.value if isinstance(node.value, str) else None
    if value is None or not value.strip():
        r.error(node.loc, f"{what}: expected a non-empty string")
        return None
    return value.strip()


def one_of(
    r: Reader, node: Node, keys: dict[str, Node], inline: str, file_key: str, what: str
) -> None:
    """Exactly one of ``inline`` and ``file_key`` must be given."""
    if inline in keys and file_key in keys:
        r.error(keys[file_key].loc, f"{what}: give either {inline!r} or {file_key!r}, not both")
    elif inline not in keys and file_key not in keys:
        r.error(node.loc, f"{what}: missing {inline!r} or {file_key!r}")


def headers(r: Reader, node: Node, what: str) -> dict[str, str] | None:
    """A mapping of HTTP header name to value; gpuwatchd's own headers are refused."""
    value = _string_map(r, node, what, HEADER_RE, "an HTTP header name")
    if value is None:
        return None
    for name in value:
        if name.lower() in _RESERVED_HEADERS:
            r.error(node.loc, f"{what}: {name!r} is set by gpuwatchd and cannot be configured")
            return None
    return value


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
