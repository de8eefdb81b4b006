"""``gpu_status``: the GPU's poll status (lost, stale, error)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.records import GpuStatus
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    ConditionKind,
    Evaluator,
    Hits,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader, hint
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot

STATUSES = ("lost", "stale", "error")


@dataclass(frozen=True)
class GpuStatusIs(Condition):
    """The GPU's poll status (lost, stale, error)."""

    statuses: frozenset[GpuStatus]


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, GpuStatusIs)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        if not snap.status_moved and not active and not fresh:
            return NO_HITS, set()
        statuses = self.c.statuses
        hits: Hits = {}
        for g in snap.selected(self.rule):
            if g.status in statuses:
                hits[(g.index, -1, -1)] = (1.0, {"status": g.status.value})
        return hits, set()


class GpuStatusKind(ConditionKind):
    key = "gpu_status"
    keys = ("status",)
    placeholders = frozenset({"status"})
    not_with: ClassVar[Mapping[str, str]] = {
        "when": (
            "not available for gpu_status rules (it needs the GPU's latest sample, which a "
            "lost GPU does not have)"
        ),
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("status",), what):
            return None
        statuses: set[GpuStatus] = set()
        for text, item in p.strings(keys["status"], f"{what}.status"):
            if text not in STATUSES:
                p.error(
                    item,
                    f"{what}.status: {text!r} is not one of {', '.join(STATUSES)}"
                    f"{hint(text, STATUSES)}",
                )
                continue
            statuses.add(GpuStatus(text))
        if not statuses:
            return None
        return GpuStatusIs(frozenset(statuses))

    def schema(self) -> sp.Schema:
        return sp.body(
            {"status": sp.enum_list(STATUSES)}, "The GPU's poll status.", required=("status",)
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def trigger(self, c: Condition) -> Trigger:
        return "status"


KIND = GpuStatusKind()
