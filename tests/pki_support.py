"""A throw-away PKI, bcrypt hashes and an HTTPS client for the web guard's tests
(tests/exposition/test_abuse_http.py, tests/cli/test_cli_check.py)."""

from __future__ import annotations

import base64
import dataclasses
import os
import ssl
import subprocess
from pathlib import Path

import bcrypt
from conftest import need_binary


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(
        [need_binary("openssl"), *args], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert res.returncode == 0, res.stderr


@dataclasses.dataclass
class Pki:
    ca: Path
    server_crt: Path
    server_key: Path
    client_crt: Path
    client_key: Path


def make_pki(d: Path) -> Pki:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""
    d.mkdir(parents=True, exist_ok=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=gpuwatchd test CA", cwd=d)  # fmt: skip
    for name, ext in (
        ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ):
        (d / f"{name}.ext").write_text("basicConstraints=CA:FALSE\n" + ext)
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN=gpuwatchd test {name}", cwd=d)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    os.chmod(d / "server.key", 0o600)
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key")


def bcrypt_hash(password: str) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()


def https_get(
    url: str,
    pki: Pki,
    auth: tuple[str, str] | None = None,
    client_cert: bool = False,
    max_version: ssl.TLSVersion | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """A real TLS client (Python's ssl + http.client) that verifies the server."""
    import http.client
    import urllib.parse

    ctx = ssl.create_default_context(cafile=str(pki.ca))
    if client_cert:
        ctx.load_cert_chain(str(pki.client_crt), str(pki.client_key))
    if max_version is not None:
        ctx.maximum_version = max_version
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPSConnection(u.hostname or "", u.port, context=ctx, timeout=5)
    headers = {}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    try:
        conn.request("GET", u.path or "/", headers=headers)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
