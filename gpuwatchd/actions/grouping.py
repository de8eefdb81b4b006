"""Aggregation groups: what one flush of a group sends (pure; the outbox does the SQL).

A group is one receiver's alerts that share the route's ``group_by`` labels. Its first
message leaves at once; changes within ``group_wait`` after a message are folded into one
``update`` at the end of that window (the rest of a cascade: XID 79, then GPU lost, then
NVLink down); a group that still fires is sent again every ``repeat_interval``
(``repeat``). Every time here is on the monotonic clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.model import SEVERITY_RANK, notification_key

NOTIFY = "notify"  # the first message of a group
UPDATE = "update"  # what changed within group_wait after a message, folded into one
REPEAT = "repeat"  # still firing after repeat_interval


@dataclass(frozen=True)
class Member:
    """One alert of a group, as the outbox holds it."""

    fingerprint: str
    state: str  # firing | resolved
    changed: bool  # since the group's last message
    key: str  # the idempotency key of its latest transition
    received: float  # wall clock: when that transition reached the outbox
    record: Mapping[str, Any]


@dataclass(frozen=True)
class Message:
    """A notification to queue for every target of the receiver."""

    note: dict[str, Any]
    key: str
    received: float
    severity_rank: int


def next_flush(now: float, last_flush: float | None, group_wait: float) -> float:
    """When a change seen at ``now`` (monotonic) is sent: at once when the group sent
    nothing within the last ``group_wait``, else at the end of that window."""
    if last_flush is None:
        return now
    return max(now, last_flush + group_wait)


def plan_flush(
    *,
    receiver: str,
    gkey: str,
    group_labels: Mapping[str, str],
    node: str,
    members: Sequence[Member],
    repeat: bool,
    first: bool,
    send_resolved: bool,
    muted: Callable[[Mapping[str, Any]], bool],
    now: float,
    wall_now: float,
) -> Message | None:
    """The message one flush sends, or None when there is nothing to say.

    Alerts a silence started to mute after they were sent are left out (Alertmanager
    does the same); their resolve still goes out."""
    firing = [m for m in members if m.state == "firing" and not muted(m.record)]
    if repeat:
        changed: list[Member] = []
        chosen = firing
        kind = REPEAT
    else:
        changed = [m for m in members if m.changed]
        if not changed:
            return None
        resolved = [m for m in changed if m.state == "resolved" and send_resolved]
        chosen = firing + resolved
        kind = NOTIFY if first else UPDATE
    if not chosen:
        return None
    alerts = [dict(m.record) for m in chosen]
    status = "firing" if any(a["state"] == "firing" for a in alerts) else "resolved"
    note = {
        "receiver": receiver,
        "group_key": gkey,
        "group_labels": dict(group_labels),
        "status": status,
        "kind": kind,
        "node": node,
        "alerts": alerts,
        # the alerts this message is news about (PagerDuty sends events for these only)
        "changed": [m.fingerprint for m in changed if m in chosen]
        if changed
        else [m.fingerprint for m in chosen],
    }
    keys = [m.key for m in changed] if changed else [f"repeat@{now:.6f}"]
    received = min((m.received for m in changed), default=wall_now)
    rank = max(SEVERITY_RANK.get(str(a["severity"]), 0) for a in alerts)
    return Message(note, notification_key(receiver, gkey, keys), received, rank)
