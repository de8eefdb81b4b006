"""The web configuration file of Prometheus exporters (exporter-toolkit format), and the
guards of the HTTP server: TLS, basic auth with bcrypt hashes, response headers, and a
request rate limit.

The file is the one node_exporter and dcgm-exporter read with ``--web.config.file``::

    tls_server_config:
      cert_file: /etc/gpuwatchd/tls/server.crt
      key_file: /etc/gpuwatchd/tls/server.key
      client_auth_type: RequireAndVerifyClientCert   # optional: mutual TLS
      client_ca_file: /etc/gpuwatchd/tls/ca.crt
      min_version: TLS12
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...                          # htpasswd -nBC 10 "" | tr -d ':\\n'
    rate_limit: {interval: 20ms, burst: 100}

Differences from exporter-toolkit (refused with a message when used, never silently
ignored): certificates and keys are read from files only (``cert:``/``key:`` inline are
refused; ``client_ca:`` inline works), ``cipher_suites``, ``curve_preferences`` and
``client_allowed_sans`` are not supported, and ``RequestClientCert`` /
``RequireAnyClientCert`` (unverified client certificates) are refused. The rate limit
applies per client address, not to all clients together, so one noisy client cannot lock
Prometheus out. ``http2`` and ``prefer_server_cipher_suites`` are accepted and have no
effect (the server speaks HTTP/1.1; OpenSSL's server preference is used).

Secrets (bcrypt hashes, key files) never appear in a log line or an error message.
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwatchd.config import yamlsrc
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.errors import ConfigError, Location

if TYPE_CHECKING:
    import ssl

log = logging.getLogger(__name__)

__all__ = [
    "BasicAuth",
    "RateLimiter",
    "TlsSettings",
    "WebConfig",
    "WebGuard",
    "load_web_config",
]

# Names only: ssl (4 MiB of RSS with OpenSSL) is imported when a context is built, so a
# daemon without TLS never loads it. ``TlsSettings.context`` maps them to ssl's values.
TLS_VERSIONS = {"TLS10": "TLSv1", "TLS11": "TLSv1_1", "TLS12": "TLSv1_2", "TLS13": "TLSv1_3"}
CLIENT_AUTH = {
    "NoClientCert": "CERT_NONE",
    "VerifyClientCertIfGiven": "CERT_OPTIONAL",
    "RequireAndVerifyClientCert": "CERT_REQUIRED",
}
_UNSUPPORTED_AUTH = ("RequestClientCert", "RequireAnyClientCert")
_TLS_KEYS = (
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
)
_NOT_SUPPORTED = {
    "cert": "inline certificates are not supported: use cert_file",
    "key": "inline keys are not supported: use key_file (a file only the daemon can read)",
    "cipher_suites": "not supported by gpuwatchd (OpenSSL's defaults for the TLS versions "
    "allowed are used)",
    "curve_preferences": "not supported by gpuwatchd (OpenSSL's defaults are used)",
    "client_allowed_sans": "not supported by gpuwatchd",
}
_HEADERS = (
    "Content-Security-Policy",
    "X-Frame-Options",
    "X-Content-Type-Options",
    "X-XSS-Protection",
    "Strict-Transport-Security",
)
AUTH_CACHE_SIZE = 1024
LIMITER_CLIENTS = 4096


@dataclass(frozen=True)
class TlsSettings:
    cert_file: str
    key_file: str
    client_auth: str = "NoClientCert"  # a CLIENT_AUTH key
    client_ca_file: str | None = None
    client_ca: str | None = None
    min_version: str = "TLS12"  # TLS_VERSIONS keys
    max_version: str = "TLS13"

    def context(self) -> ssl.SSLContext:
        """A server context; ``OSError`` (``ssl.SSLError`` is one) when a file does not load."""
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion[TLS_VERSIONS[self.min_version]]
        ctx.maximum_version = ssl.TLSVersion[TLS_VERSIONS[self.max_version]]
        ctx.load_cert_chain(self.cert_file, self.key_file)
        verify = ssl.VerifyMode[CLIENT_AUTH[self.client_auth]]
        if verify is not ssl.CERT_NONE:
            if self.client_ca_file:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            if self.client_ca:
                ctx.load_verify_locations(cadata=self.client_ca)
        ctx.verify_mode = verify
        return ctx


@dataclass(frozen=True)
class WebConfig:
    """What a web-config file asks for. An empty file asks for nothing."""

    tls: TlsSettings | None = None
    headers: tuple[tuple[str, str], ...] = ()
    users: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # (name, bcrypt hash)
    rate_interval: float | None = None  # seconds between requests; 0 disables the limit
    rate_burst: int | None = None


def _is_bcrypt(text: str) -> bool:
    parts = text.split("$")
    return (
        len(parts) == 4
        and parts[0] == ""
        and parts[1] in ("2a", "2b", "2y")
        and parts[2].isdigit()
        and len(parts[3]) == 53
    )


def _read_tls(r: Reader, node: Node, base_dir: str) -> TlsSettings | None:
    keys = r.mapping(node, list(_TLS_KEYS), "tls_server_config")
    if keys is None:
        return None
    for name, message in _NOT_SUPPORTED.items():
        if name in keys and keys[name].value not in (None, [], ""):
            r.error(keys[name].loc, f"tls_server_config.{name}: {message}")

    def path(name: str) -> str | None:
        n = keys.get(name)
        if n is None or n.value is None:
            return None
        text = r.string(n, f"tls_server_config.{name}")
        if text is None:
            return None
        full = text if os.path.isabs(text) else os.path.join(base_dir, text)
        if not os.path.isfile(full):
            r.error(n.loc, f"tls_server_config.{name}: {full}: no such file")
            return None
        return full

    cert, key, ca_file = path("cert_file"), path("key_file"), path("client_ca_file")
    auth = "NoClientCert"
    if "client_auth_type" in keys:
        n = keys["client_auth_type"]
        text = r.string(n, "tls_server_config.client_auth_type")
        if text in _UNSUPPORTED_AUTH:
            r.error(
                n.loc,
                f"tls_server_config.client_auth_type: {text} accepts certificates nobody "
                "verified; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven)",
            )
        elif text is not None and text not in CLIENT_AUTH:
            r.error(
                n.loc,
                f"tls_server_config.client_auth_type: {text!r} is not one of "
                f"{', '.join(CLIENT_AUTH)}",
            )
        elif text is not None:
            auth = text
    ca_inline = None
    if "client_ca" in keys and keys["client_ca"].value is not None:
        ca_inline = r.string(keys["client_ca"], "tls_server_config.client_ca")
    if auth != "NoClientCert" and ca_file is None and not ca_inline:
        r.error(
            node.loc,
            "tls_server_config: client_auth_type verifies client certificates, so it needs "
            "client_ca_file (or client_ca)",
        )
    versions: dict[str, str] = {}
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        vnode = keys.get(name)
        text = default if vnode is None else r.string(vnode, f"tls_server_config.{name}")
        if text is None:
            continue
        if text not in TLS_VERSIONS:
            assert vnode is not None
            r.error(
                vnode.loc,
                f"tls_server_config.{name}: {text!r} is not one of {', '.join(TLS_VERSIONS)}",
            )
            continue
        versions[name] = text
    for name in ("prefer_server_cipher_suites",):
        if name in keys:
            r.boolean(keys[name], f"tls_server_config.{name}")
    if cert is None and "cert_file" not in keys:
        r.error(node.loc, "tls_server_config: cert_file is required")
    if key is None and "key_file" not in keys:
        r.error(node.loc, "tls_server_config: key_file is required")
    if cert is None or key is None or r.problems:
        return None
    tls = TlsSettings(
        cert,
        key,
        auth,
        ca_file,
        ca_inline,
        versions.get("min_version", "TLS12"),
        versions.get("max_version", "TLS13"),
    )
    try:
        tls.context()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or type(exc)
        r.error(node.loc, f"tls_server_config: the certificate, key or CA does not load: {reason}")
        return None
    return tls


def parse_web_config(root: Node | None, path: str) -> WebConfig:
    """Validate a parsed web-config document; ``ConfigError`` lists every problem."""
    r = Reader()
    if root is None or root.value is None:
        return WebConfig()
    keys = r.mapping(
        root, ["tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"], path
    )
    if keys is None:
        r.raise_if_any()
        return WebConfig()
    base_dir = os.path.dirname(os.path.abspath(path))
    tls = None
    if "tls_server_config" in keys and keys["tls_server_config"].value is not None:
        tls = _read_tls(r, keys["tls_server_config"], base_dir)
    headers: list[tuple[str, str]] = []
    if "http_server_config" in keys and keys["http_server_config"].value is not None:
        hsc = r.mapping(keys["http_server_config"], ["http2", "headers"], "http_server_config")
        if hsc and "http2" in hsc:
            r.boolean(hsc["http2"], "http_server_config.http2")
        if hsc and "headers" in hsc and hsc["headers"].value is not None:
            h = r.mapping(hsc["headers"], list(_HEADERS), "http_server_config.headers") or {}
            for name, n in h.items():
                text = r.string(n, f"http_server_config.headers.{name}")
                if text is not None and any(c in text for c in "\r\n\0"):
                    r.error(n.loc, f"http_server_config.headers.{name}: control characters")
                elif text:
                    headers.append((name, text))
    users: list[tuple[str, str]] = []
    if "basic_auth_users" in keys and keys["basic_auth_users"].value is not None:
        table = keys["basic_auth_users"]
        if not table.is_mapping():
            r.error(table.loc, "basic_auth_users: expected a mapping of user name to bcrypt hash")
        for key_node, value_node in table.items():
            name = str(key_node.value)
            if not name or ":" in name or not name.isprintable():
                r.error(key_node.loc, "basic_auth_users: a user name is empty or has ':'")
                continue
            if not isinstance(value_node.value, str) or not _is_bcrypt(value_node.value):
                # never echo the value: it may be a password written in by mistake
                r.error(
                    value_node.loc,
                    f"basic_auth_users.{name}: not a bcrypt hash ($2y$10$...); make one with "
                    "htpasswd -nBC 10 \"\" | tr -d ':\\n'",
                )
                continue
            users.append((name, value_node.value))
        if users:
            try:
                import bcrypt  # noqa: F401
            except ImportError:
                r.error(
                    table.loc,
                    "basic_auth_users: needs the bcrypt module (Debian: python3-bcrypt)",
                )
    interval: float | None = None
    burst: int | None = None
    if "rate_limit" in keys and keys["rate_limit"].value is not None:
        rl = r.mapping(keys["rate_limit"], ["interval", "burst"], "rate_limit") or {}
        if "interval" in rl:
            interval = r.duration(rl["interval"], "rate_limit.interval")
        if "burst" in rl:
            burst = r.integer(rl["burst"], "rate_limit.burst", minimum=1, maximum=1_000_000)
    r.raise_if_any()
    return WebConfig(tls, tuple(headers), tuple(users), interval, burst)


def load_web_config(path: str) -> WebConfig:
    """Read and validate a web-config file; ``ConfigError`` (``PATH:LINE:COL``) if bad."""
    if not os.path.isfile(path):
        raise ConfigError.at(Location(path, 1, 1), "web config file: no such file")
    return parse_web_config(yamlsrc.load_file(path), path)


# -- guards ------------------------------------------------------------------------------
class RateLimiter:
    """A token bucket per client address: ``burst`` requests at once, then one per
    ``interval``. ``interval`` 0 turns it off."""

    def __init__(self, interval: float, burst: int, clock: Any = time.monotonic) -> None:
        self.interval = interval
        self.burst = max(1, burst)
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def allow(self, client: str) -> float:
        """0 when the request may go ahead, else the seconds until it could."""
        if self.interval <= 0:
            return 0.0
        now = self._clock()
        with self._lock:
            tokens, last = self._buckets.pop(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - last) / self.interval)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) * self.interval
            self._buckets[client] = (tokens, now)
            while len(self._buckets) > LIMITER_CLIENTS:
                self._buckets.popitem(last=False)
            return wait


PASSWORD_CHECKS_PER_SECOND = 4.0
"""Uncached bcrypt checks per second for all clients together (each costs tens of ms)."""
PASSWORD_CHECK_BURST = 8
"""Uncached bcrypt checks allowed at once before the per-second budget applies."""


class PasswordChecksBusy(Exception):
    """The global budget of bcrypt checks is spent; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float) -> None:
        super().__init__(f"password checks busy; retry in {retry_after:.1f}s")
        self.retry_after = retry_after


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, caching results like
    exporter-toolkit does (a bcrypt check costs tens of milliseconds by design). The cache
    key is a SHA-256 of user, password and hash: no password is kept. Accepted and refused
    credentials are cached apart (each at most ``AUTH_CACHE_SIZE``, least recently used
    out first), so any number of wrong passwords can never evict the scraper's right one
    and make it wait for the bcrypt budget that the guessers spend (issue 26).

    Uncached checks are bounded for the whole server, not per client address: one at a
    time, at most ``PASSWORD_CHECK_BURST`` at once and ``PASSWORD_CHECKS_PER_SECOND``
    after that. Wrong passwords from many addresses therefore cost at most a fraction of
    one core; a scraper whose (correct) password is cached is never slowed. Past the budget
    ``check`` raises ``PasswordChecksBusy`` (the server answers 429)."""

    def __init__(
        self, users: tuple[tuple[str, str], ...], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.users = dict(users)
        self._good: OrderedDict[bytes, None] = OrderedDict()  # accepted credentials
        self._bad: OrderedDict[bytes, None] = OrderedDict()  # refused ones
        self._lock = threading.Lock()
        self._dummy: bytes | None = None
        self._budget = RateLimiter(1.0 / PASSWORD_CHECKS_PER_SECOND, PASSWORD_CHECK_BURST, clock)
        self._one_at_a_time = threading.Lock()
        self.checks_run = 0  # uncached bcrypt checks done
        self.checks_refused = 0  # uncached checks refused for the budget

    @property
    def enabled(self) -> bool:
        return bool(self.users)

    def check(self, header: str | None) -> tuple[bool, str | None]:
        """(allowed, user name as sent or None)."""
        if not self.users:
            return True, None
        if not header or header[:6].lower() != "basic ":
            return False, None
        try:
            raw = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return False, None
        user, sep, password = raw.partition(":")
        if not sep:
            return False, None
        hashed = self.users.get(user)
        import hashlib  # only with users configured: hashlib loads OpenSSL (3.7 MiB of RSS)

        key = hashlib.sha256(
            b"\0".join([user.encode(), password.encode(), (hashed or "").encode()])
        ).digest()
        with self._lock:
            for cache, verdict in ((self._good, True), (self._bad, False)):
                if key in cache:
                    cache.move_to_end(key)
                    return verdict, user
        wait = self._budget.allow("all")
        if wait > 0:
            with self._lock:
                self.checks_refused += 1
            raise PasswordChecksBusy(wait)
        if not self._one_at_a_time.acquire(timeout=1.0):
            with self._lock:
                self.checks_refused += 1
            raise PasswordChecksBusy(1.0)
        try:
            ok = self._bcrypt(password, hashed)
        finally:
            self._one_at_a_time.release()
        with self._lock:
            self.checks_run += 1
            cache = self._good if ok else self._bad
            cache[key] = None
            while len(cache) > AUTH_CACHE_SIZE:
                cache.popitem(last=False)
        return ok, user

    def _bcrypt(self, password: str, hashed: str | None) -> bool:
        import bcrypt

        if hashed is None:  # same cost as a real check: user names cannot be probed by time
            if self._dummy is None:
                self._dummy = bcrypt.hashpw(b"gpuwatchd", bcrypt.gensalt(rounds=10))
            bcrypt.checkpw(password.encode(), self._dummy)
            return False
        try:
            return bool(bcrypt.checkpw(password.encode(), hashed.encode()))
        except ValueError:
            return False


class WebGuard:
    """The live web configuration: re-read when the file changes (checked at most once a
    second), like exporter-toolkit. A file that no longer loads keeps the last good one
    and logs why. Turning TLS on or off takes a restart."""

    def __init__(
        self,
        path: str | None,
        *,
        rate_interval: float,
        rate_burst: int,
        max_request_bytes: int,
    ) -> None:
        self.path = path
        self.max_request_bytes = max_request_bytes
        self._default_rate = (rate_interval, rate_burst)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._checked = 0.0
        self.config = WebConfig()
        self.auth = BasicAuth(())
        self.limiter = RateLimiter(rate_interval, rate_burst)
        self.ssl_context: ssl.SSLContext | None = None
        self.reload_failures = 0
        if path is not None:
            self._apply(load_web_config(path), self._file_stamp())
            if self.config.tls is not None:
                self.ssl_context = self.config.tls.context()

    @property
    def tls(self) -> bool:
        return self.ssl_context is not None

    def _file_stamp(self) -> tuple[int, int, int] | None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def _apply(self, cfg: WebConfig, stamp: tuple[int, int, int] | None) -> None:
        self.config = cfg
        self.auth = BasicAuth(cfg.users)
        interval, burst = self._default_rate
        if cfg.rate_interval is not None or cfg.rate_burst is not None:
            interval = cfg.rate_interval if cfg.rate_interval is not None else interval
            burst = cfg.rate_burst if cfg.rate_burst is not None else burst
        self.limiter = RateLimiter(interval, burst)
        self._stamp = stamp

    def refresh(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._checked < 1.0:
                return
            self._checked = now
            stamp = self._file_stamp()
            if stamp == self._stamp:
                return
            try:
                cfg = load_web_config(self.path)
                new_ctx = cfg.tls.context() if cfg.tls is not None else None
            except ConfigError as exc:
                self.reload_failures += 1
                self._stamp = stamp
                for line in exc.lines():
                    log.error("web config: %s", line)
                log.error("web config: keeping the previous settings")
                return
            except OSError as exc:  # ssl.SSLError included
                self.reload_failures += 1
                self._stamp = stamp
                log.error("web config: TLS files do not load (%s); keeping the previous ones", exc)
                return
            if (new_ctx is None) != (self.ssl_context is None):
                log.warning("web config: turning TLS on or off takes a restart")
                new_ctx = self.ssl_context
            self._apply(cfg, stamp)
            if new_ctx is not None:
                self.ssl_context = new_ctx
            log.info("web config: reloaded %s", self.path)
