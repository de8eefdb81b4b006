"""The test lab's own ports (CI, 2026-11-27): tests/fleet/test_fleet_storm.py starts 50
daemons side by side, each on a port ``free_port`` picked. Two drew the same port; the
second could not listen (it logs so and keeps monitoring), and the test read the first
daemon's status as the second's: "drained" for a node that was not. Now ``free_port`` never
hands out a port twice in one process, and a daemon waited for answers only once it holds
its own port, moving to another when something else took it first."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import HTTPServer
from pathlib import Path

import pytest
from conftest import free_port, listens_on
from fault_support import STEADY, Daemon, json_server


@pytest.fixture
def other() -> Iterator[HTTPServer]:
    """Another daemon (or anything) answering on a port: healthy, with its own status."""
    with json_server({"node": "someone-else", "gpus": []}) as server:
        yield server


def test_free_port_never_hands_out_the_same_port_twice() -> None:
    ports = [free_port() for _ in range(3000)]  # main: repeats (the kernel draws at random)
    assert len(set(ports)) == len(ports)


def test_a_daemon_whose_port_was_taken_first_moves_to_another(
    tmp_path: Path, other: HTTPServer
) -> None:
    taken = other.server_address[1]
    d = Daemon(tmp_path, f"node_name: real-node\nstate_dir: {tmp_path / 'state'}\n", STEADY)
    d.port, d.url = taken, f"http://127.0.0.1:{taken}"  # as if free_port had drawn it twice
    d.start()
    try:
        assert d.port != taken  # main: waited for the other server's /healthz, and stayed
        assert listens_on(d.pid, d.port)
        assert d.status()["node"] == "real-node"  # main: "someone-else"
        assert f"cannot listen on 127.0.0.1:{taken}" in d.output()
    finally:
        d.stop()
