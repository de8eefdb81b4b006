"""Aggregation groups: what one flush of a group sends (pure; the outbox does the SQL).

A group is one receiver's alerts that share the route's ``group_by`` labels. Its first
message leaves at once; changes within ``group_wait`` after a message are folded into one
``update`` at the end of that window (a ticket that flaps, resolves, the NVLink ticket
after a fallen-off-bus page); a group that still fires is sent again every
``repeat_interval`` (``repeat``). Every time here is on the monotonic clock.

A page is never folded: a transition that adds a page to a group flushes the group at
once, whatever it sent in the last ``group_wait``, and the message is headed by the new
page (``notify``). A page that fires and resolves before the group's next message is
still sent firing first (``unsent_page``), and a receiver that merges waiting messages
(Slack) never merges a page's firing with its resolve (``mergeable``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.model import SEVERITY_RANK, notification_key

NOTIFY = "notify"  # the first message of a group, or one that carries a new page
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


PAGE = "page"


def adds_page(record: Mapping[str, Any], state_in_group: str | None) -> bool:
    """Whether a firing transition adds a page to a group: a page-severity alert that was
    not firing there (new, or resolved and not yet sent)."""
    return str(record.get("severity")) == PAGE and state_in_group != "firing"


def unsent_page(record: Mapping[str, Any], state_in_group: str, changed: bool) -> bool:
    """A page firing in a group whose message has not been built yet: when it resolves
    now, the group is flushed first, so that the page is still sent firing."""
    return str(record.get("severity")) == PAGE and state_in_group == "firing" and changed


def next_flush(
    now: float,
    last_flush: float | None,
    group_wait: float,
    *,
    pending: float | None = None,
    urgent: bool = False,
) -> float:
    """When a change seen at ``now`` (monotonic) is sent: at once when it adds a page
    (``urgent``) or when the group sent nothing within the last ``group_wait``; else with
    the flush already planned (``pending``), or at the end of that window."""
    if urgent or last_flush is None:
        return now
    if pending is not None:
        return pending
    return max(now, last_flush + group_wait)


def mergeable(notes: Sequence[Mapping[str, Any]]) -> int:
    """How many of a receiver's waiting messages (oldest first) may be merged into one
    (Slack shows the latest state of each alert): all of them, but never a page's firing
    together with its resolve - the merge stops before the message that resolves a page
    an earlier one of the batch reports firing."""
    firing_pages: set[str] = set()
    for i, note in enumerate(notes):
        if any(
            a["state"] == "resolved" and a["fingerprint"] in firing_pages for a in note["alerts"]
        ):
            return i
        firing_pages.update(
            a["fingerprint"]
            for a in note["alerts"]
            if a["state"] == "firing" and str(a["severity"]) == PAGE
        )
    return len(notes)


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
    does the same); their resolve still goes out. New pages (changed, firing) head the
    message, in the order they fired, and make it a ``notify``."""
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
    fresh = [m for m in changed if m.state == "firing" and m in chosen and _is_page(m)]
    if fresh:
        chosen = fresh + [m for m in chosen if m not in fresh]
        kind = NOTIFY
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


def _is_page(m: Member) -> bool:
    return str(m.record.get("severity")) == PAGE
