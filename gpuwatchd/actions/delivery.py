"""Delivery: sending the pending messages of one receiver target, in order.

``TargetDelivery.step()`` sends the next due message of its target and returns when to
look again (monotonic seconds). It keeps the receiver's rules: a timeout per request,
exponential backoff with jitter, ``Retry-After`` and a least interval between messages
(Slack) hold the whole target back, messages older than ``routing.give_up_after`` are
dropped as expired, a permanent 4xx drops the message (a PagerDuty 400 first gets one
more try with a trimmed payload), and a coalescing receiver (Slack) merges what waits
into one message (never a page's firing with its resolve). Every timer is on the
monotonic clock.
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.actions.grouping import mergeable
from gpuwatchd.actions.metrics import ActionMetrics
from gpuwatchd.actions.model import short_hash
from gpuwatchd.actions.outbox import TRIMMED, Outbox
from gpuwatchd.actions.receivers import Outcome, Receiver
from gpuwatchd.actions.secrets import redact
from gpuwatchd.actions.store import loads
from gpuwatchd.actions.transport import Outgoing, Sender
from gpuwatchd.config.actions import RoutingConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.eventlog import log_delivery

log = logging.getLogger(__name__)

COALESCE_MAX = 20  # notifications merged into one message by a coalescing receiver


@dataclass
class InFlight:
    """Delivery ids being sent right now (the queue bound never drops them)."""

    ids: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> set[int]:
        with self.lock:
            return set(self.ids)


@dataclass
class TargetHealth:
    """What the status API shows per receiver."""

    last_success: float | None = None
    last_error: str | None = None


def backoff(routing: RoutingConfig, attempts: int, rng: random.Random) -> float:
    """Exponential from ``retry_initial``, capped at ``retry_max``, with 50-100 % jitter."""
    base = min(routing.retry_max, routing.retry_initial * 2.0 ** max(0, attempts - 1))
    return base * (0.5 + rng.random() / 2)


class TargetDelivery:
    def __init__(
        self,
        receiver: Receiver,
        target: int,
        *,
        outbox: Outbox,
        sender: Sender,
        clock: Clock,
        metrics: ActionMetrics,
        health: TargetHealth,
        inflight: InFlight,
        rng: random.Random,
        on_change: Callable[[], None],
    ) -> None:
        self.receiver = receiver
        self.target = target
        self.outbox = outbox
        self.sender = sender
        self.clock = clock
        self.metrics = metrics
        self.health = health
        self.inflight = inflight
        self.rng = rng
        self.on_change = on_change  # the queue changed: refresh the queued gauges
        self.blocked_until = 0.0  # monotonic: Retry-After or the least interval
        self.retired = False  # the receiver left the config (a reload)

    @property
    def name(self) -> str:
        return self.receiver.name

    def step(self) -> float | None:
        """Send the next due message; the monotonic time to look again (None: idle)."""
        mono = self.clock.monotonic()
        heads = self.outbox.heads(self.name, self.target)
        if not heads:
            return None
        if mono < self.blocked_until:
            return self.blocked_until
        give_up = self.outbox.routing.give_up_after
        expired = [h for h in heads if mono - float(h["created"]) > give_up]
        if expired:
            self._drop([int(h["id"]) for h in expired], "expired", "not delivered in time")
            return mono
        due = [h for h in heads if float(h["next_attempt"]) <= mono]
        if not due:
            return min(float(h["next_attempt"]) for h in heads)
        rows = [due[0]]
        if self.receiver.coalesce:
            rows = self.outbox.batch(self.name, self.target, COALESCE_MAX)
            rows = rows[: max(1, mergeable([loads(r["body"]) for r in rows]))]
        self._attempt(rows)
        return self.clock.monotonic()

    def _attempt(self, rows: list[sqlite3.Row]) -> None:
        rcv = self.receiver
        ids = [int(r["id"]) for r in rows]
        notes: list[dict[str, Any]] = [loads(r["body"]) for r in rows]
        key = rows[0]["key"] if len(rows) == 1 else short_hash(*(r["key"] for r in rows))
        trimmed = any(r["outcome"] == TRIMMED for r in rows)
        with self.inflight.lock:
            self.inflight.ids.update(ids)
        started = self.clock.monotonic()
        try:
            outcome = self._send(notes, key, trimmed)
        finally:
            with self.inflight.lock:
                self.inflight.ids.difference_update(ids)
        done, mono = self.clock.now(), self.clock.monotonic()
        if outcome.kind == "ok":
            self.outbox.mark_sent(ids, done)
            self.metrics.add_sent(rcv.name, [done - float(r["received"]) for r in rows])
            log_delivery(rcv.name, rcv.kind, notes, mono - started)  # info line per delivery
            self.health.last_success = done
            if rcv.min_interval:
                self.blocked_until = mono + rcv.min_interval
        elif outcome.kind == "trim" and not trimmed:
            self.metrics.add_failed(rcv.name)
            self.health.last_error = outcome.detail
            log.warning(
                "delivery to %s refused (%s); retrying once with a trimmed payload",
                rcv.name,
                outcome.detail,
            )
            self.outbox.mark_retry(ids, mono, outcome.detail, trim=True)
        elif outcome.kind in ("reject", "trim"):
            self.metrics.add_failed(rcv.name)
            self.health.last_error = outcome.detail
            self._drop(ids, "rejected", outcome.detail)
        else:
            self.metrics.add_failed(rcv.name)
            self.health.last_error = outcome.detail
            attempts = max(int(r["attempts"]) for r in rows) + 1
            delay = (
                outcome.retry_after
                if outcome.retry_after is not None
                else backoff(self.outbox.routing, attempts, self.rng)
            )
            self.outbox.mark_retry(ids, mono + delay, outcome.detail)
            if outcome.retry_after is not None:
                self.blocked_until = mono + delay
            log.warning(
                "delivery to %s failed (attempt %d): %s; retrying in %.1fs",
                rcv.name,
                attempts,
                outcome.detail,
                delay,
            )
        self.on_change()

    def _send(self, notes: list[dict[str, Any]], key: str, trimmed: bool) -> Outcome:
        rcv = self.receiver
        now = self.clock.now()
        try:
            requests = rcv.render_all(notes, self.target, key, now, trimmed=trimmed)
        except Exception as exc:  # a payload we cannot build will never be sent
            log.exception("rendering a notification for %s", rcv.name)
            return Outcome("reject", None, f"cannot render: {type(exc).__name__}")
        out = Outgoing(rcv, self.target, notes, key, requests)
        outcome = self.sender.send(out, now)
        if outcome.detail:
            outcome = Outcome(
                outcome.kind, outcome.retry_after, redact(outcome.detail, rcv.secrets)
            )
        return outcome

    def _drop(self, ids: list[int], reason: str, detail: str) -> None:
        self.outbox.drop(ids, reason, detail, self.clock.now())
        self.metrics.add_dropped(self.name, reason, len(ids))
        log.error("gave up %d delivery(ies) to %s (%s): %s", len(ids), self.name, reason, detail)
        self.on_change()
