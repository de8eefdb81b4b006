"""The HTTP endpoints: /metrics, /healthz, /api/v1/status and a landing page.

A small threaded HTTP/1.1 server (``socketserver`` and a bounded parser of its own): each
request reads the in-memory node view through the
callables it was given, so no request ever calls NVML or waits on a GPU.

Guards, in the order a request meets them (``WebGuard`` holds the settings):

- at most ``MAX_CONNECTIONS`` connections at once, each with a ``TIMEOUT`` for the TLS
  handshake and every read. A connection is "waiting" whenever the server waits for a
  byte from it (the server reads nothing but request lines and headers: never a body);
  when every slot is taken, a new connection evicts the waiting one that has waited
  longest (at least ``EVICT_AFTER``), and any that waited ``HEADER_DEADLINE`` is closed.
  Slow clients (one byte every few seconds, idle keep-alives) can therefore never lock a
  normal scraper out; only as many busy, fast requests as slots refuse a new one;
- TLS when the web config file (exporter-toolkit format, ``web.config_file``) asks;
- a rate limit per client address (429 with ``Retry-After``);
- the request line and headers together at most ``web.max_request_bytes`` (431); any
  body 413, unread (no endpoint takes one, and a body read a byte at a time would hold a
  slot past the header deadline);
- basic auth against bcrypt hashes when the web config has users (401); bcrypt checks that
  are not cached are bounded for the whole server, whatever the client address (429 past
  the budget, see ``BasicAuth``);
- only GET and HEAD (405);
- a request line or header field at most 64 KiB and at most 100 header fields (431), a
  well-formed request line with an HTTP/1.x version and token header names (400).

/metrics answers in OpenMetrics when the Accept header asks for it, else in the text format,
and gzip-compressed when the Accept-Encoding header takes gzip (``accepts_gzip``; the
renderer caches both, see metrics.py); ``gpuwatchd_http_metrics_responses_total`` counts
the answers by format and encoding.

Every refusal is a 4xx and is counted in ``gpuwatchd_http_requests_refused_total``. The
only 5xx answers: /healthz's 503 when the daemon is not healthy, a 505 for a
request line in an HTTP version other than 1.x, and a 500 from an endpoint
that failed (logged with its traceback; the fuzz tests have never produced one).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from gpuwatchd.config.web import PasswordChecksBusy, WebGuard
from gpuwatchd.core.families import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, Families
from gpuwatchd.core.statusdoc import StatusDocument
from gpuwatchd.exposition.metrics import MetricsRenderer
from gpuwatchd.exposition.statuspage import render_page

log = logging.getLogger(__name__)

Health = Callable[[], tuple[bool, str]]
Status = Callable[[], StatusDocument]

MAX_CONNECTIONS = 64
TIMEOUT = 10.0  # seconds for the TLS handshake and for each read of a request
HEADER_DEADLINE = 10.0  # seconds from connecting (or the last answer) to a whole request
EVICT_AFTER = 0.25  # a connection this long without a whole request may make room
EVICT_WAIT = 2.0  # seconds a new connection waits for the slot an eviction frees
REFUSALS = (
    "connections",
    "slow",
    "tls",
    "rate_limit",
    "too_large",
    "auth",
    "method",
    "bad_request",
)
_WARN_EVERY = 10.0  # seconds between two warnings of one kind
METRICS_RESPONSES = tuple(
    (fmt, enc) for fmt in ("text", "openmetrics") for enc in ("identity", "gzip")
)
_MAX_CODINGS = 32  # Accept-Encoding entries looked at


def accepts_gzip(header: str) -> bool:
    """Whether an Accept-Encoding value takes gzip (RFC 9110 12.5.3): ``gzip`` or
    ``x-gzip`` with a q-value above 0, else ``*`` with one; absent or unreadable: no."""
    star = False
    for item in header.split(",", _MAX_CODINGS)[:_MAX_CODINGS]:
        coding, _, params = item.partition(";")
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            return 0.0 < q <= 1.0
        if coding == "*":
            star = 0.0 < q <= 1.0
    return star


class _Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        address: tuple[str, int],
        renderer: MetricsRenderer,
        health: Health,
        status: Status,
        guard: WebGuard,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.renderer = renderer
        self.health = health
        self.status = status
        self.guard = guard
        self.refused = dict.fromkeys(REFUSALS, 0)
        self.metrics_responses = dict.fromkeys(METRICS_RESPONSES, 0)
        self.requests = 0
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._count_lock = threading.Lock()
        # connections that have no complete request yet (fd -> since, socket): slow ones
        # are evicted to make room, so slow clients can never lock a scraper out
        self._waiting: dict[int, tuple[float, socket.socket]] = {}
        self._warned: dict[str, float] = {}
        # stop_serving() writes here: the accept loop sleeps until a client or this comes
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        super().__init__(address, _Handler)

    def serve_until_stopped(self) -> None:
        """Accept connections until ``stop_serving``. Unlike ``serve_forever``, whose poll
        interval wakes the thread twice a second for nothing, an idle server sleeps."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            while True:
                for key, _ in selector.select():
                    if key.fileobj == self._wake_r:
                        return
                self._accept_one()

    def _accept_one(self) -> None:
        try:
            request, client_address = self.get_request()
        except OSError:
            return
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def stop_serving(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def metrics(self, accept: str, accept_encoding: str) -> tuple[bytes, str, bool]:
        """The /metrics body for these request headers: OpenMetrics when asked for, else
        the text format; gzip-compressed when the client takes gzip (both cached by the
        renderer). (body, content type, compressed); counted by format and encoding."""
        openmetrics = "application/openmetrics-text" in accept
        gzip = accepts_gzip(accept_encoding)
        if openmetrics:
            body = self.renderer.render_openmetrics(gzip=gzip)
        else:
            body = self.renderer.render(gzip=gzip)
        key = ("openmetrics" if openmetrics else "text", "gzip" if gzip else "identity")
        with self._count_lock:
            self.metrics_responses[key] += 1
        return body, OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE, gzip

    def refuse(self, reason: str, message: str | None = None, *args: object) -> None:
        """Count a refusal; log it at most once per ``_WARN_EVERY`` seconds per reason."""
        with self._count_lock:
            self.refused[reason] += 1
            now = time.monotonic()
            loud = message is not None and now - self._warned.get(reason, -1e9) >= _WARN_EVERY
            if loud:
                self._warned[reason] = now
        if loud:
            assert message is not None
            quiet = " (more are counted, not logged, for %gs)"
            log.warning(message + quiet, *args, _WARN_EVERY)

    def count_request(self) -> None:
        with self._count_lock:
            self.requests += 1

    # -- slow clients ------------------------------------------------------------------
    def waiting(self, sock: Any) -> None:
        """``sock`` waits for (or is reading) a request: it may be evicted."""
        with self._count_lock:
            self._waiting[sock.fileno()] = (time.monotonic(), sock)

    def busy(self, sock: Any) -> None:
        """``sock`` has a whole request and is being served: it is not evicted."""
        with self._count_lock:
            self._waiting.pop(sock.fileno(), None)

    def _evict(self) -> bool:
        """Close connections that waited more than ``HEADER_DEADLINE`` for a complete
        request and, if none did, the one that has waited longest (at least
        ``EVICT_AFTER``); True if one was closed."""
        now = time.monotonic()
        with self._count_lock:
            old = [(t, fd) for fd, (t, _) in self._waiting.items() if now - t >= EVICT_AFTER]
            if not old:
                return False
            expired = [fd for t, fd in old if now - t >= HEADER_DEADLINE]
            victims = expired or [min(old)[1]]
            socks = [self._waiting.pop(fd)[1] for fd in victims]
        self._close_slow(socks)
        return True

    def _close_slow(self, socks: list[socket.socket]) -> None:
        for sock in socks:
            self.refuse("slow", "HTTP: closing a connection with no whole request in time")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # its thread's read ends; the slot frees

    def process_request(self, request: Any, client_address: Any) -> None:
        if self._waiting:
            self._evict_expired()
        if not self._slots.acquire(blocking=False) and not (
            self._evict() and self._slots.acquire(timeout=EVICT_WAIT)
        ):
            self.refuse(
                "connections",
                "HTTP: %d connections already open, none of them slow; closing a new one from %s",
                MAX_CONNECTIONS,
                client_address[0],
            )
            self.shutdown_request(request)
            return
        self.waiting(request)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.busy(request)
            self._slots.release()
            raise

    def _evict_expired(self) -> None:
        now = time.monotonic()
        with self._count_lock:
            late = [fd for fd, (t, _) in self._waiting.items() if now - t >= HEADER_DEADLINE]
            socks = [self._waiting.pop(fd)[1] for fd in late]
        self._close_slow(socks)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.busy(request)
            self._slots.release()

    def finish_request(self, request: Any, client_address: Any) -> None:
        self.guard.refresh()
        request.settimeout(TIMEOUT)
        ctx = self.guard.ssl_context
        if ctx is None:
            self.RequestHandlerClass(request, client_address, self)  # type: ignore[arg-type]
            return
        try:
            tls = ctx.wrap_socket(request, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            return
        try:
            tls.do_handshake()
        except (_tls_error(), OSError) as exc:
            self.refuse(
                "tls", "HTTP: TLS handshake with %s failed: %s", client_address[0], _brief(exc)
            )
            tls.close()
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        finally:
            tls.close()  # no close_notify wait: a silent peer must not hold the slot

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("HTTP: connection from %s ended with an error", client_address[0], exc_info=True)


def _tls_error() -> type[Exception]:
    """``ssl.SSLError`` when TLS is in use (then ssl is loaded), else a class never raised:
    a daemon without TLS never imports ssl (4 MiB of RSS)."""
    ssl = sys.modules.get("ssl")
    return ssl.SSLError if ssl is not None else _NeverRaised


class _NeverRaised(Exception):
    pass


def _brief(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason) if reason else type(exc).__name__


class _BadRequest(Exception):
    """A request that cannot be parsed: answered with ``code`` and closed."""

    def __init__(self, code: int, reason: str, text: str) -> None:
        super().__init__(text)
        self.code, self.reason, self.text = code, reason, text


class _Headers:
    """A request's header fields: names case-insensitive, the first of a repeated name
    wins (as ``email.message`` did), except Content-Length, which must agree."""

    def __init__(self, fields: list[tuple[str, str]]) -> None:
        self.fields = fields
        self._first: dict[str, str] = {}
        for name, value in fields:
            key = name.lower()
            if key == "content-length" and self._first.get(key, value) != value:
                raise _BadRequest(400, "bad_request", "conflicting Content-Length")
            self._first.setdefault(key, value)

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._first.get(name.lower(), default)

    def size(self) -> int:
        return sum(len(k) + len(v) + 4 for k, v in self.fields)


_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(when: float) -> str:
    """RFC 9110 IMF-fixdate, independent of the locale."""
    t = time.gmtime(when)
    return (
        f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
        f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
    )


def _reason(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return "Unknown"


class _Handler(socketserver.StreamRequestHandler):
    """HTTP/1.1 over one connection: request line and headers read with bounds (a line at
    most ``MAX_LINE`` bytes, at most ``MAX_HEADERS`` fields), keep-alive as RFC 9112 says,
    GET and HEAD only. Written here rather than on ``http.server`` because that one pulls in
    ``http.client``, ``email`` and ``ssl``: 5-6 MiB of a daemon measured against a bare
    pynvml process (docs/PERFORMANCE.md)."""

    server: _Server
    MAX_LINE = 65536
    MAX_HEADERS = 100

    def setup(self) -> None:
        super().setup()
        self.close_connection = True
        self.command = ""
        self.path = ""
        self.request_version = "HTTP/1.1"
        self.raw_requestline = b""
        self.headers = _Headers([])
        self._out: list[bytes] = []
        self._keep_alive_default = True

    def handle(self) -> None:
        self.handle_one_request()
        while not self.close_connection:
            self.handle_one_request()

    def _readline(self) -> bytes:
        line: bytes = self.rfile.readline(self.MAX_LINE + 1)
        if len(line) > self.MAX_LINE:
            raise _BadRequest(431, "too_large", "request line or header field too long")
        return line

    def handle_one_request(self) -> None:
        self.server.waiting(self.connection)  # until its request line and headers are in
        self.close_connection = True
        self.command = ""
        try:
            try:
                line = self._readline()
                while line in (b"\r\n", b"\n"):  # RFC 9112 2.2: ignore leading empty lines
                    line = self._readline()
                if not line:
                    return  # the client closed the connection
                self.raw_requestline = line
                self._parse_request_line(line)
                self.headers = self._read_headers()
            finally:
                self.server.busy(self.connection)
        except _BadRequest as bad:
            self._refuse(bad.code, bad.reason, text=bad.text)
            return
        if not self.parse_request():
            return
        if self.command == "HEAD":
            self.do_HEAD()
        else:
            self.do_GET()

    def _parse_request_line(self, line: bytes) -> None:
        words = line.rstrip(b"\r\n").split(b" ")
        if len(words) != 3 or not all(words):
            raise _BadRequest(400, "bad_request", "bad request line")
        method, target, version = words
        if not set(method) <= _TOKEN:
            raise _BadRequest(400, "bad_request", "bad method")
        numbers = version[5:].split(b".") if version.startswith(b"HTTP/") else []
        if len(numbers) != 2 or not all(n.isdigit() and len(n) <= 3 for n in numbers):
            raise _BadRequest(400, "bad_request", "bad HTTP version")
        major, minor = int(numbers[0]), int(numbers[1])
        if major != 1:
            raise _BadRequest(505, "bad_request", "HTTP version not supported")
        self.command = method.decode("ascii")
        self.path = target.decode("iso-8859-1")
        self.request_version = version.decode("ascii")
        self._keep_alive_default = minor >= 1

    def _read_headers(self) -> _Headers:
        fields: list[tuple[str, str]] = []
        budget = self.server.guard.max_request_bytes + self.MAX_LINE  # 431 is decided later
        while True:
            line = self._readline()
            if line in (b"\r\n", b"\n", b""):
                break
            budget -= len(line)
            if len(fields) >= self.MAX_HEADERS or budget < 0:
                raise _BadRequest(431, "too_large", "too many header fields")
            name, colon, value = line.partition(b":")
            if not colon or not name or not set(name) <= _TOKEN:
                raise _BadRequest(400, "bad_request", "bad header field")  # obs-fold too
            fields.append((name.decode("ascii"), value.strip(b" \t\r\n").decode("iso-8859-1")))
        headers = _Headers(fields)
        connection = (headers.get("Connection") or "").lower()
        if "close" in connection:
            self.close_connection = True
        elif "keep-alive" in connection:
            self.close_connection = False
        else:
            self.close_connection = not self._keep_alive_default
        return headers

    # -- answers -------------------------------------------------------------------------
    def send_response(self, code: int) -> None:
        self._out = [
            f"HTTP/1.1 {code} {_reason(code)}\r\n".encode("ascii"),
            b"Server: gpuwatchd\r\n",
            f"Date: {http_date(time.time())}\r\n".encode("ascii"),
        ]

    def send_header(self, name: str, value: str) -> None:
        self._out.append(f"{name}: {value}\r\n".encode("latin-1", "replace"))
        if name.lower() == "connection" and value.lower() == "close":
            self.close_connection = True

    def end_headers(self) -> None:
        for name, value in self.server.guard.config.headers:
            self.send_header(name, value)
        self._out.append(b"\r\n")

    def _write(self, body: bytes) -> None:
        """The buffered status line and headers, and ``body``, in one write."""
        self.wfile.write(b"".join(self._out) + body)
        self._out = []

    def _refuse(
        self,
        code: int,
        reason: str,
        headers: dict[str, str] | None = None,
        text: str = "",
        note: str | None = None,
        *args: object,
    ) -> bool:
        """Send a refusal (connection closed after it); count it, and log ``note``."""
        self.server.refuse(reason, note, *args)
        body = ((text or _reason(code)) + "\n").encode()
        self.close_connection = True
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        with contextlib.suppress(OSError):
            self._write(b"" if self.command == "HEAD" else body)
        return False

    def parse_request(self) -> bool:
        """Apply the guards to a parsed request; False ends it (a refusal was sent)."""
        guard = self.server.guard
        self.server.count_request()
        client = self.client_address[0]
        wait = guard.limiter.allow(client)
        if wait > 0:
            retry = {"Retry-After": str(max(1, round(wait)))}
            note = "HTTP: rate limit: refusing requests from %s"
            return self._refuse(429, "rate_limit", retry, "", note, client)
        size = len(self.raw_requestline) + self.headers.size()
        if size > guard.max_request_bytes:
            return self._refuse(431, "too_large")
        try:
            ok, user = guard.auth.check(self.headers.get("Authorization"))
        except PasswordChecksBusy as busy:
            # the node-wide budget of bcrypt checks is spent (many clients guessing)
            retry = {"Retry-After": str(max(1, round(busy.retry_after)))}
            note = "HTTP: password checks over budget: refusing %s for now"
            return self._refuse(429, "rate_limit", retry, "", note, client)
        if not ok:
            # name the user only when it is a configured one: never echo what was sent
            who = f"user {user!r}" if user in guard.auth.users else "unknown or no user"
            challenge = {"WWW-Authenticate": 'Basic realm="gpuwatchd"'}
            note = "HTTP: authentication failed from %s (%s)"
            return self._refuse(401, "auth", challenge, "", note, client, who)
        if self.command not in ("GET", "HEAD"):
            return self._refuse(405, "method", {"Allow": "GET, HEAD"})
        return self._no_body()

    def _no_body(self) -> bool:
        """No endpoint takes a body, so none is ever read: a request that announces one is
        answered 413 at once and closed, its body unread. Reading it would leave the
        connection outside the header deadline and out of reach of eviction, so 64 clients
        sending a body a byte at a time could hold every slot (issue 26)."""
        if self.headers.get("Transfer-Encoding"):
            return self._refuse(400, "bad_request", text="request bodies are not accepted")
        raw = self.headers.get("Content-Length")
        if raw is None:
            return True
        if not raw.strip().isdigit():
            return self._refuse(400, "bad_request", text="bad Content-Length")
        if int(raw) > 0:
            return self._refuse(413, "too_large", text="request bodies are not accepted")
        return True

    def _send(
        self, code: int, body: bytes, content_type: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self._write(b"" if self.command == "HEAD" else body)

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        try:
            if path == "/metrics":
                body, content_type, gzip = self.server.metrics(
                    self.headers.get("Accept") or "", self.headers.get("Accept-Encoding") or ""
                )
                vary = ("Vary", "Accept, Accept-Encoding")
                extra = (("Content-Encoding", "gzip"), vary) if gzip else (vary,)
                self._send(200, body, content_type, extra)
            elif path == "/healthz":
                ok, reason = self.server.health()
                self._send(
                    200 if ok else 503, (reason + "\n").encode(), "text/plain; charset=utf-8"
                )
            elif path == "/api/v1/status":
                body = json.dumps(self.server.status().as_json(), indent=2, sort_keys=True).encode()
                self._send(200, body + b"\n", "application/json")
            elif path == "/":  # the status page (statuspage.py); links to the rest
                page = render_page(self.server.status())
                self._send(200, page, "text/html; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")
        except (BrokenPipeError, ConnectionResetError, TimeoutError, _tls_error()):
            self.close_connection = True  # the client went away mid-response
        except Exception:  # keep serving whatever one request hit
            log.exception("error serving %s", path[:200])
            self._send(500, b"internal error\n", "text/plain; charset=utf-8")


class HttpServer:
    def __init__(
        self,
        host: str,
        port: int,
        renderer: MetricsRenderer,
        health: Health,
        status: Status,
        guard: WebGuard | None = None,
    ) -> None:
        self.guard = guard or WebGuard(
            None, rate_interval=0.0, rate_burst=1, max_request_bytes=65536
        )
        self._server = _Server((host, port), renderer, health, status, self.guard)
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        scheme = "https" if self.guard.tls else "http"
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"

    def families(self, fams: Families) -> None:
        """Request and refusal counters (all present at 0 from start-up)."""
        fams.get(
            "gpuwatchd_http_requests_total",
            "counter",
            "HTTP requests parsed (refused ones included).",
            [],
        ).add([], float(self._server.requests))
        refused = fams.get(
            "gpuwatchd_http_requests_refused_total",
            "counter",
            "HTTP requests or connections refused: connections (too many open), slow (closed "
            "to make room: no whole request in time), tls (handshake failed), rate_limit "
            "(429), too_large (413/431), auth (401), method (405), bad_request (400).",
            ["reason"],
        )
        for reason in REFUSALS:
            refused.add([reason], float(self._server.refused[reason]))
        responses = fams.get(
            "gpuwatchd_http_metrics_responses_total",
            "counter",
            "/metrics answers by format (text, openmetrics: what the Accept header asked "
            "for) and encoding (gzip when the Accept-Encoding header takes it, else identity).",
            ["format", "encoding"],
        )
        for fmt, enc in METRICS_RESPONSES:
            responses.add([fmt, enc], float(self._server.metrics_responses[(fmt, enc)]))
        fams.get(
            "gpuwatchd_web_config_reload_failures_total",
            "counter",
            "Times the web config file changed but did not load (the previous one stays).",
            [],
        ).add([], float(self.guard.reload_failures))

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._server.serve_until_stopped, name="http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._server.stop_serving()
        if self._thread is not None:
            self._thread.join(2.0)
        self._server.server_close()
