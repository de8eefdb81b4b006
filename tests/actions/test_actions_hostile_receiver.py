"""A hostile receiver (issue 26 item 4): whoever answers at a receiver's address chooses
the answer. A real loopback server answers with a gzip bomb, an endless body, a body or
headers trickled a byte at a time; each delivery attempt runs in a child process (the real
``HttpSender`` over real sockets) so its memory and time are its own.

Each test failed on main: answers were read whole and gzip-decoded as they came (a 128 MiB
bomb in 125 KiB cost the sender hundreds of MiB), an endless answer was read for ever (the
attempt never ended, memory grew), and a trickle kept an attempt alive past any timeout.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Iterator

import pytest
from conftest import ROOT
from fault_support import report

BOMB_MIB = 128


def _bomb() -> bytes:
    """``BOMB_MIB`` MiB of zeros, gzip-compressed (about 1/1000 of that)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(z.compress(zeros) for _ in range(BOMB_MIB)) + z.flush()


class Hostile:
    """Answers by path: /bomb, /endless, /trickle-body, /trickle-headers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.bomb = _bomb()
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                path = data.split(b" ", 2)[1].decode()
                self._answer(conn, path)
            except OSError:
                return  # the sender gave up: as it should

    def _answer(self, conn: socket.socket, path: str) -> None:
        if path == "/bomb":
            head = "HTTP/1.1 500 Oops\r\nContent-Encoding: gzip\r\n"
            head += f"Content-Length: {len(self.bomb)}\r\n\r\n"
            conn.sendall(head.encode() + self.bomb)
            time.sleep(5)
        elif path == "/endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"10000\r\n" + b"x" * 0x10000 + b"\r\n"
            while not self.stop.is_set():
                conn.sendall(chunk)
        elif path == "/trickle-body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
            while not self.stop.wait(0.3):
                conn.sendall(b"x")
        elif path == "/trickle-headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
            while not self.stop.wait(0.3):
                conn.sendall(b"x")

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    h = Hostile()
    yield h
    h.close()


_ATTEMPT = r"""
import json, resource, sys, time
from gpuwatchd.actions.receivers import HttpRequest, build_receiver
from gpuwatchd.actions.transport import HttpSender, Outgoing
from gpuwatchd.actions.receivers.webhook import WebhookReceiver
url, timeout = sys.argv[1], float(sys.argv[2])
rcv = build_receiver(WebhookReceiver(name="hook", url=url, timeout=timeout))
request = HttpRequest("POST", url, {"Content-Type": "application/json"}, b'{"alerts": []}')
out = Outgoing(rcv, 0, [], "k1", [request])
sender = HttpSender()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.monotonic()
outcome = sender.send(out, time.time())
print(json.dumps({
    "kind": outcome.kind, "detail": outcome.detail, "seconds": time.monotonic() - started,
    "grew_mib": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024,
}))
"""


def attempt(hostile: Hostile, path: str, timeout: float) -> dict[str, object]:
    """One delivery attempt to ``path`` in a child process; fails the test if the child
    needs more than a generous 30 s (on main some never ended)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    url = f"http://127.0.0.1:{hostile.port}{path}"
    try:
        res = subprocess.run(
            [sys.executable, "-c", _ATTEMPT, url, str(timeout)],
            capture_output=True, text=True, timeout=30, env=env, cwd=ROOT,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"the attempt to {path} did not end in 30 s")
    assert res.returncode == 0, res.stderr[-2000:]
    result: dict[str, object] = json.loads(res.stdout)
    report(f"hostile receiver {path}", **result)
    return result


def test_a_gzip_bomb_costs_no_memory(hostile: Hostile) -> None:
    got = attempt(hostile, "/bomb", 10.0)
    assert got["kind"] == "retry" and "HTTP 500" in str(got["detail"]), got
    assert float(str(got["grew_mib"])) < 32, got  # main: several hundred MiB


def test_an_endless_answer_is_cut_and_the_attempt_ends(hostile: Hostile) -> None:
    got = attempt(hostile, "/endless", 10.0)
    assert got["kind"] == "ok", got  # the status said so; the rest was never read
    assert float(str(got["seconds"])) < 10 and float(str(got["grew_mib"])) < 32, got


@pytest.mark.parametrize("path", ["/trickle-body", "/trickle-headers"])
def test_a_trickled_answer_ends_at_the_attempts_deadline(hostile: Hostile, path: str) -> None:
    got = attempt(hostile, path, 2.0)
    assert got["kind"] == "retry", got
    assert 1.5 < float(str(got["seconds"])) < 8, got  # one deadline of 2 s, with room
