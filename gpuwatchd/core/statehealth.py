"""Whether the daemon's state in ``state_dir`` is really being written: one place that
renders it for every store, so an operator sees a full or read-only disk on /metrics.

Stores: ``outbox`` (deliveries and drains, ``actions.db``), ``rules`` (alert states and
counter history, ``rules.sqlite3``), ``journald_position`` / ``kmsg_position`` (where the
kernel-log reader resumes). Each reports whether its last write reached the disk and how
many writes failed; the daemon keeps running on memory while one cannot write.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuwatchd.core.families import Families

__all__ = ["StoreHealth", "state_families"]


@dataclass(frozen=True)
class StoreHealth:
    name: str
    durable: bool  # False: the state lives in memory only (lost at a restart)
    write_errors: int
    detail: str = ""
    set_aside: int = 0  # files moved aside and rows skipped as unusable


def state_families(fams: Families, stores: Iterable[StoreHealth]) -> None:
    durable = fams.get(
        "gpuwatchd_state_durable",
        "gauge",
        "1 while the store writes its state to state_dir; 0 while it keeps it in memory only "
        "(disk full, read-only, file deleted or damaged): it is lost at a restart until the "
        "disk recovers.",
        ["store"],
    )
    errors = fams.get(
        "gpuwatchd_state_write_errors_total",
        "counter",
        "Writes of the store to state_dir that failed.",
        ["store"],
    )
    aside = fams.get(
        "gpuwatchd_state_set_aside_total",
        "counter",
        "State files moved aside (a link, FIFO or directory where a database belongs) and "
        "saved rows skipped (wrong types) instead of failing the start; logged.",
        ["store"],
    )
    for s in stores:
        durable.add([s.name], 1.0 if s.durable else 0.0)
        errors.add([s.name], float(s.write_errors))
        aside.add([s.name], float(s.set_aside))
