"""Reading a receiver's answer without trusting it: bounded in bytes, in time, and in
what decompression may cost.

A receiver (or whoever answers at its address) chooses its answer. Read whole and decoded
as it came, a 2 MB gzip answer cost about 1.9 GB of memory per attempt, and an endless
one grew without end while its delivery never finished (issue 26). So, for every attempt:

- the request asks for no compression (``Accept-Encoding: identity``), and the answer is
  read raw: at most ``MAX_ANSWER_BYTES`` of it, the rest is never read (the connection is
  closed instead of reused);
- a gzip or deflate answer is decoded into at most ``MAX_ANSWER_BYTES`` as well, whatever
  its ratio (a gzip bomb costs no more than a plain answer); other encodings are not
  decoded at all. Only the status and headers decide an outcome; the body is text for
  the log and the status API, of which ``ERROR_BODY_LIMIT`` characters are kept, control
  characters (escape sequences) made spaces;
- the whole attempt (connect, TLS, send, the answer's headers and body) has one deadline,
  the receiver's ``timeout``: every read and write of the connection waits at most until
  it (``DeadlineBackend``), so a receiver sending a byte every few seconds cannot stretch
  an attempt past it.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import httpcore
import httpx

# httpcore 1.x names its sync backend and stream at the top; 0.16 (Debian 12's
# python3-httpcore, what the .deb runs on) keeps them in ``httpcore.backends``.
_SyncBackend: Any = (
    getattr(httpcore, "SyncBackend", None)
    or importlib.import_module("httpcore.backends.sync").SyncBackend
)
_NetworkStream: Any = (
    getattr(httpcore, "NetworkStream", None)
    or importlib.import_module("httpcore.backends.base").NetworkStream
)

MAX_ANSWER_BYTES = 64 * 1024  # of an answer read (raw) and decoded, at most
ERROR_BODY_LIMIT = 2000  # characters of an answer kept for the log and the status API
DECODED = ("gzip", "x-gzip", "deflate")


class AnswerTooLate(Exception):
    """The attempt's deadline passed while its answer was still coming."""


def read_answer(resp: httpx.Response, deadline: float) -> str:
    """The start of ``resp``'s body as text, read within the bounds above."""
    raw = bytearray()
    if resp.is_stream_consumed:  # built whole in this process (a MockTransport, simulate)
        raw += resp.content[:MAX_ANSWER_BYTES]
    else:
        for chunk in resp.iter_raw():
            raw += chunk
            if len(raw) >= MAX_ANSWER_BYTES:
                break
            if time.monotonic() > deadline:
                raise AnswerTooLate
    encoding = resp.headers.get("content-encoding", "").strip().lower()
    data = bytes(raw[:MAX_ANSWER_BYTES])
    if encoding in DECODED:
        try:
            # 32 + 15: a gzip or zlib header, found by zlib; never more than the cap out
            data = zlib.decompressobj(47).decompress(data, MAX_ANSWER_BYTES)
        except zlib.error:
            return f"(a {encoding} answer that does not decompress)"
    elif encoding not in ("", "identity"):
        return f"(a {encoding[:40]} answer, not decoded)"
    text = data.decode("utf-8", "replace")[:ERROR_BODY_LIMIT]
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else " " for c in text)  # no NUL, ESC, BEL in logs


class DeadlineBackend(_SyncBackend):  # type: ignore[misc]
    """httpcore's network backend, with every connect, read and write of the calling
    thread's current attempt (``attempt``) cut at that attempt's deadline."""

    def __init__(self) -> None:
        self._local = threading.local()

    @contextlib.contextmanager
    def attempt(self, seconds: float) -> Iterator[float]:
        """The deadline (monotonic) of one attempt of ``seconds``, for this thread."""
        deadline = time.monotonic() + seconds
        self._local.deadline = deadline
        try:
            yield deadline
        finally:
            self._local.deadline = None

    def left(self, timeout: float | None, error: type[Exception]) -> float | None:
        deadline: float | None = getattr(self._local, "deadline", None)
        if deadline is None:
            return timeout
        left = deadline - time.monotonic()
        if left <= 0:
            raise error("the attempt's deadline passed")
        return left if timeout is None else min(timeout, left)

    def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, *rest: Any, **kw: Any
    ) -> Any:
        # *rest: local_address, and socket_options where httpcore has them (1.x)
        left = self.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(super().connect_tcp(host, port, left, *rest, **kw), self)


class _DeadlineStream(_NetworkStream):  # type: ignore[misc]
    def __init__(self, inner: Any, backend: DeadlineBackend) -> None:
        self._inner = inner
        self._backend = backend

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data: bytes = self._inner.read(max_bytes, self._backend.left(timeout, httpcore.ReadTimeout))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, self._backend.left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> Any:
        left = self._backend.left(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(
            self._inner.start_tls(ssl_context, server_hostname, left), self._backend
        )

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def deadline_transport(backend: DeadlineBackend) -> httpx.HTTPTransport:
    """httpx's own transport (TLS verified, no proxy from the environment), its connection
    pool built on ``backend``. httpx takes no network backend, so the pool it made is
    replaced by one with the same settings (httpx 0.28: ``HTTPTransport._pool``);
    ``tests/actions/test_actions_receivers.py`` fails if that stops working."""
    transport = httpx.HTTPTransport(trust_env=False)
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5)
    transport._pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(trust_env=False),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=backend,
    )
    return transport
