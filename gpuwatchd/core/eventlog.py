"""The info-level log lines of what gpuwatchd does: every alert that fires or resolves,
and every notification delivered. (Drains and resumes are logged by the drain controller,
one line per action and result.)

They carry the structured fields of ``logsetup`` (``rule``, ``gpu``, ``xid``, ``pci_bus_id``),
so the journal and the JSON log format can be filtered on them::

    INFO gpuwatchd.alerts: GpuXidFatal firing (page) on GPU 3: XID 79 on GPU 3 ...
    INFO gpuwatchd.alerts: GpuXidFatal resolved (page) on GPU 3
    INFO gpuwatchd.deliveries: delivered to oncall (pagerduty): firing GpuXidFatal [1 alert]
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuwatchd.core.alerts import AlertState, AlertTransition

alerts_log = logging.getLogger("gpuwatchd.alerts")
deliveries_log = logging.getLogger("gpuwatchd.deliveries")

__all__ = ["log_delivery", "log_transitions"]

_FIELDS = ("gpu", "xid", "pci_bus_id", "uuid")


def log_transitions(transitions: Iterable[AlertTransition]) -> None:
    """One info line per firing or resolved transition (pending ones at debug)."""
    for t in transitions:
        level = logging.DEBUG if t.state is AlertState.PENDING else logging.INFO
        if not alerts_log.isEnabledFor(level):
            continue
        gpu = t.labels.get("gpu")
        where = f" on GPU {gpu}" if gpu else ""
        link = t.labels.get("link")
        where += f" link {link}" if link else ""
        summary = t.annotations.get("summary", "") if t.state is AlertState.FIRING else ""
        extra: dict[str, Any] = {k: t.labels[k] for k in _FIELDS if t.labels.get(k)}
        extra["rule"] = t.rule
        alerts_log.log(
            level,
            "%s %s (%s)%s%s",
            t.rule,
            t.state.value,
            t.severity.value,
            where,
            f": {summary}" if summary else "",
            extra=extra,
        )


def log_delivery(
    receiver: str, kind: str, notes: Sequence[Mapping[str, Any]], seconds: float | None = None
) -> None:
    """One info line per notification (or merged batch) a receiver acknowledged."""
    if not deliveries_log.isEnabledFor(logging.INFO):
        return
    rules: list[str] = []
    states: list[str] = []
    count = 0
    for note in notes:
        states.append(str(note.get("status", "?")))
        for a in note.get("alerts") or ():
            count += 1
            rule = str(a.get("rule", "?"))
            if rule not in rules:
                rules.append(rule)
    took = f" in {seconds:.2f}s" if seconds is not None else ""
    deliveries_log.info(
        "delivered to %s (%s): %s %s [%d alert%s]%s",
        receiver,
        kind,
        "/".join(dict.fromkeys(states)),
        ", ".join(rules),
        count,
        "" if count == 1 else "s",
        took,
        extra={"rule": rules[0]} if len(rules) == 1 else {},
    )
