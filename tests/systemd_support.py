"""A real sd_notify socket that records what the daemon says (tests/service/test_systemd.py,
tests/faults/test_fault_gpu.py)."""

from __future__ import annotations

import socket
import threading
import time


class NotifySocket:
    """Binds an AF_UNIX datagram socket and records every message with its arrival time."""

    def __init__(self, address: str) -> None:
        self.address = address  # as it goes into $NOTIFY_SOCKET
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, list[str]]] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._cond:
                self.messages.append((time.monotonic(), data.decode().split("\n")))
                self._cond.notify_all()

    def wait_for(self, assignment: str, timeout: float = 20.0, after: int = 0) -> int:
        """Index of the first message (from ``after`` on) containing ``assignment``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.messages)):
                    if any(
                        a == assignment or a.startswith(assignment) for a in self.messages[i][1]
                    ):
                        return i
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {assignment!r} within {timeout}s: {self.messages}")
                self._cond.wait(left)

    def times(self, assignment: str) -> list[float]:
        with self._cond:
            return [t for t, m in self.messages if assignment in m]

    def all(self) -> list[list[str]]:
        with self._cond:
            return [m for _, m in self.messages]

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.sock.close()
