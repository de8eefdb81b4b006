"""The network seam of the actions stage: a ``Sender`` takes one rendered message for one
receiver target and says how it went.

``HttpSender`` sends over httpx (one keep-alive client per receiver target; an httpx
``transport`` may be given, as tests and benchmarks do). ``RecordingSender``
(``gpuwatchd.actions.recording``) records the message instead; ``simulate`` and ``demo``
use it. Nothing else in the stage knows how a message leaves the node.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gpuwatchd.actions.answers import (
    AnswerTooLate,
    DeadlineBackend,
    deadline_transport,
    read_answer,
)
from gpuwatchd.actions.receivers import HttpRequest, Outcome, Receiver
from gpuwatchd.actions.secrets import redact


@dataclass(frozen=True)
class Outgoing:
    """One message for one target of one receiver: the notifications it carries (more
    than one when a coalescing receiver merges them), its idempotency key, and the HTTP
    requests it was rendered into (PagerDuty: one event per alert)."""

    receiver: Receiver
    target: int
    notes: list[dict[str, Any]]
    key: str
    requests: list[HttpRequest]


class Sender(Protocol):
    """Where rendered messages go."""

    @property
    def needs_secrets(self) -> bool:
        """False when nothing really leaves the node: receiver secrets are not read."""
        ...

    def send(self, out: Outgoing, now: float) -> Outcome:
        """Deliver every request of ``out`` in order; the first that is not ``ok`` decides."""
        ...

    def forget(self, receiver: str) -> None:
        """Drop what is kept for a receiver (connections): a reload changed it."""
        ...

    def close(self) -> None: ...


class HttpSender:
    """Sends over HTTP with httpx; never follows redirects nor reads proxy settings. Each
    attempt has one deadline (the receiver's ``timeout``) and reads a bounded, never
    inflated answer (``answers``)."""

    needs_secrets = True

    def __init__(self, transport: httpx.BaseTransport | None = None) -> None:
        self.transport = transport
        self._backend = DeadlineBackend()
        self._clients: dict[tuple[str, int], httpx.Client] = {}
        self._lock = threading.Lock()

    def _client(self, rcv: Receiver, target: int) -> httpx.Client:
        with self._lock:
            client = self._clients.get((rcv.name, target))
            if client is None:
                client = httpx.Client(
                    transport=self.transport or deadline_transport(self._backend),
                    timeout=httpx.Timeout(rcv.timeout),
                    follow_redirects=False,
                    trust_env=False,
                )
                self._clients[(rcv.name, target)] = client
            return client

    def warm(self, receivers: Iterable[Receiver]) -> None:
        """Build every target's client now, at start-up: the first httpx client of a
        process loads the CA store (tens of milliseconds), which the first page would
        otherwise wait for (seen on the real H100: 41-72 ms cold against ~5 ms warm)."""
        for rcv in receivers:
            for target in range(len(rcv.targets)):
                self._client(rcv, target)

    def send(self, out: Outgoing, now: float) -> Outcome:
        rcv = out.receiver
        outcome = Outcome("ok")
        for req in out.requests:
            client = self._client(rcv, out.target)
            try:
                with (
                    self._backend.attempt(rcv.timeout) as deadline,
                    client.stream(
                        req.method,
                        req.url,
                        headers={**req.headers, "Accept-Encoding": "identity"},
                        content=req.body,
                    ) as resp,
                ):
                    body = read_answer(resp, deadline)
            except AnswerTooLate:
                return Outcome("retry", None, f"the answer did not end within {rcv.timeout:g}s")
            except (httpx.HTTPError, OSError) as exc:
                return Outcome("retry", None, redact(f"{type(exc).__name__}: {exc}", rcv.secrets))
            headers: Mapping[str, str] = {k.lower(): v for k, v in resp.headers.items()}
            outcome = rcv.classify(resp.status_code, headers, body, now)
            if outcome.kind != "ok":
                snippet = redact(" ".join(body.split())[:200], rcv.secrets)
                detail = outcome.detail + (f": {snippet}" if snippet else "")
                return Outcome(outcome.kind, outcome.retry_after, detail)
        return outcome

    def forget(self, receiver: str) -> None:
        """Close the clients of a receiver that left the config (a reload)."""
        with self._lock:
            for key in [k for k in self._clients if k[0] == receiver]:
                self._clients.pop(key).close()

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
