"""Port squatting (issue 15 item 5): a user who binds the listen port while the daemon is
down must neither stop monitoring nor fool ``gpuwatchd status``.

On main the daemon exited 1 when the port was taken (a restart loop without monitoring),
and ``status`` printed the squatter's fake "ok", raw escape sequences included, with
exit status 0. Each test below fails on main."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT, free_port
from fault_support import STEADY, Daemon, KmsgFile, wait_until

from gpuwatchd.cli.statusclient import StatusSocketError, clean, printable, read_verified, verify
from gpuwatchd.exposition.listener import RetryingListener
from gpuwatchd.exposition.statussock import StatusSocket

ESC = "\x1b[2J\x1b]0;owned\x07"
FAKE = {
    "node": f"fake{ESC}",
    "version": "9.9",
    "backend": "nvml",
    "gpus": [],
    "sources": {},
    "alerts": [],
}


class _Squat(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(FAKE, ensure_ascii=False).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def squatter() -> Iterator[HTTPServer]:
    """Someone else's server on a loopback port, answering /api/v1/status with a fake."""
    for _ in range(20):
        try:
            server = HTTPServer(("127.0.0.1", free_port()), _Squat)
            break
        except OSError:  # the port was taken meanwhile: take another
            continue
    else:
        pytest.fail("no free loopback port for the squatter")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _status_cli(cfg: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "RUNTIME_DIRECTORY"}
    return subprocess.run(
        [*GPUWATCHD, "status", "-c", str(cfg), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_a_squatted_port_neither_stops_monitoring_nor_fools_status(
    tmp_path: Path, squatter: HTTPServer
) -> None:
    port = squatter.server_address[1]
    kmsg = KmsgFile(tmp_path / "kmsg.dump")
    config = f"""node_name: real-node
state_dir: {tmp_path / "state"}
sources: {{kernel_log: kmsg, kmsg_path: {kmsg.path}, nvml_events: false}}
"""
    d = Daemon(tmp_path, config, STEADY, port=port)
    d.start(wait=False)
    try:
        sock = tmp_path / "state" / "status.sock"
        wait_until(sock.exists, 20, f"the status socket: {d.output()[-2000:]}")
        time.sleep(1.0)
        assert d.proc is not None and d.proc.poll() is None, d.output()
        assert "cannot listen on 127.0.0.1:" in d.output()
        # monitoring goes on: a kernel XID becomes a firing alert
        kmsg.xid(1, 79)

        def firing() -> list[str]:
            doc = read_verified(str(sock), 5.0)
            return [a["rule"] for a in doc["status"]["alerts"]]

        wait_until(firing, 20, "XID 79 alert while the port is squatted")
        # `status` asks the daemon over its socket, not the squatter over HTTP
        res = _status_cli(d.cfg)
        assert "node real-node" in res.stdout, res.stdout + res.stderr
        assert "http: NOT listening on 127.0.0.1:" in res.stdout
        assert "fake" not in res.stdout and "\x1b" not in res.stdout
        assert res.returncode in (0, 1), res.stderr  # the verdict, not "cannot tell"
        # asked over HTTP on purpose, the squatter's escapes never reach the terminal
        res = _status_cli(d.cfg, "--url", f"http://127.0.0.1:{port}")
        assert "node fake\\x1b[2J\\x1b]0;owned\\x07" in res.stdout, res.stdout
        assert not any(c in res.stdout for c in "\x1b\x07"), res.stdout
    finally:
        d.stop()


def test_status_refuses_a_socket_anyone_could_have_made(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp
    server = StatusSocket(str(shared / "status.sock"), lambda: {"status": FAKE})
    assert server.start()
    try:
        with pytest.raises(StatusSocketError, match="writable by others"):
            read_verified(str(shared / "status.sock"), 2.0)
    finally:
        server.stop()
    own = tmp_path / "own"
    own.mkdir(mode=0o755)
    server = StatusSocket(str(own / "status.sock"), lambda: {"status": FAKE})
    assert server.start()
    try:
        assert verify(str(own / "status.sock")) == os.getuid()
        assert read_verified(str(own / "status.sock"), 2.0)["status"]["version"] == "9.9"
    finally:
        server.stop()
    assert not (own / "status.sock").exists()
    (own / "status.sock").write_text("not a socket")  # never removed, never served
    assert not StatusSocket(str(own / "status.sock"), lambda: {}).start()
    assert (own / "status.sock").read_text() == "not a socket"


def test_printable_escapes_every_control_character() -> None:
    assert printable("ok") == "ok"
    assert printable(ESC) == "\\x1b[2J\\x1b]0;owned\\x07"
    assert printable("a\u009bb\x7f") == "a\\x9bb\\x7f"
    assert clean({"k\x1b": ["\x1b", 1, None]}) == {"k\\x1b": ["\\x1b", 1, None]}


def test_the_listener_retries_until_the_port_is_free() -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    up: list[object] = []
    stop = threading.Event()

    class Server:
        url = f"http://127.0.0.1:{port}"

        def __init__(self) -> None:
            self.sock = socket.socket()
            try:
                self.sock.bind(("127.0.0.1", port))
            except OSError:
                self.sock.close()
                raise

        def start(self) -> None:
            return None

    listener = RetryingListener(Server, up.append, stop, retry_every=0.05, where=f":{port}")
    try:
        assert listener.start() is False
        assert listener.describe()["listening"] is False and listener.problem
        time.sleep(0.2)
        assert up == []
        holder.close()
        wait_until(lambda: up, 5, "bound once the port is free")
        assert listener.describe() == {"listening": True, "problem": None, "where": f":{port}"}
    finally:
        stop.set()
        holder.close()
        for server in up:
            assert isinstance(server, Server)
            server.sock.close()
