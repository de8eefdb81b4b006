"""``RecordingSender``: a ``Sender`` that records each message instead of sending it.

``simulate`` and ``demo`` print what would have been sent; tests read ``records``. The
record is the notification as the outbox built it (receiver, status, kind, alerts), not
the rendered HTTP body, so it never holds a secret and does not depend on receiver
formats. Receiver secrets are not read (``needs_secrets`` is False).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpuwatchd.actions.receivers import Outcome
from gpuwatchd.actions.transport import Outgoing

Emit = Callable[[dict[str, Any]], None]


def notification_record(out: Outgoing) -> dict[str, Any]:
    """The JSON line ``simulate`` prints for one message."""
    last = out.notes[-1]
    return {
        "record": "notification",
        "receiver": out.receiver.name,
        "type": out.receiver.kind,
        "target": out.target,
        "status": last["status"],
        "kind": last["kind"],
        "key": out.key,
        "alerts": [
            {
                "rule": a["rule"],
                "state": a["state"],
                "severity": a["severity"],
                "gpu": (a.get("labels") or {}).get("gpu"),
            }
            for n in out.notes
            for a in n["alerts"]
        ],
    }


class RecordingSender:
    """Acknowledges every message at once and keeps (or hands to ``emit``) its record."""

    needs_secrets = False

    def __init__(self, emit: Emit | None = None) -> None:
        self.emit = emit
        self.records: list[dict[str, Any]] = []
        self.sent: list[Outgoing] = []  # with the rendered requests, for tests
        self._lock = threading.Lock()

    def send(self, out: Outgoing, now: float) -> Outcome:
        record = notification_record(out)
        with self._lock:
            self.records.append(record)
            self.sent.append(out)
        if self.emit is not None:
            self.emit(record)
        return Outcome("ok")

    def forget(self, receiver: str) -> None:
        pass

    def close(self) -> None:
        pass
