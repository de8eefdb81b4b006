"""The HTTP server's own request parser, byte by byte over a raw socket: bounds, keep-alive,
versions and malformed requests. Every refusal is a 4xx (or 505), counted, and closes."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator

import pytest

from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.statusdoc import StatusDocument
from gpuwatchd.exposition.httpd import HttpServer, http_date
from gpuwatchd.exposition.metrics import MetricsRenderer


def empty_status() -> StatusDocument:
    return StatusDocument.from_json({"gpus": []})


@pytest.fixture
def server() -> Iterator[HttpServer]:
    state = NodeState("node-a", time.time())
    srv = HttpServer(
        "127.0.0.1", 0, MetricsRenderer(state.view), lambda: (True, "ok"), empty_status
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def exchange(srv: HttpServer, data: bytes, timeout: float = 5.0) -> bytes:
    """Send ``data``, read until the server closes the connection."""
    with socket.create_connection(srv.address, timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def statuses(raw: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"^HTTP/1\.1 (\d{3}) ", raw, re.M)]


def test_http_1_1_keeps_the_connection_for_a_second_request(server: HttpServer) -> None:
    two = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    raw = exchange(server, two + b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert statuses(raw) == [200, 200, 200]
    assert raw.count(b"Server: gpuwatchd\r\n") == 3


def test_http_1_0_closes_after_one_answer_unless_asked(server: HttpServer) -> None:
    assert statuses(exchange(server, b"GET /healthz HTTP/1.0\r\n\r\n" * 2)) == [200]
    keep = b"GET /healthz HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    assert statuses(exchange(server, keep + b"GET /healthz HTTP/1.0\r\n\r\n")) == [200, 200]


def test_head_answers_headers_only_with_the_body_length(server: HttpServer) -> None:
    raw = exchange(server, b"HEAD /metrics HTTP/1.1\r\nConnection: close\r\n\r\n")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert statuses(raw) == [200] and body == b""
    length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
    assert length > 1000


def test_header_names_are_case_insensitive_and_leading_blank_lines_ignored(
    server: HttpServer,
) -> None:
    raw = exchange(server, b"\r\nGET /healthz HTTP/1.1\r\nconnection:   CLOSE  \r\n\r\n")
    assert statuses(raw) == [200]


@pytest.mark.parametrize(
    ("request_bytes", "code"),
    [
        (b"GET /\r\n\r\n", 400),  # HTTP/0.9: no version
        (b"GET  / HTTP/1.1\r\n\r\n", 400),  # two spaces
        (b"GET / HTTP/2.0\r\n\r\n", 505),
        (b"GET / HTTP/1.x\r\n\r\n", 400),
        (b"GET / HTTX/1.1\r\n\r\n", 400),
        (b"G(T / HTTP/1.1\r\n\r\n", 400),  # not a token
        (b"GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", 400),  # obs-fold
        (b"GET / HTTP/1.1\r\nNo colon here\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", 405),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 431),  # line over 64 KiB
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", 431),  # over 100 fields
    ],
)
def test_malformed_requests_get_a_counted_refusal_and_a_close(
    server: HttpServer, request_bytes: bytes, code: int
) -> None:
    raw = exchange(server, request_bytes + b"GET /healthz HTTP/1.1\r\n\r\n")
    assert statuses(raw) == [code]  # the request after it is never answered
    assert b"Connection: close\r\n" in raw
    assert sum(server._server.refused.values()) == 1


def test_a_body_is_never_read_but_refused_at_once(server: HttpServer) -> None:
    """No endpoint takes a body; one announced is answered 413 and closed without reading
    it (issue 26), while ``Content-Length: 0`` is no body at all."""
    zero = b"GET /healthz HTTP/1.1\r\nContent-Length: 0\r\n\r\n"
    raw = exchange(server, zero + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert statuses(raw) == [200, 200]
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\n")  # no body yet
        raw = sock.recv(65536)
    assert statuses(raw) == [413] and b"Connection: close\r\n" in raw
    assert server._server.refused["too_large"] == 1


def test_non_ascii_header_values_do_not_break_the_answer(server: HttpServer) -> None:
    raw = exchange(server, b"GET /healthz HTTP/1.1\r\nX-N: \xff\xfe\r\nConnection: close\r\n\r\n")
    assert statuses(raw) == [200]


def test_http_date_is_imf_fixdate_whatever_the_locale() -> None:
    assert http_date(0.0) == "Thu, 01 Jan 1970 00:00:00 GMT"
    assert http_date(1_767_225_600.0) == "Thu, 01 Jan 2026 00:00:00 GMT"
