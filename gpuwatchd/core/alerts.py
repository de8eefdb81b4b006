"""Alert transitions: what the rule engine decides and the actions stage delivers.

The rule engine emits an ``AlertTransition`` whenever an alert (one rule applied to one
series: a GPU, a link, an XID incident) changes state. Everything downstream (simulate's
output, the durable outbox, receivers, the drain hook) consumes these and nothing else.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.digest import sha256_hex


class AlertState(enum.Enum):
    INACTIVE = "inactive"
    PENDING = "pending"  # condition true, waiting for `for`
    FIRING = "firing"
    RESOLVED = "resolved"


class AlertSeverity(enum.Enum):
    """How urgently a human must act. Documented in docs/rules.md."""

    PAGE = "page"  # wake someone now
    TICKET = "ticket"  # someone should look within a working day
    INFO = "info"  # recorded and shown, nobody is notified by default

    @property
    def rank(self) -> int:
        return {"page": 3, "ticket": 2, "info": 1}[self.value]


def fingerprint(rule: str, labels: Mapping[str, str]) -> str:
    """A stable id for one alert (rule + identifying labels); 16 hex digits."""
    blob = json.dumps([rule, sorted(labels.items())], separators=(",", ":"))
    return sha256_hex(blob.encode())[:16]


@dataclass(frozen=True)
class AlertTransition:
    rule: str
    state: AlertState  # the new state: PENDING, FIRING or RESOLVED
    severity: AlertSeverity
    labels: Mapping[str, str]  # node, gpu, uuid, pci_bus_id, model, [link], [xid], + rule's
    annotations: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    value: float | None = None  # the value that made the condition true (or last seen)
    active_since: float = 0.0  # when the alert became pending
    timestamp: float = 0.0  # when this transition happened
    drain: bool = False  # the rule asks for the node to be drained while firing
    routes: tuple[str, ...] = ()  # receiver names; empty means the default route
    sequence: int = 0  # per-alert transition counter (1, 2, ...): keeps order and dedup keys

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.rule, self.labels)

    @property
    def idempotency_key(self) -> str:
        """Stable per alert and transition: a receiver can drop a repeat delivery."""
        return f"{self.fingerprint}-{self.sequence}-{self.state.value}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "record": "alert",
            "rule": self.rule,
            "state": self.state.value,
            "severity": self.severity.value,
            "gpu": self.labels.get("gpu"),
            "labels": dict(sorted(self.labels.items())),
            "annotations": dict(sorted(self.annotations.items())),
            "value": self.value,
            "active_since": self.active_since,
            "timestamp": self.timestamp,
            "drain": self.drain,
            "routes": list(self.routes),
            "fingerprint": self.fingerprint,
            "sequence": self.sequence,
        }
