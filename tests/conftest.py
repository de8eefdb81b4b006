"""Shared fixtures: free ports, the daemon as a subprocess, real Prometheus."""

from __future__ import annotations

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def start_alertmanager(work: Path, config_text: str) -> tuple[Proc, str]:
    """A real Alertmanager with ``config_text`` as its config, its files under ``work``;
    returns the process and its URL once it answers ``/-/ready``."""
    binary = need_binary("prometheus-alertmanager")
    port = free_port()
    (work / "data").mkdir(parents=True)
    (work / "am.yml").write_text(config_text)
    proc = Proc(
        [
            binary,
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        work / "am.log",
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", timeout=20)
    except AssertionError as exc:
        proc.stop()
        pytest.fail(f"Alertmanager did not start: {exc}\n{proc.output()}")
    return proc, url


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[object]:
    procs: list[Proc] = []

    def start(*extra: str, port: int | None = None) -> tuple[Proc, str]:
        port = port or free_port()
        env = dict(os.environ, STATE_DIRECTORY=str(tmp_path / "state"), PYTHONUNBUFFERED="1")
        proc = Proc(
            [*GPUWATCHD, "run", "--listen", f"127.0.0.1:{port}", *extra],
            tmp_path / f"gpuwatchd-{port}.log",
            env,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(url + "/healthz")
        except AssertionError as exc:
            proc.stop()
            raise AssertionError(f"{exc}\ndaemon output:\n{proc.output()}") from None
        return proc, url

    yield start
    for proc in procs:
        proc.stop()
