"""The memory ledger: one row per memory-relevant firing, kept beside the alert states.

An alert state keeps only the latest firing of its series; the field report
(``gpuwatchd backtest --from-state``) needs every one to count pages and uncorrectable
errors exactly. So each firing transition that matters for memory is also written, in the
same transaction as the alert state, to the ``memory_ledger`` table of ``rules.sqlite3``:

- an **uncorrectable memory error** (``ue``): a firing of ``GpuEccUncorrectedRising``, or of
  ``GpuXidFatal`` for XID 48 (told by its ``xid`` label or its summary's first words);
- a **memory warning** (``memory``): a firing of a memory rule (condition ``memory_trend``,
  or a name starting with ``GpuRowRemap`` or ``GpuXidMemory``) that pages, opens a ticket or
  drains (``info`` alone is not a warning anybody saw).

This module only tells which firings those are; the alert book collects them and the
store writes and prunes them (``StateStore.save_alerts``).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.rules.conditions.memory_model import MemoryTrend
from gpuwatchd.rules.model import Rule
from gpuwatchd.rules.store import LedgerEntry

__all__ = [
    "MEMORY_PREFIXES",
    "UE_RULES",
    "UE_XID_RULE",
    "LedgerEntry",
    "is_memory_rule",
    "is_ue",
    "is_xid48",
    "kind_of",
]

UE_RULES = ("GpuEccUncorrectedRising",)
UE_XID_RULE = "GpuXidFatal"  # for XID 48
MEMORY_PREFIXES = ("GpuRowRemap", "GpuXidMemory")


def is_memory_rule(rule: Rule) -> bool:
    return isinstance(rule.condition, MemoryTrend) or rule.name.startswith(MEMORY_PREFIXES)


def is_xid48(labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """An XID 48 (double-bit error) alert: its label, or the shipped summary's first words."""
    if "xid" in labels:
        return labels["xid"] == "48"
    return annotations.get("summary", "").startswith("XID 48 ")


def is_ue(rule: str, labels: Mapping[str, str], annotations: Mapping[str, str]) -> bool:
    """A firing of ``rule`` that is an uncorrectable memory error."""
    return rule in UE_RULES or (rule == UE_XID_RULE and is_xid48(labels, annotations))


def kind_of(
    rule: Rule,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    severity: AlertSeverity,
    drain: bool,
) -> str | None:
    """The ledger kind of one firing of ``rule``, or None when it is not memory-relevant."""
    if is_ue(rule.name, labels, annotations):
        return "ue"
    if is_memory_rule(rule) and (severity is not AlertSeverity.INFO or drain):
        return "memory"
    return None
