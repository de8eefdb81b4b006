"""``threshold``: a sampled field compared with a value, per GPU or per NVLink link."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    ConditionKind,
    Evaluator,
    Hit,
    Hits,
    Key,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Op, Rule
from gpuwatchd.rules.snapshot import OP_FUNCS, Snapshot


@dataclass(frozen=True)
class Threshold(Condition):
    """A sampled field compared with a value, per GPU or per NVLink link."""

    field: str
    op: Op
    value: float
    link: bool = False


class _Evaluator(Evaluator):
    __slots__ = ("c", "links_seen")

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, Threshold)
        # per GPU UUID: the link samples last looked at and what held on them
        self.links_seen: dict[str, tuple[object, list[tuple[Key, Hit]]]] = {}

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        if c.link and not snap.links_moved and not snap.status_moved and not active and not fresh:
            return NO_HITS, set()  # no link sample changed: the answer is still "none"
        targets, unknown = snap.targets(self.rule)
        op = OP_FUNCS[c.op]
        name, limit = c.field, c.value
        hits: Hits = {}
        for g in targets:
            s = g.sample
            if s is None:
                unknown.add(g.index)
                continue
            if c.link:
                links = g.data.links if g.data.links is not None else s.links
                cached = self.links_seen.get(g.data.uuid)
                if cached is not None and cached[0] is links:
                    found = cached[1]
                else:
                    found = [
                        ((g.index, ls.link, -1), (v, None))
                        for ls in links
                        if (v := ls.fields.get(name)) is not None and op(v, limit)
                    ]
                    self.links_seen[g.data.uuid] = (links, found)
                hits.update(found)
                continue
            v = s.fields.get(name)
            if v is None:
                unknown.add(g.index)
            elif op(v, limit):
                hits[(g.index, -1, -1)] = (v, None)
        return hits, unknown


class ThresholdKind(ConditionKind):
    key = "threshold"
    keys = ("field", "op", "value")
    placeholders = frozenset({"field", "threshold"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("field", "op", "value"), what):
            return None
        found = p.field(keys["field"], f"{what}.field")
        op = p.op(keys["op"], f"{what}.op", ">")
        value = p.value(keys["value"], f"{what}.value", found[1] if found else None)
        if found is None or op is None or value is None:
            return None
        return Threshold(found[0], op, value, found[2])

    def schema(self) -> sp.Schema:
        return sp.body(
            {"field": sp.fields(), "op": sp.op(), "value": sp.VALUE},
            "A sampled field (per GPU, or per NVLink link for link fields) compared with a value.",
            required=("field", "op", "value"),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def trigger(self, c: Condition) -> Trigger:
        return "links" if c.link else "sample"

    def reads(self, c: Condition) -> frozenset[str] | None:
        assert isinstance(c, Threshold)
        return None if c.link else frozenset({c.field})

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, Threshold)
        return {"field": c.field, "threshold": c.value}


KIND = ThresholdKind()
