"""A socket that starts one ``gpuwatchd drain-helper serve`` per connection, as systemd's
``gpuwatchd-drain.socket`` does (tests/actions/test_drainhelper.py,
tests/fleet/test_fleet_budget.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT


@pytest.fixture
def helper_socket(tmp_path: Path) -> Iterator[tuple[str, list[subprocess.CompletedProcess[bytes]]]]:
    """A listening socket that starts one `drain-helper serve` per connection (Accept=yes)."""
    directory = Path(f"/tmp/gpuwatchd-drain-test-{os.getpid()}")
    directory.mkdir(mode=0o755, exist_ok=True)
    path = str(directory / "drain.sock")
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o666)
    listener.listen(4)
    listener.settimeout(0.2)
    served: list[subprocess.CompletedProcess[bytes]] = []
    stop = threading.Event()

    def accept_loop() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                args = json.loads((tmp_path / "helper-args.json").read_text())
                served.append(
                    subprocess.run(
                        [*GPUWATCHD, "drain-helper", "serve", *args],
                        stdin=conn.fileno(),
                        capture_output=True,
                        cwd=ROOT,
                        timeout=60,
                        check=False,
                    )
                )

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    yield path, served
    stop.set()
    thread.join(5)
    listener.close()
    os.unlink(path)
    directory.rmdir()
