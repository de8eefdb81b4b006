"""The forms a secret can take in text: as configured, percent-decoded, percent-encoded.

A receiver that echoes the URL it was sent may echo it decoded (``%2B`` -> ``+``) or
encoded; redaction that only knows the configured string would let those through.
"""

from __future__ import annotations

import urllib.parse

MIN_SECRET_CHARS = 4
"""Shorter forms are not redacted: they would hide harmless text everywhere."""


def secret_forms(value: str) -> set[str]:
    """``value`` and its percent-decoded (``+`` as a space too) and percent-encoded forms."""
    forms = {
        value,
        urllib.parse.unquote(value),
        urllib.parse.unquote_plus(value),
        urllib.parse.quote(value, safe=""),
        urllib.parse.quote_plus(value, safe=""),
    }
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}
