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
from gpuwatchd.core.secretforms import secret_forms

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
    """``text`` with each secret (in any of its ``secret_forms``) and every URL path
    replaced by ``<secret>``."""
    forms = {f for s in secrets if s for f in secret_forms(s)}
    for s in sorted(forms, key=len, reverse=True):
        text = text.replace(s, REDACTED)
    return _URL_RE.sub(lambda m: m.group(1) + ("/" + REDACTED if m.group(2) else ""), text)


_SECRET_QUERY_KEYS = ("token", "key", "secret", "password", "sig", "auth", "code")


def looks_like_token(text: str) -> bool:
    """A URL part that is a credential rather than a name: 20 characters or more, or 8 or
    more mixing letters and digits (``T0KEN-5ecret-77c1``, not ``gpuwatchd`` or ``drain``)."""
    if len(text) >= 20:
        return True
    return len(text) >= 8 and any(c.isdigit() for c in text) and any(c.isalpha() for c in text)


def url_secrets(url: str) -> list[str]:
    """The parts of a secret URL that must never show: itself; the path segments and query
    values that look like tokens, and every value of a query key that names a credential
    (``token=``, ``key=``...); and its path and query when they hold one of those. Plain
    words in a URL (``/hook``, ``gpuwatchd``) are not secrets: redacting them would hide
    harmless text elsewhere."""
    parts = urllib.parse.urlsplit(url)
    pieces = [seg for seg in parts.path.split("/") if looks_like_token(seg)]
    for key, value in urllib.parse.parse_qsl(parts.query):
        named = any(word in key.lower() for word in _SECRET_QUERY_KEYS)
        if len(value) >= 4 and (named or looks_like_token(value)):
            pieces.append(value)
    tail = parts.path + ("?" + parts.query if parts.query else "")
    # the path and query only when they hold a secret: "/hook" alone would hide
    # "/etc/gpuwatchd/drain/hook.sh" in every log line
    return [url, tail, *pieces] if pieces else [url]
