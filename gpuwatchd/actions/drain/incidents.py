"""Drain incidents as the outbox database keeps them: one frozen ``Incident`` per row.

The columns are those of ``incidents`` in ``actions/store.py``; ``record`` is the firing
transition's record, decoded. ``load_incidents`` is the one place that reads incident rows.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from gpuwatchd.actions.store import Store, loads


@dataclass(frozen=True)
class Incident:
    """One drain incident (a firing transition of a rule with ``drain=True``)."""

    key: str
    fingerprint: str
    record: dict[str, Any]
    reason: str
    state: str
    opened: float
    drain_at: float
    notified: int
    resolved: float | None
    attempts: int
    next_attempt: float
    last_error: str | None
    drained_at: float | None
    result: str | None
    closed: float | None

    def as_mapping(self) -> dict[str, Any]:
        """The incident as the drivers read it (``key``, ``reason``, ``record``, ...)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def load_incidents(store: Store, where: str, args: tuple[Any, ...] = ()) -> list[Incident]:
    """The incidents matching ``where``, oldest first (ties by key)."""
    rows = store.query(f"SELECT * FROM incidents WHERE {where} ORDER BY opened, key", args)
    out = []
    for r in rows:
        d = dict(r)
        d["record"] = loads(d["record"])
        out.append(Incident(**d))
    return out
