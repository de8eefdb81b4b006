"""Shared fixtures: free ports, the daemon as a subprocess, real Prometheus."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPUWATCHD = [sys.executable, "-m", "gpuwatchd"]

# Tests never read the host's /etc/gpuwatchd (a host with the package installed has site
# rules there): this process and every daemon it starts look in an empty directory instead.
_SITE = Path(tempfile.mkdtemp(prefix="gpuwatchd-test-etc-"))
os.environ["GPUWATCHD_CONFIG_DIR"] = str(_SITE)
# Nor its /var/lib/gpuwatchd: a daemon built from a default config keeps its state here.
os.environ["STATE_DIRECTORY"] = tempfile.mkdtemp(prefix="gpuwatchd-test-state-")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden", action="store_true", help="rewrite golden files from the current output"
    )


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


_GIVEN: set[int] = set()  # ports free_port handed out in this process


def free_port() -> int:
    """A loopback port free now, never one handed out before in this process (50 daemons
    started side by side drew the same port from the kernel: a 4 % chance a run)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port
    raise AssertionError("no loopback port that was not handed out already")


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds the TCP socket listening on ``port`` (loopback tests:
    a port picked free may be taken by another process before the daemon binds it, and then
    whatever answers there is not the daemon under test)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(parts[9])
    fds = f"/proc/{pid}/fd"
    try:
        names = os.listdir(fds)
    except OSError:
        return False
    for name in names:
        try:
            link = os.readlink(os.path.join(fds, name))
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            return True
    return False


def wait_http(url: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except Exception as exc:
            if isinstance(exc, urllib.error.HTTPError):
                exc.close()  # an HTTPError holds the response's socket open until collected
            last = exc
            time.sleep(0.05)
    raise AssertionError(f"{url} did not answer within {timeout}s: {last}")


def need_binary(name: str) -> str:
    """A real tool the test needs; a missing one fails the test and says why."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: run scripts/test.sh --setup (apt package needed)")
    return path


class Proc:
    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.log = log
        self._fh = open(log, "wb")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            args, stdout=self._fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._fh.close()
        return self.popen.returncode


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    procs: list[Proc] = []

    def start(*extra: str, port: int | None = None) -> tuple[Proc, str]:
        for _ in range(3 if port is None else 1):
            chosen = port or free_port()
            env = dict(os.environ, STATE_DIRECTORY=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
            proc = Proc(
                [*GPUWATCHD, "run", "--listen", f"127.0.0.1:{chosen}", *extra],
                tmp_path / f"gpuwatchd-{chosen}.log",
                env,
            )
            procs.append(proc)
            url = f"http://127.0.0.1:{chosen}"
            try:
                wait_http(url + "/healthz")
            except AssertionError as exc:
                proc.stop()
                raise AssertionError(f"{exc}\ndaemon output:\n{proc.output()}") from None
            if port is not None or listens_on(proc.popen.pid, chosen):
                return proc, url
            proc.stop()  # another process took the port first: answers there are not ours
        raise AssertionError("three ports in a row taken by another process")

    yield start
    for proc in procs:
        proc.stop()
