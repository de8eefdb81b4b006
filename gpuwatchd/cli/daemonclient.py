"""Talking to the running daemon's HTTP server from the command line (``status``, ``check``).

The address, the scheme and the trust anchor come from the same config the daemon reads:
``listen`` (a wildcard address becomes loopback), and ``web.config_file``: with
``tls_server_config`` the client speaks HTTPS and, unless ``--ca-file`` names a CA, trusts
exactly the certificate the daemon serves (its ``cert_file``, readable by root and the
service user): the certificate is pinned, so no host name check is needed. Basic auth
takes a user and a password file (the web config holds only bcrypt hashes); mutual TLS a
client certificate and key.
"""

from __future__ import annotations

import argparse
import base64
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuwatchd.config.loader import Config

if TYPE_CHECKING:  # ssl and urllib load only when the daemon is really asked
    import ssl

__all__ = ["DaemonClient", "DaemonError", "add_client_arguments", "client_from_args"]

PASSWORD_ENV = "GPUWATCHD_PASSWORD_FILE"
USER_ENV = "GPUWATCHD_USER"
MAX_BODY = 16 << 20  # a status or metrics answer is far smaller; a bigger one is refused


class DaemonError(Exception):
    """The daemon could not be asked. ``unreachable``: nothing listens there (no daemon);
    otherwise it answered, but not usefully (TLS, auth, HTTP status)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


@dataclass(frozen=True)
class DaemonClient:
    base: str
    timeout: float = 5.0
    context: ssl.SSLContext | None = None
    authorization: str | None = None

    def get(self, path: str) -> tuple[int, bytes]:
        """Status and body of ``GET path``; any HTTP status is returned, not raised."""
        import ssl
        import urllib.error
        import urllib.request

        request = urllib.request.Request(self.base + path, method="GET")
        if self.authorization:
            request.add_header("Authorization", self.authorization)
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self.context
            ) as resp:
                return int(resp.status), _read_bounded(resp)
        except urllib.error.HTTPError as exc:
            with exc:
                return int(exc.code), _read_bounded(exc)
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError | ssl.CertificateError):
                raise DaemonError(f"TLS with {self.base} failed: {reason}") from None
            refused = isinstance(reason, ConnectionRefusedError | FileNotFoundError)
            raise DaemonError(
                f"cannot reach the daemon at {self.base}: {reason}", unreachable=refused
            ) from None
        except TimeoutError:
            raise DaemonError(
                f"the daemon at {self.base} did not answer in {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise DaemonError(f"cannot reach the daemon at {self.base}: {exc}") from None

    def get_ok(self, path: str) -> bytes:
        """Body of ``GET path``; ``DaemonError`` unless the answer is 200."""
        status, body = self.get(path)
        if status == 401:
            raise DaemonError(
                f"the daemon at {self.base} wants credentials (HTTP 401): give --user and "
                f"--password-file (or ${USER_ENV} and ${PASSWORD_ENV})"
            )
        if status != 200:
            text = body.decode("utf-8", "replace").strip()[:200]
            raise DaemonError(f"GET {path} from {self.base}: HTTP {status} {text}".rstrip())
        return body


def _read_bounded(resp: object) -> bytes:
    read = resp.read  # type: ignore[attr-defined]  # HTTPResponse and HTTPError alike
    body: bytes = read(MAX_BODY + 1)
    if len(body) > MAX_BODY:
        raise DaemonError(f"answer larger than {MAX_BODY} bytes")
    return body


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    """The options every command that asks the daemon takes."""
    p.add_argument(
        "--url", help="daemon base URL (default: from the config's listen and web.config_file)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait (default 5)")
    p.add_argument("--user", help=f"basic auth user (default ${USER_ENV})")
    p.add_argument(
        "--password-file",
        metavar="FILE",
        help=f"file holding the basic auth password (default ${PASSWORD_ENV})",
    )
    p.add_argument(
        "--ca-file",
        metavar="FILE",
        help="CA certificate(s) to verify the daemon with (default: with TLS on, trust the "
        "certificate the daemon serves, read from the web config)",
    )
    p.add_argument("--cert", metavar="FILE", help="client certificate (mutual TLS)")
    p.add_argument("--key", metavar="FILE", help="client key (mutual TLS)")


def _base_from_config(config: Config, tls: bool) -> str:
    host = config.listen.host
    if host in ("", "0.0.0.0"):  # a wildcard listen address: ask over loopback
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    host = f"[{host}]" if ":" in host else host
    return f"{'https' if tls else 'http'}://{host}:{config.listen.port}"


def client_from_args(
    args: argparse.Namespace, config: Config | None, environ: dict[str, str] | None = None
) -> DaemonClient:
    """The client the options and the config describe. ``ValueError`` names what is wrong
    (an unreadable password file, a web config that does not load)."""
    env = dict(os.environ) if environ is None else environ
    tls_cert: str | None = None
    if config is not None and config.web.config_file:
        from gpuwatchd.config.web import load_web_config
        from gpuwatchd.core.errors import ConfigError

        try:
            web = load_web_config(config.web.config_file)
        except ConfigError as exc:
            raise ValueError("; ".join(exc.lines())) from None
        if web.tls is not None:
            tls_cert = web.tls.cert_file
    if args.url:
        base = args.url.rstrip("/")
    elif config is not None:
        base = _base_from_config(config, tls_cert is not None)
    else:
        raise ValueError("no --url and no config to find the daemon with")
    context = None
    if base.startswith("https://"):
        context = _tls_context(args.ca_file, tls_cert, args.cert, args.key)
    return DaemonClient(
        base, timeout=args.timeout, context=context, authorization=_authorization(args, env)
    )


def _tls_context(
    ca_file: str | None, pinned: str | None, cert: str | None, key: str | None
) -> ssl.SSLContext:
    import ssl

    try:
        if ca_file:
            ctx = ssl.create_default_context(cafile=ca_file)
        elif pinned:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            ctx.load_verify_locations(cafile=pinned)
            ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # the leaf itself is the anchor
            ctx.check_hostname = False  # pinned: only that exact certificate is accepted
        else:
            ctx = ssl.create_default_context()
        if cert:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"TLS client setup: {exc}") from None
    return ctx


def _authorization(args: argparse.Namespace, env: dict[str, str]) -> str | None:
    user = args.user or env.get(USER_ENV)
    password_file = args.password_file or env.get(PASSWORD_ENV)
    if not user and not password_file:
        return None
    if not user or not password_file:
        raise ValueError("basic auth needs both a user and a password file")
    try:
        with open(password_file, encoding="utf-8") as f:
            password = f.read(4096).rstrip("\r\n")
    except OSError as exc:
        raise ValueError(
            f"cannot read the password file {password_file}: {exc.strerror or exc}"
        ) from None
    token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
    return f"Basic {token}"
