"""Helpers for the fault and abuse suite (tests/test_fault_*.py, tests/test_abuse_*.py):
the real daemon as a subprocess with a given config, metrics parsing, timing, memory.

The numbers the suite measures are printed as ``RELIABILITY <test> key=value ...`` lines
(visible with ``pytest -s``); docs/RELIABILITY.md quotes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

from conftest import GPUWATCHD, ROOT, free_port, listens_on

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample in a text exposition."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        v
        for n, lab, v in samples(text)
        if n == name and all(lab.get(k) == want for k, want in labels.items())
    )


def report(test: str, **values: object) -> None:
    """One line of measurements for docs/RELIABILITY.md."""
    print(f"RELIABILITY {test} " + " ".join(f"{k}={v}" for k, v in values.items()), flush=True)


def wait_until(cond: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {what}")
        time.sleep(step)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


class Daemon:
    """``gpuwatchd run -c CONFIG --backend scenario:SCENARIO`` with its own log file.

    ``start()`` may be called again after ``stop()``/``kill()``: a restart with the same
    state directory.
    """

    def __init__(
        self,
        tmp_path: Path,
        config: str,
        scenario: Path | None,
        *,
        env: dict[str, str] | None = None,
        name: str = "daemon",
        port: int | None = None,
        verbose: bool = True,
    ) -> None:
        self.tmp_path = tmp_path
        self.cfg = tmp_path / f"{name}.yaml"
        self.cfg.write_text(config)
        self.scenario = scenario
        self.chosen_port = port is None  # ours to change if another process takes it
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.env.pop("NOTIFY_SOCKET", None)  # not this test's: only what ``env`` gives
        self.env.pop("JOURNAL_STREAM", None)
        self.env.update(env or {})
        self.name = name
        self.verbose = verbose
        self.runs = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.logs: list[Path] = []
        self.extra: tuple[str, ...] = ()

    def start(self, *, wait: bool = True, extra: tuple[str, ...] = ()) -> Daemon:
        self.runs += 1
        self.logs.append(self.tmp_path / f"{self.name}-{self.runs}.log")
        self.extra = extra
        self._spawn("wb")
        if wait:
            self.wait_ready()
        return self

    def _spawn(self, mode: str) -> None:
        """The daemon process of this run, on ``self.port``, writing to the run's log
        (``wb``: a new run; ``ab``: the same run started again)."""
        argv = [*GPUWATCHD, "run", "-c", str(self.cfg), "--listen", f"127.0.0.1:{self.port}"]
        if self.scenario is not None:
            argv += ["--backend", f"scenario:{self.scenario}"]
        if self.verbose:
            argv.append("-v")
        argv += self.extra
        with self.logs[-1].open(mode) as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT
            )

    def wait_ready(self, timeout: float = 20.0) -> None:
        """Until this daemon answers on its port. A port the harness chose that another
        process took first (the daemon logs it cannot listen, and keeps retrying) is
        changed for a new one and the daemon started again (the same run and log)."""

        def up() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.output()}")
            if self.chosen_port and f"cannot listen on 127.0.0.1:{self.port}" in self._last_log():
                self._move()
                return False
            if not listens_on(self.proc.pid, self.port):
                return False  # not bound yet; whatever answers there is not this daemon
            try:
                self.get("/healthz", timeout=1.0)
                return True
            except urllib.error.HTTPError as exc:
                exc.close()  # its socket, or the collector warns in a later test
                return True  # answering, if not (yet) healthy
            except OSError:
                return False

        wait_until(up, timeout, f"daemon on {self.url}")

    def _last_log(self) -> str:
        return self.logs[-1].read_text(errors="replace") if self.logs else ""

    def _move(self) -> None:
        """Stop this run, and start it again on a new port, appending to its log."""
        assert self.proc is not None
        self.kill()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._spawn("ab")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def get(self, path: str, timeout: float = 5.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
            body: bytes = resp.read()
            return body

    def metrics(self) -> str:
        return self.get("/metrics").decode()

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.get("/api/v1/status"))
        return out

    def output(self) -> str:
        """Everything every run of the daemon logged, in order."""
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait; the exit status."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL: a crash, no shutdown code runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def timed_get(url: str, timeout: float = 5.0) -> tuple[float, int]:
    """(seconds, status) of one GET."""
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            code = resp.status
    except urllib.error.HTTPError as exc:
        exc.read()
        exc.close()
        code = exc.code
    return time.perf_counter() - start, code


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- kernel-log input -----------------------------------------------------------------------
FAULT_RULES = ROOT / "tests" / "data" / "fault-rules.yaml"
STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"
BUSES = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # scenario GPUs 0-7
XID_TEXT = {
    79: "pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
    48: "pid=2011, name=python3, An uncorrectable double bit error (DBE) has been detected",
    31: "pid=4242, name=python3, channel 0x00000009, intr 00000000. MMU Fault",
}


def xid_line(gpu: int, code: int = 79) -> str:
    return f"NVRM: Xid (PCI:0000:{BUSES[gpu]}:00): {code}, {XID_TEXT.get(code, 'test')}"


class KmsgFile:
    """A file of /dev/kmsg records that the daemon follows (``sources.kernel_log: kmsg``,
    ``sources.kmsg_path``): the kmsg path without writing into this machine's real kernel
    log. ``facility=1`` makes a record as the kernel stamps a user-space write."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seq = 0
        path.touch()

    def record(self, message: str, facility: int = 0, level: int = 4) -> str:
        self.seq += 1
        return f"{facility * 8 + level},{self.seq},{self.seq * 1000},-;{message}\n"

    def append(self, *messages: str, facility: int = 0) -> None:
        text = "".join(self.record(m, facility) for m in messages)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(text)

    def xid(self, gpu: int, code: int = 79, facility: int = 0) -> None:
        self.append(xid_line(gpu, code), facility=facility)


def fault_config(state_dir: Path, kmsg: Path, extra: str = "", *, rules: str | None = None) -> str:
    """The daemon on the scenario backend, reading XIDs from a kmsg file, with the fault
    suite's short-lived rule (or ``rules``: a ``rules:`` section of its own)."""
    rules = rules or f"rules: {{defaults: false, files: [{FAULT_RULES}]}}"
    return f"""node_name: fault-node
state_dir: {state_dir}
poll: {{interval: 500ms, call_timeout: 400ms}}
sources: {{kernel_log: kmsg, kmsg_path: {kmsg}, nvml_events: false}}
{rules}
web: {{rate_limit: 0}}
{extra}"""


def webhook_receiver(url: str, name: str = "ops") -> str:
    return f"""receivers:
  - {{name: {name}, type: webhook, url: "{url}/hook"}}
routing:
  group_wait: 0s
  group_by: [node, gpu]
  retry_initial: 100ms
  retry_max: 500ms
"""


def alerts_of(requests: list[Any]) -> list[tuple[str, str, str]]:
    """(alertname, gpu, status) of every alert in every webhook message, in order."""
    return [
        (a["labels"]["alertname"], a["labels"].get("gpu", ""), a["status"])
        for r in requests
        for a in r.json()["alerts"]
    ]


class _JsonHandler(BaseHTTPRequestHandler):
    """Answers every GET with the server's ``doc`` as JSON (200)."""

    server: _JsonServer

    def do_GET(self) -> None:
        body = json.dumps(self.server.doc, ensure_ascii=False).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


class _JsonServer(HTTPServer):
    doc: Any = None


@contextlib.contextmanager
def json_server(doc: Any) -> Iterator[HTTPServer]:
    """Someone else's HTTP server on a free loopback port, answering every GET with
    ``doc`` (a squatter, another daemon): the tests that check we never take its answers
    for the daemon's."""
    for _ in range(20):
        try:
            server = _JsonServer(("127.0.0.1", free_port()), _JsonHandler)
            break
        except OSError:  # the port was taken meanwhile: take another
            continue
    else:
        raise AssertionError("no free loopback port for the server")
    server.doc = doc
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
