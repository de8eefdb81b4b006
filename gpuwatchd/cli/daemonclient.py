"""Talking to the running daemon's HTTP server from the command line (``status``, ``check``).

The address, the scheme and the trust anchor come from the same config the daemon reads:
``listen`` (a wildcard address becomes loopback), and ``web.config_file``: with
``tls_server_config`` the client speaks HTTPS and, unless ``--ca-file`` names a CA, trusts
exactly the certificate the daemon serves (its ``cert_file``, readable by root and the
service user): the certificate is pinned, so no host name check is needed. Basic auth
takes a user and a password file (the web config holds only bcrypt hashes); mutual TLS a
client certificate and key.

Whoever holds the port is not trusted for being there: a local user can bind it while the
daemon is down. An answer is believed, and a password sent, only when the listener is
proven to be the daemon (``DaemonClient``): by TLS, or on this host by the owner of the
listening socket. ``check`` and ``status`` ask the daemon's status socket first
(``statusclient``) and HTTP only when that is absent and ``web.ask_over_http`` says so.
"""

from __future__ import annotations

import argparse
import base64
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuwatchd.configfile.loader import Config

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
    """``GET`` from the daemon's HTTP server, believing only a listener proven to be it.

    Proof: TLS (the daemon's pinned certificate, or ``--ca-file``), or for plain HTTP on
    this host, the listening socket's owner (``peeruid``) being ``owner_uid``, the owner of
    the daemon's state directory. Credentials are sent only to a proven listener; with
    ``require_proof`` an unproven one is a ``DaemonError`` (``check``: cannot tell)."""

    base: str
    timeout: float = 5.0
    context: ssl.SSLContext | None = None
    authorization: str | None = None
    owner_uid: int | None = None
    require_proof: bool = True

    def get(self, path: str) -> tuple[int, bytes]:
        """Status and body of ``GET path``; any HTTP status is returned, not raised."""
        import http.client
        import ssl
        import urllib.parse

        parts = urllib.parse.urlsplit(self.base)
        tls = parts.scheme == "https"
        try:
            host, port = parts.hostname or "", parts.port or (443 if tls else 80)
        except ValueError as exc:
            raise DaemonError(f"{self.base}: {exc}") from None
        conn: http.client.HTTPConnection
        if tls:
            ctx = self.context or ssl.create_default_context()
            conn = http.client.HTTPSConnection(host, port, timeout=self.timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=self.timeout)
        try:
            try:
                conn.connect()  # with TLS, the handshake (the proof) happens here
            except (ssl.SSLError, ssl.CertificateError) as exc:
                raise DaemonError(f"TLS with {self.base} failed: {exc}") from None
            except (ConnectionRefusedError, FileNotFoundError) as exc:
                raise DaemonError(
                    f"cannot reach the daemon at {self.base}: {exc}", unreachable=True
                ) from None
            headers = {"Host": parts.netloc, "Connection": "close"}
            if tls or self._proven(conn):
                if self.authorization:
                    headers["Authorization"] = self.authorization
            elif self.require_proof:
                raise DaemonError(self._unproven(conn))
            conn.request("GET", parts.path.rstrip("/") + path, headers=headers)
            resp = conn.getresponse()
            return int(resp.status), _read_bounded(resp)
        except TimeoutError:
            raise DaemonError(
                f"the daemon at {self.base} did not answer in {self.timeout:g}s"
            ) from None
        except http.client.HTTPException as exc:
            raise DaemonError(f"{self.base} gave no valid HTTP answer: {exc!r}") from None
        except OSError as exc:
            raise DaemonError(f"cannot reach the daemon at {self.base}: {exc}") from None
        finally:
            conn.close()

    def _proven(self, conn: Any) -> bool:
        from gpuwatchd.cli.peeruid import peer_uid

        return self.owner_uid is not None and peer_uid(conn.sock) == self.owner_uid

    def _unproven(self, conn: Any) -> str:
        from gpuwatchd.cli.peeruid import peer_uid

        uid = peer_uid(conn.sock)
        who = "a process on another host" if uid is None else f"a process of uid {uid}"
        want = (
            "the owner of the daemon's state directory is unknown"
            if self.owner_uid is None
            else f"the daemon runs as uid {self.owner_uid}"
        )
        return (
            f"{self.base} is not proven to be the daemon: {who} listens there and {want} "
            "(without TLS only a listener on this host owned by the daemon's user is "
            "believed; no credentials were sent)"
        )

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
    args: argparse.Namespace,
    config: Config | None,
    environ: dict[str, str] | None = None,
    *,
    require_proof: bool = True,
) -> DaemonClient:
    """The client the options and the config describe. ``ValueError`` names what is wrong
    (an unreadable password file, a web config that does not load). The daemon's uid, for
    the proof over plain HTTP, is the owner of the config's state directory."""
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
    owner: int | None = None
    if config is not None:
        try:
            owner = os.stat(config.state_dir).st_uid
        except OSError:
            owner = None  # no state directory: no daemon has run here
    return DaemonClient(
        base,
        timeout=args.timeout,
        context=context,
        authorization=_authorization(args, env),
        owner_uid=owner,
        require_proof=require_proof,
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
