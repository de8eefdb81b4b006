"""``drain_outcome``: a drain outcome the drain stage reported (failed, limit reached, over
the fleet budget, breaker open) that still holds.

The drain stage decides nothing about severity: it hands each outcome, and its end, to
the rule stage as a ``DrainOutcome`` record. A rule of this kind fires while one of the
named outcomes holds and resolves when it ends. An outcome naming a GPU the node view
knows is that GPU's series; any other is the node's. The drain's own account and its
counts fill the annotations (``{summary}``, ``{reason}``, ``{xids}``, ...; empty where the
outcome has none).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.records import DRAIN_OUTCOME_KINDS, DrainOutcome
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    NODE_KEY,
    ConditionKind,
    Evaluator,
    Hits,
    Key,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader, hint
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot

# what an outcome's counts may name (the drain stage's notes); others are not shown
COUNTS = ("xids", "drained_nodes", "likely_cause", "nodes_wanting", "share_percent")


@dataclass(frozen=True)
class DrainOutcomeHolds(Condition):
    """One of these drain outcomes holds."""

    outcomes: frozenset[str]


def _values(o: DrainOutcome) -> dict[str, Any]:
    values: dict[str, Any] = {name: o.counts.get(name, "") for name in COUNTS}
    values.update(outcome=o.kind.value, summary=o.summary, reason=o.reason)
    return values


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, DrainOutcomeHolds)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        held = snap.drains.holding(self.c.outcomes)
        if not held:
            return NO_HITS, set()
        hits: Hits = {}
        for o in held:  # oldest first: the newest outcome of a series speaks for it
            gpu = -1
            if o.gpu is not None or o.pci_bus_id or o.uuid:
                gpu = snap.gpu_of_ids(o.gpu, o.pci_bus_id, o.uuid)
            key: Key = (gpu, -1, -1) if gpu >= 0 else NODE_KEY
            hits[key] = (1.0, _values(o))
        return hits, set()


class DrainOutcomeKind(ConditionKind):
    key = "drain_outcome"
    keys = ("outcome",)
    placeholders = frozenset({"outcome", "summary", "reason", *COUNTS})
    not_with: ClassVar[Mapping[str, str]] = {
        "select": "a drain_outcome rule watches the node's drains",
        "when": "not available for drain_outcome rules (a drain outcome is no GPU sample)",
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("outcome",), what):
            return None
        outcomes: set[str] = set()
        for text, item in p.strings(keys["outcome"], f"{what}.outcome"):
            if text not in DRAIN_OUTCOME_KINDS:
                p.error(
                    item,
                    f"{what}.outcome: {text!r} is not one of {', '.join(DRAIN_OUTCOME_KINDS)}"
                    f"{hint(text, DRAIN_OUTCOME_KINDS)}",
                )
                continue
            outcomes.add(text)
        if not outcomes:
            return None
        return DrainOutcomeHolds(frozenset(outcomes))

    def schema(self) -> sp.Schema:
        return sp.body(
            {"outcome": sp.enum_list(DRAIN_OUTCOME_KINDS)},
            "A drain outcome the drain stage reported and that still holds.",
            required=("outcome",),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def trigger(self, c: Condition) -> Trigger:
        return "drain"


KIND = DrainOutcomeKind()
