"""The HTTP endpoints: /metrics, /healthz, /api/v1/status and a landing page.

A small threaded ``http.server``: each request reads the in-memory node view through the
callables it was given, so no request ever calls NVML or waits on a GPU.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.openmetrics.exposition import (
    CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE,
)
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from .exposition import CONTENT_TYPE
from .metrics import MetricsRenderer, client_registry

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, str]]
Status = Callable[[], dict[str, Any]]

_LANDING = b"""<!doctype html><html><head><title>gpuwatchd</title></head><body>
<h1>gpuwatchd</h1><ul>
<li><a href="/metrics">/metrics</a> Prometheus metrics</li>
<li><a href="/healthz">/healthz</a> daemon health</li>
<li><a href="/api/v1/status">/api/v1/status</a> per-GPU health (JSON)</li>
</ul></body></html>
"""


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(
        self, address: tuple[str, int], renderer: MetricsRenderer, health: Health, status: Status
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.renderer = renderer
        self.registry = client_registry(renderer)
        self.health = health
        self.status = status
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    server_version = "gpuwatchd"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s - " + format, self.client_address[0], *args)

    def _send(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                accept = self.headers.get("Accept", "")
                if "application/openmetrics-text" in accept:
                    body = openmetrics_latest(self.server.registry)  # type: ignore[no-untyped-call]
                    self._send(200, body, OPENMETRICS_CONTENT_TYPE)
                else:
                    self._send(200, self.server.renderer.render(), CONTENT_TYPE)
            elif path == "/healthz":
                ok, reason = self.server.health()
                self._send(
                    200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8"
                )
            elif path == "/api/v1/status":
                body = json.dumps(self.server.status(), indent=2, sort_keys=True).encode()
                self._send(200, body + b"\n", "application/json")
            elif path == "/":
                self._send(200, _LANDING, "text/html; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except Exception:  # keep serving whatever one request hit
            log.exception("error serving %s", path)
            self._send(500, b"internal error\n", "text/plain; charset=utf-8")


class HttpServer:
    def __init__(
        self, host: str, port: int, renderer: MetricsRenderer, health: Health, status: Status
    ) -> None:
        self._server = _Server((host, port), renderer, health, status)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="http",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(2.0)
