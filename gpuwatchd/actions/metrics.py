"""Counters of the actions stage, per receiver, present at 0 from start-up."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable

from gpuwatchd.core.families import Families

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
DROP_REASONS = ("queue_full", "rejected", "expired")


class _Histogram:
    __slots__ = ("count", "counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(LATENCY_BUCKETS, value)
        for j in range(i, len(self.counts)):
            self.counts[j] += 1
        self.total += value
        self.count += 1


class ActionMetrics:
    def __init__(self, receivers: Iterable[str]) -> None:
        self.lock = threading.Lock()
        self.receivers = list(receivers)
        self.sent = dict.fromkeys(self.receivers, 0)
        self.failed = dict.fromkeys(self.receivers, 0)
        self.dropped = {(r, why): 0 for r in self.receivers for why in DROP_REASONS}
        self.latency = {r: _Histogram() for r in self.receivers}
        self.queued = dict.fromkeys(self.receivers, 0)
        self.transitions = 0
        self.duplicates = 0
        self.silenced = 0
        self.silences_active = 0

    def add_receiver(self, receiver: str) -> None:
        """Series at 0 for a receiver a reload added."""
        with self.lock:
            if receiver in self.sent:
                return
            self.receivers.append(receiver)
            self.sent[receiver] = 0
            self.failed[receiver] = 0
            self.dropped.update({(receiver, why): 0 for why in DROP_REASONS})
            self.latency[receiver] = _Histogram()
            self.queued[receiver] = 0

    def add_sent(self, receiver: str, latencies: Iterable[float]) -> None:
        with self.lock:
            for value in latencies:
                self.sent[receiver] += 1
                self.latency[receiver].observe(max(0.0, value))

    def add_failed(self, receiver: str) -> None:
        with self.lock:
            self.failed[receiver] += 1

    def add_dropped(self, receiver: str, reason: str, n: int = 1) -> None:
        with self.lock:
            self.dropped[(receiver, reason)] += n

    def families(self, fams: Families) -> None:
        with self.lock:
            queued = fams.get(
                "gpuwatchd_notifications_queued",
                "gauge",
                "Notifications waiting in the outbox to be delivered, per receiver.",
                ["receiver"],
            )
            sent = fams.get(
                "gpuwatchd_notifications_sent_total",
                "counter",
                "Notifications the receiver acknowledged.",
                ["receiver"],
            )
            failed = fams.get(
                "gpuwatchd_notifications_failed_total",
                "counter",
                "Delivery attempts that failed (network error, timeout, 429, 5xx, rejected).",
                ["receiver"],
            )
            dropped = fams.get(
                "gpuwatchd_notifications_dropped_total",
                "counter",
                "Notifications given up: queue_full (outbox bound, least severe and oldest "
                "first), rejected (a permanent 4xx), expired (routing.give_up_after).",
                ["receiver", "reason"],
            )
            latency = fams.histogram(
                "gpuwatchd_notification_delivery_seconds",
                "Time from a transition reaching the outbox to the receiver acknowledging it.",
                ["receiver"],
                LATENCY_BUCKETS,
            )
            for r in self.receivers:
                queued.add([r], float(self.queued[r]))
                sent.add([r], float(self.sent[r]))
                failed.add([r], float(self.failed[r]))
                for why in DROP_REASONS:
                    dropped.add([r, why], float(self.dropped[(r, why)]))
                h = self.latency[r]
                latency.add_histogram([r], list(h.counts), h.total, h.count)
            fams.get(
                "gpuwatchd_alert_transitions_received_total",
                "counter",
                "Alert transitions written to the outbox (repeats of one already there not "
                "counted).",
                [],
            ).add([], float(self.transitions))
            fams.get(
                "gpuwatchd_alerts_silenced_total",
                "counter",
                "Firing transitions muted by a maintenance silence.",
                [],
            ).add([], float(self.silenced))
            fams.get(
                "gpuwatchd_silences_active",
                "gauge",
                "Maintenance silences in effect now.",
                [],
            ).add([], float(self.silences_active))
