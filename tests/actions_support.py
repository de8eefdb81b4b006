"""Helpers for the actions tests: a real HTTP receiver on loopback, transitions, configs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuwatchd.actions import ActionsSink, build_actions
from gpuwatchd.configfile.loader import Config, load_config
from gpuwatchd.configfile.stages import for_actions
from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import DrainOutcome
from gpuwatchd.rules import default_rule_files, load_rule_set
from gpuwatchd.rules.engine import Engine
from gpuwatchd.rules.store import StateStore

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class BackloggedServer(ThreadingHTTPServer):
    """A listen backlog for many senders at once (the default, 5, resets connections when
    50 daemons page in the same moment)."""

    request_queue_size = 128


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


Responder = Callable[[Received], tuple[int, dict[str, str], bytes]]


def ok(req: Received) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "text/plain"}, b"ok"


@dataclass
class HttpReceiver:
    """A real HTTP server on 127.0.0.1 that records every request it answers."""

    port: int  # 0: one the OS picks; start() sets the real one
    respond: Responder = ok
    requests: list[Received] = field(default_factory=list)
    rejected: list[Received] = field(default_factory=list)  # answered with a non-2xx
    server: ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    connections: set[socket.socket] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HttpReceiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                with outer.lock:
                    outer.connections.add(self.connection)

            def finish(self) -> None:
                with outer.lock:
                    outer.connections.discard(self.connection)
                super().finish()

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                req = Received(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    time.time(),
                )
                code, headers, out = outer.respond(req)
                if 200 <= code < 300:
                    with outer.lock:
                        outer.requests.append(req)
                else:
                    with outer.lock:
                        outer.rejected.append(req)
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            do_POST = _handle
            do_GET = _handle
            do_PATCH = _handle

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = BackloggedServer(("127.0.0.1", self.port), Handler)
        self.port = int(self.server.server_address[1])  # port 0: the one the OS picked
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open (keep-alive) connection: a real outage."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
        with self.lock:
            conns = list(self.connections)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Received]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.requests) >= n:
                    return list(self.requests)
            time.sleep(0.005)
        with self.lock:
            raise AssertionError(f"got {len(self.requests)} requests, wanted {n}: {self.requests}")


def transition(
    rule: str = "gpu_xid_fatal",
    state: AlertState = AlertState.FIRING,
    *,
    severity: AlertSeverity = AlertSeverity.PAGE,
    gpu: int = 3,
    node: str = "node17",
    seq: int = 1,
    at: float = T0,
    since: float | None = None,
    drain: bool = False,
    xid: int | None = 79,
    value: float | None = 79.0,
    annotations: dict[str, str] | None = None,
    routes: tuple[str, ...] = (),
    extra: dict[str, str] | None = None,
) -> AlertTransition:
    labels = {
        "node": node,
        "gpu": str(gpu),
        "uuid": f"GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a1{gpu % 10}",
        "pci_bus_id": f"00000000:{0x3B + gpu:02X}:00.0",
        "model": "NVIDIA H200",
    }
    if xid is not None:
        labels["xid"] = str(xid)
    labels.update(extra or {})
    return AlertTransition(
        rule=rule,
        state=state,
        severity=severity,
        labels=labels,
        annotations=annotations
        if annotations is not None
        else {
            "summary": f"XID {xid} on GPU {gpu}" if xid else f"{rule} on GPU {gpu}",
            "xid_meaning": "GPU has fallen off the bus",
            "xid_action": "Drain the node and reset the GPU",
        },
        value=value,
        active_since=at if since is None else since,
        timestamp=at,
        drain=drain,
        routes=routes,
        sequence=seq,
    )


def make_config(tmp_path: Path, text: str, name: str = "gpuwatchd.yaml") -> Config:
    path = tmp_path / name
    body = f"node_name: node17\nstate_dir: {tmp_path / 'state'}\n" + text
    path.write_text(body)
    return load_config(str(path), must_exist=True, environ={})


class DrainRules:
    """The rule stage a sink tested alone lacks: the shipped drain rules
    (``rules/drain.yaml``) judge each drain outcome the moment it is reported, and what they
    fire or resolve goes to the sink, as the daemon's evaluator does through the hand-off.
    The node is the drain's node: the fleet tests run many nodes' sinks from one config
    (one ``node_name``, a ``drain.node`` each), where every real daemon has its own name."""

    def __init__(self, node: str, clock: Clock) -> None:
        files = [f for f in default_rule_files() if os.path.basename(f) == "drain.yaml"]
        self.clock = clock
        self.engine = Engine(load_rule_set(files), StateStore(":memory:", boot_id="t"), clock)
        self.state = NodeState(node, clock.now())
        self.sink: ActionsSink | None = None
        self._lock = threading.Lock()

    def report(self, outcome: DrainOutcome) -> None:
        with self._lock:
            self.engine.observe(outcome)
            transitions = self.engine.evaluate(self.clock.now(), self.state.view())
            if transitions and self.sink is not None:
                self.sink.deliver(transitions, self.clock.now())


def sink_for(config: Config, clock: Clock, *, start: bool = False, **options: Any) -> ActionsSink:
    """The actions sink ``build_actions`` makes for ``config`` (started with ``start``),
    its drain outcomes judged by the shipped drain rules (``DrainRules``)."""
    settings = for_actions(config)
    rules = DrainRules(settings.drain.node or settings.node_name, clock)
    options.setdefault("report", rules.report)
    sink = build_actions(settings, clock, **options)
    assert sink is not None, "the config has no receivers and no drain"
    rules.sink = sink
    if start:
        sink.start()
    return sink


def actions(sink: ActionsSink) -> dict[str, float]:
    """The drain stage's action counters (``gpuwatchd_drain_actions_total``) by label set."""
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    out = {}
    for line in fams.render().decode().splitlines():
        if line.startswith("gpuwatchd_drain_actions_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split("{", 1)[1].rstrip("}")] = float(value)
    return out
