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
  yet (open);
- **memory drains**, the same way: the graceful tier's statistical evidence (the rate test)
  drains and never pages, so its false alarms are the drains no error followed;
- **by rule**: each memory rule's firings (pages, drains, tickets), how many paged and
  drained, and the same follow-up, so a site sees which rule's warnings come true.

A *memory* rule is one of the shipped or site rules whose condition is ``memory_trend``,
or whose name starts with ``GpuRowRemap`` or ``GpuXidMemory``.

The counts come from the state's **memory ledger** (``rules/ledger.py``): every memory
firing since the node's daemon first kept one, so a GPU paged twice counts twice. The ledger
keeps 190 days: pages are counted over all of it, uncorrectable errors only where their
90-day look back is all there (after the newest row it dropped, ``ledger_cut``, plus 90
days). A state without a ledger (an older version), or firings from before the ledger
started, fall back to the alert states: each alert series (a rule on one GPU) keeps its
latest firing only, and a resolved one is forgotten 90 days after it last changed, so those
counts are a floor (exact on which came first), and the output says so. A ledger row that
does not read (a damaged or forged file) is skipped with a warning naming the file and row.
The file is read from a private copy, so a node's state is never changed.
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
from gpuwatchd.rules.ledger import is_memory_rule, is_ue
from gpuwatchd.rules.store import DB_NAME, AlertRecord, Ledger, StateStore

HOUR = 3600.0
DAY = 86400.0
FOLLOW = 90 * DAY  # a page is confirmed by an uncorrectable error within this long
PAGE_LEAD = HOUR  # the goals' lead times (issue 25)
DRAIN_LEAD = DAY
UE_MERGE = HOUR  # two uncorrectable-error alerts on one GPU this close are one error


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


@dataclass
class FollowUp:
    """Warnings of one kind (pages, drains, one rule's firings) and what followed each on
    its GPU: an uncorrectable error within 90 days (confirmed), none within 90 days
    (unconfirmed), or too young to say (open)."""

    count: int = 0
    confirmed: int = 0
    unconfirmed: int = 0
    open: int = 0

    def add(self, x: float, ues: Iterable[float], now: float) -> None:
        """One warning at ``x``; ``ues``: the uncorrectable errors of its GPU."""
        self.count += 1
        if any(x < t <= x + FOLLOW for t in ues):
            self.confirmed += 1
        elif now - x >= FOLLOW:
            self.unconfirmed += 1
        else:
            self.open += 1

    @property
    def precision(self) -> float | None:
        return _share(self.confirmed, self.confirmed + self.unconfirmed)


@dataclass
class RuleCounts:
    """One memory rule's firings in the report: how many paged, how many drained, and what
    followed them (``FollowUp``)."""

    paged: int = 0
    drained: int = 0
    follow: FollowUp = field(default_factory=FollowUp)

    def row(self) -> dict[str, Any]:
        f = self.follow
        return {
            "firings": f.count,
            "paged": self.paged,
            "drained": self.drained,
            "confirmed_within_90d": f.confirmed,
            "unconfirmed_after_90d": f.unconfirmed,
            "open": f.open,
            "precision": f.precision,
        }


@dataclass
class FieldReport:
    """The counts over one or more nodes' state."""

    nodes: int = 0
    ues: int = 0
    ue_paged: int = 0  # a memory page >= 1 h before
    ue_drained: int = 0  # a memory drain >= 24 h before
    ue_warned: int = 0  # either
    pages: FollowUp = field(default_factory=FollowUp)
    drains: FollowUp = field(default_factory=FollowUp)
    by_rule: dict[str, RuleCounts] = field(default_factory=dict)
    nodes_exact: int = 0  # counted from a memory ledger alone
    warnings: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.nodes_exact == self.nodes

    def row(self) -> dict[str, Any]:
        pages, drains = self.pages, self.drains
        return {
            "nodes": self.nodes,
            "uncorrectable_errors": self.ues,
            "ue_paged_1h_ahead": self.ue_paged,
            "ue_drained_24h_ahead": self.ue_drained,
            "ue_paged_or_drained": self.ue_warned,
            "recall": _share(self.ue_warned, self.ues),
            "memory_pages": pages.count,
            "pages_confirmed_within_90d": pages.confirmed,
            "pages_unconfirmed_after_90d": pages.unconfirmed,
            "pages_open": pages.open,
            "precision": pages.precision,
            "memory_drains": drains.count,
            "drains_confirmed_within_90d": drains.confirmed,
            "drains_unconfirmed_after_90d": drains.unconfirmed,
            "drains_open": drains.open,
            "drain_precision": drains.precision,
            "by_rule": {rule: c.row() for rule, c in sorted(self.by_rule.items())},
            "counts": "exact" if self.exact else "floor",
            "nodes_exact": self.nodes_exact,
            "nodes_floor": self.nodes - self.nodes_exact,
            "warnings": len(self.warnings),
        }


def memory_rules(config: Config) -> tuple[set[str], set[str]]:
    """``(page rules, drain rules)`` on memory evidence in ``config``'s rules."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules.loader import rules_from_settings

    pages: set[str] = set()
    drains: set[str] = set()
    for r in rules_from_settings(for_rules(config)).rules:
        if not is_memory_rule(r):
            continue
        if r.severity is AlertSeverity.PAGE:
            pages.add(r.name)
        if r.drain:
            drains.add(r.name)
    return pages, drains


@dataclass
class NodeState:
    """What one node's rule state holds for the report."""

    path: str  # the file read (its copy was)
    alerts: list[AlertRecord]
    ledger: Ledger


def read_state(path: str) -> NodeState:
    """The alert records and memory ledger of a state directory (or a ``rules.sqlite3``
    file), read from a private copy. ``OSError`` when there is nothing to read."""
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
            return NodeState(db, store.load_alerts(), store.load_ledger())
        finally:
            store.close()


def _gpu(rec: AlertRecord) -> str | None:
    return rec.labels.get("uuid") or rec.labels.get("gpu")


@dataclass(frozen=True)
class _Event:
    gpu: str
    t: float
    rule: str
    ue: bool
    memory: bool  # a memory rule's firing (a page, a drain, a ticket)
    page: bool
    drain: bool


def _from_alerts(
    records: Iterable[AlertRecord], pages: set[str], drains: set[str], before: float | None
) -> list[_Event]:
    """The alert states' latest firings (those before ``before`` only, when given)."""
    out: list[_Event] = []
    for r in records:
        gpu = _gpu(r)
        if gpu is None or r.fired_at is None or (before is not None and r.fired_at >= before):
            continue
        ue = is_ue(r.rule, r.labels, r.annotations)
        page, drain = r.rule in pages, r.rule in drains
        if ue or page or drain:
            out.append(_Event(gpu, r.fired_at, r.rule, ue, page or drain, page, drain))
    return out


def _from_ledger(ledger: Ledger) -> list[_Event]:
    out: list[_Event] = []
    for e in ledger.entries:
        gpu = e.uuid or e.gpu
        if not gpu:
            continue
        memory = e.kind == "memory"
        out.append(_Event(gpu, e.t, e.rule, e.kind == "ue", memory,
                          memory and e.severity == "page", memory and e.drain))  # fmt: skip
    return out


def score_node(node: NodeState, pages: set[str], drains: set[str], report: FieldReport) -> None:
    """Add one node's history to ``report``; its "now" is the last moment the node judged
    anything (so a copy read later does not age its pages)."""
    ledger = node.ledger
    for rowid, why in ledger.bad:
        report.warnings.append(f"{node.path}: memory_ledger row {rowid}: {why}: skipped")
    if ledger.truncated:
        report.warnings.append(
            f"{node.path}: memory_ledger holds more rows than the report reads; the oldest "
            "were left out"
        )
    if ledger.since is None:
        events = _from_alerts(node.alerts, pages, drains, None)
        exact = False
    else:
        floor = _from_alerts(node.alerts, pages, drains, ledger.since)
        events = floor + _from_ledger(ledger)
        exact = not floor
    report.nodes += 1
    report.nodes_exact += exact
    times = [t for r in node.alerts if r.fired_at is not None for t in (r.last_true, r.fired_at)]
    times += [e.t for e in ledger.entries]
    if not events or not times:
        return
    now = max(times)
    cut = ledger.cut  # ledger rows up to here were dropped: count only what is whole
    ues: dict[str, list[float]] = {}
    paged: dict[str, list[float]] = {}
    drained: dict[str, list[float]] = {}
    warned: list[_Event] = []  # the memory rules' firings
    for e in events:
        if e.ue:
            ues.setdefault(e.gpu, []).append(e.t)
        if e.page:
            paged.setdefault(e.gpu, []).append(e.t)
        if e.drain:
            drained.setdefault(e.gpu, []).append(e.t)
        if e.memory:
            warned.append(e)
    merged: dict[str, list[float]] = {}
    for gpu, ts in ues.items():
        out: list[float] = []
        for t in sorted(ts):
            if not out or t - out[-1] > UE_MERGE:
                out.append(t)
        merged[gpu] = out
    for gpu, ts in merged.items():
        for t in ts:
            if cut is not None and t - FOLLOW <= cut:
                continue  # its look back reaches into what was dropped
            report.ues += 1
            p = any(t - FOLLOW <= x <= t - PAGE_LEAD for x in paged.get(gpu, ()))
            d = any(t - FOLLOW <= x <= t - DRAIN_LEAD for x in drained.get(gpu, ()))
            report.ue_paged += p
            report.ue_drained += d
            report.ue_warned += p or d
    for follow, warnings in ((report.pages, paged), (report.drains, drained)):
        for gpu, ts in warnings.items():
            for x in sorted(ts):
                if cut is None or x > cut:
                    follow.add(x, merged.get(gpu, ()), now)
    for e in warned:
        if cut is None or e.t > cut:
            counts = report.by_rule.setdefault(e.rule, RuleCounts())
            counts.paged += e.page
            counts.drained += e.drain
            counts.follow.add(e.t, merged.get(e.gpu, ()), now)


def field_report(paths: Iterable[str], config: Config) -> FieldReport:
    pages, drains = memory_rules(config)
    report = FieldReport()
    for path in paths:
        score_node(read_state(path), pages, drains, report)
    return report


def render(report: FieldReport) -> list[str]:
    row = report.row()

    def pct(v: object) -> str:
        return f"{float(v) * 100:.0f} %" if isinstance(v, float) else "-"

    pages, drains = report.pages, report.drains
    lines = [
        f"{report.nodes} node(s): {report.ues} uncorrectable memory error(s), "
        f"{pages.count} memory page(s), {drains.count} memory drain(s)",
        f"  errors preceded by a memory page >= 1 h before: {report.ue_paged}; by a memory "
        f"drain >= 24 h before: {report.ue_drained}; by either: {report.ue_warned} "
        f"(recall {pct(row['recall'])})",
        f"  pages followed by an uncorrectable error within 90 days: {pages.confirmed}; "
        f"none within 90 days: {pages.unconfirmed} (precision {pct(pages.precision)}); "
        f"younger than 90 days, none yet: {pages.open}",
        f"  drains followed by an uncorrectable error within 90 days: {drains.confirmed}; "
        f"none within 90 days: {drains.unconfirmed} (precision {pct(drains.precision)}); "
        f"younger than 90 days, none yet: {drains.open}",
    ]
    for rule, c in sorted(report.by_rule.items()):
        f = c.follow
        lines.append(
            f"  {rule}: {f.count} firing(s) ({c.paged} paged, {c.drained} drained): "
            f"{f.confirmed} followed within 90 days, {f.unconfirmed} not, {f.open} open"
        )
    if report.exact:
        lines.append("  (exact: every memory firing, from each node's memory ledger)")
    else:
        lines.append(
            f"  ({report.nodes - report.nodes_exact} node(s) without a memory ledger, or with "
            "firings from before it started: there each alert series keeps its latest firing "
            "only, so the counts are a floor, exact on the order)"
        )
    return lines
