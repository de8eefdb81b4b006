"""Secrets for receivers: read from a file or a systemd credential, never shown.

A reference is an absolute path, or a bare name looked up in ``$CREDENTIALS_DIRECTORY``
(systemd's ``LoadCredential=NAME:PATH`` puts the file there). The value is the file's
content with surrounding whitespace removed. ``redact`` replaces every secret (and any
URL's path and query, where tokens live) in text bound for logs, metrics or status.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping

from gpuwatchd.core.errors import GpuwatchdError

REDACTED = "<secret>"
_URL_RE = re.compile(r"(https?://[^/\s'\"]+)(/[^\s'\"]*)?")


class SecretError(GpuwatchdError):
    """A secret could not be read (missing file, no credentials directory, empty)."""


def read_secret(ref: str, environ: Mapping[str, str] | None = None, *, what: str) -> str:
    env = os.environ if environ is None else environ
    if ref.startswith("/"):
        path = ref
    else:
        creds = env.get("CREDENTIALS_DIRECTORY")
        if not creds:
            raise SecretError(
                f"{what}: {ref!r} names a systemd credential, but $CREDENTIALS_DIRECTORY is "
                "not set (add LoadCredential= to the unit, or give an absolute path)"
            )
        path = os.path.join(creds, ref)
    try:
        with open(path, encoding="utf-8") as fh:
            value = fh.read().strip()
    except OSError as exc:
        raise SecretError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    if not value:
        raise SecretError(f"{what}: {path} is empty")
    return value


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with each secret and every URL path replaced by ``<secret>``."""
    for s in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return _URL_RE.sub(lambda m: m.group(1) + ("/" + REDACTED if m.group(2) else ""), text)


def url_secrets(url: str) -> list[str]:
    """The parts of a secret URL that must never show: itself, its path and query, and
    the path segments and query values that look like tokens (8 characters or more)."""
    parts = urllib.parse.urlsplit(url)
    out = [url]
    tail = parts.path + ("?" + parts.query if parts.query else "")
    if len(tail) > 1:
        out.append(tail)
    out.extend(seg for seg in parts.path.split("/") if len(seg) >= 8)
    out.extend(v for _, v in urllib.parse.parse_qsl(parts.query) if len(v) >= 4)
    return out
