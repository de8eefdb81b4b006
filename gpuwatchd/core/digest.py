"""SHA-256 without OpenSSL, for fingerprints and keys.

``hashlib`` loads OpenSSL's libcrypto at import (about 3.7 MiB of a daemon's RSS, measured
against a bare pynvml process in docs/PERFORMANCE.md) even to hash a few bytes. CPython
ships its own SHA-256 (``_sha2`` from 3.12, ``_sha256`` before); the digest is the same, so
fingerprints stay stable whichever module computed them. ``hashlib`` is the fallback.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def _builtin_sha256() -> Callable[[bytes], Any]:
    for module in ("_sha2", "_sha256"):
        try:
            return importlib.import_module(module).sha256  # type: ignore[no-any-return]
        except (ImportError, AttributeError):
            continue
    import hashlib

    return hashlib.sha256


_SHA256 = _builtin_sha256()


def sha256(data: bytes) -> bytes:
    return bytes(_SHA256(data).digest())


def sha256_hex(data: bytes) -> str:
    return str(_SHA256(data).hexdigest())
