"""``gpuwatchd backtest --from-state``: how the memory rules did on a node's own history.

The backtest scores the rules on generated traces; this reads what really happened on
nodes, from their rule state (``rules.sqlite3`` in the state directory, copied off the
nodes or read in place), so that a site can measure recall and precision on its fleet:

- **uncorrectable errors** (a firing of ``GpuXidFatal`` for XID 48, told by its ``xid``
  label or the shipped summary ``XID 48 on GPU ...``, or of ``GpuEccUncorrectedRising``;
  one per GPU within an hour): preceded on the same GPU by a
  memory page at least an hour before, by a memory drain at least a day before, or by
  neither (a memory page or drain more than 90 days before does not count);
- **memory pages**: followed on the same GPU by an uncorrectable error within 90 days
  (confirmed), not followed within 90 days (unconfirmed), or younger than 90 days with none
  yet (open, with the days watched so far).

A *memory* rule is one of the shipped or site rules whose condition is ``memory_trend``,
or whose name starts with ``GpuRowRemap`` or ``GpuXidMemory``. What the state keeps bounds
what this can say: each alert series (a rule on one GPU) keeps its latest firing only, and a
resolved one is forgotten 90 days after it last changed; so a GPU paged twice counts once,
an error resolved more than 90 days ago is gone, and the report is a floor on pages and
errors, exact on which came first. The file is read from a private copy, so a node's
state is never changed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.configfile.loader import Config
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.rules.conditions.memory_trend import MemoryTrend
from gpuwatchd.rules.store import DB_NAME, AlertRecord, StateStore

HOUR = 3600.0
DAY = 86400.0
FOLLOW = 90 * DAY  # a page is confirmed by an uncorrectable error within this long
PAGE_LEAD = HOUR  # the goals' lead times (issue 25)
DRAIN_LEAD = DAY
UE_MERGE = HOUR  # two uncorrectable-error alerts on one GPU this close are one error
UE_RULES = ("GpuEccUncorrectedRising",)
UE_XID_RULE = "GpuXidFatal"  # for XID 48
MEMORY_PREFIXES = ("GpuRowRemap", "GpuXidMemory")


@dataclass
class FieldReport:
    """The counts over one or more nodes' state."""

    nodes: int = 0
    ues: int = 0
    ue_paged: int = 0  # a memory page >= 1 h before
    ue_drained: int = 0  # a memory drain >= 24 h before
    ue_warned: int = 0  # either
    pages: int = 0
    pages_confirmed: int = 0
    pages_unconfirmed: int = 0
    pages_open: int = 0
    open_days: list[float] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        def share(part: int, whole: int) -> float | None:
            return round(part / whole, 3) if whole else None

        return {
            "nodes": self.nodes,
            "uncorrectable_errors": self.ues,
            "ue_paged_1h_ahead": self.ue_paged,
            "ue_drained_24h_ahead": self.ue_drained,
            "ue_paged_or_drained": self.ue_warned,
            "recall": share(self.ue_warned, self.ues),
            "memory_pages": self.pages,
            "pages_confirmed_within_90d": self.pages_confirmed,
            "pages_unconfirmed_after_90d": self.pages_unconfirmed,
            "pages_open": self.pages_open,
            "precision": share(self.pages_confirmed, self.pages_confirmed + self.pages_unconfirmed),
        }


def memory_rules(config: Config) -> tuple[set[str], set[str]]:
    """``(page rules, drain rules)`` on memory evidence in ``config``'s rules."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules.loader import rules_from_settings

    pages: set[str] = set()
    drains: set[str] = set()
    for r in rules_from_settings(for_rules(config)).rules:
        if not (isinstance(r.condition, MemoryTrend) or r.name.startswith(MEMORY_PREFIXES)):
            continue
        if r.severity is AlertSeverity.PAGE:
            pages.add(r.name)
        if r.drain:
            drains.add(r.name)
    return pages, drains


def read_alerts(path: str) -> list[AlertRecord]:
    """The alert records of a state directory (or a ``rules.sqlite3`` file), read from a
    private copy. ``OSError`` when there is nothing to read."""
    db = os.path.join(path, DB_NAME) if os.path.isdir(path) else path
    if not os.path.isfile(db):
        raise FileNotFoundError(f"{db}: no rule state here")
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-field-") as tmp:
        copy = os.path.join(tmp, DB_NAME)
        shutil.copyfile(db, copy)
        for suffix in ("-wal", "-shm"):  # a live node's state: its unmerged writes too
            if os.path.isfile(db + suffix):
                shutil.copyfile(db + suffix, copy + suffix)
        store = StateStore(copy, boot_id="field-report")
        try:
            return store.load_alerts()
        finally:
            store.close()


def _xid48(rec: AlertRecord) -> bool:
    """An XID 48 (double-bit error) alert: its label, or the shipped summary's first words."""
    if "xid" in rec.labels:
        return rec.labels["xid"] == "48"
    return rec.annotations.get("summary", "").startswith("XID 48 ")


def _gpu(rec: AlertRecord) -> str | None:
    return rec.labels.get("uuid") or rec.labels.get("gpu")


def score_node(
    records: Iterable[AlertRecord], pages: set[str], drains: set[str], report: FieldReport
) -> None:
    """Add one node's alert records to ``report``; its "now" is the last moment the node
    judged anything (so a copy read later does not age its pages)."""
    recs = [r for r in records if r.fired_at is not None and _gpu(r) is not None]
    if not recs:
        report.nodes += 1
        return
    now = max(max(r.last_true for r in recs), max(r.fired_at or 0.0 for r in recs))
    ues: dict[str, list[float]] = {}
    paged: dict[str, list[float]] = {}
    drained: dict[str, list[float]] = {}
    for r in recs:
        gpu = _gpu(r)
        assert gpu is not None and r.fired_at is not None
        if r.rule in UE_RULES or (r.rule == UE_XID_RULE and _xid48(r)):
            ues.setdefault(gpu, []).append(r.fired_at)
        if r.rule in pages:
            paged.setdefault(gpu, []).append(r.fired_at)
        if r.rule in drains:
            drained.setdefault(gpu, []).append(r.fired_at)
    merged: dict[str, list[float]] = {}
    for gpu, times in ues.items():
        out: list[float] = []
        for t in sorted(times):
            if not out or t - out[-1] > UE_MERGE:
                out.append(t)
        merged[gpu] = out
    for gpu, times in merged.items():
        for t in times:
            report.ues += 1
            p = any(t - FOLLOW <= x <= t - PAGE_LEAD for x in paged.get(gpu, ()))
            d = any(t - FOLLOW <= x <= t - DRAIN_LEAD for x in drained.get(gpu, ()))
            report.ue_paged += p
            report.ue_drained += d
            report.ue_warned += p or d
    for gpu, times in paged.items():
        for x in times:
            report.pages += 1
            if any(x < t <= x + FOLLOW for t in merged.get(gpu, ())):
                report.pages_confirmed += 1
            elif now - x >= FOLLOW:
                report.pages_unconfirmed += 1
            else:
                report.pages_open += 1
                report.open_days.append((now - x) / DAY)
    report.nodes += 1


def field_report(paths: Iterable[str], config: Config) -> FieldReport:
    pages, drains = memory_rules(config)
    report = FieldReport()
    for path in paths:
        score_node(read_alerts(path), pages, drains, report)
    return report


def render(report: FieldReport) -> list[str]:
    row = report.row()

    def pct(v: object) -> str:
        return f"{float(v) * 100:.0f} %" if isinstance(v, float) else "-"

    lines = [
        f"{report.nodes} node(s): {report.ues} uncorrectable memory error(s), "
        f"{report.pages} memory page(s)",
        f"  errors preceded by a memory page >= 1 h before: {report.ue_paged}; by a memory "
        f"drain >= 24 h before: {report.ue_drained}; by either: {report.ue_warned} "
        f"(recall {pct(row['recall'])})",
        f"  pages followed by an uncorrectable error within 90 days: {report.pages_confirmed}; "
        f"none within 90 days: {report.pages_unconfirmed} (precision {pct(row['precision'])}); "
        f"younger than 90 days, none yet: {report.pages_open}",
        "  (each alert series keeps its latest firing: a floor on counts, exact on the order)",
    ]
    return lines
