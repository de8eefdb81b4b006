"""What ``increase``, ``rate`` and ``count`` share: a counter over a sliding window."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    ConditionKind,
    Evaluator,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.evidence import bucket_of
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.model import Condition, Op, Rule, rises_only
from gpuwatchd.rules.node_wide import NodeLook
from gpuwatchd.rules.rate_limited import lookback, note
from gpuwatchd.rules.snapshot import OP_FUNCS, Snapshot, selected


@dataclass(frozen=True)
class Windowed(Condition):
    field: str
    window: float
    op: Op = ">"
    value: float = 0.0
    link: bool = False
    skip_node_wide: bool = False  # leave out GPUs whose activity in the window is node-wide

    def measure(self, h: CounterHistory, start: float, end: float) -> float:
        raise NotImplementedError


class _Evaluator(Evaluator):
    __slots__ = ("c", "node", "true")

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, Windowed)
        self.true: dict[CounterHistory, None] = {}  # series where it held last time
        self.node = NodeLook() if self.c.skip_node_wide else None

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        rule = self.rule
        op = OP_FUNCS[c.op]
        start = now - c.window
        true = self.true
        hits: Hits = {}
        if rises_only(c.op) and rule.when is None and not fresh:
            if not snap.touched and not true:
                return NO_HITS, set()
            # Only a series that moved can turn true: without new points an increase, a
            # rate or a count over a sliding window can only shrink. So look at the
            # series that moved since the last evaluation and at those that were true.
            todo: list[tuple[int, int, CounterHistory]] = []
            for h in (*snap.touched, *true):
                uuid, name, series_link = snap.meta[h]
                if name != c.field:  # GPU and link fields have distinct names
                    continue
                index = snap.by_uuid.get(uuid)
                if index is None:
                    continue
                if rule.select is not None and not selected(rule.select, snap.by_index[index].info):
                    continue
                todo.append((index, series_link, h))
            todo = sorted(set(todo), key=lambda x: (x[0], x[1]))  # deterministic order
            unknown: set[int] = set()
        else:
            targets, unknown = snap.targets(rule)
            todo = [
                (g.index, link_no, h)
                for g in targets
                for link_no, h in snap.series(g, c.field, c.link)
            ]
        node = self.node
        if node is not None:
            node.look(snap, c.field, bucket_of(start), bucket_of(now) + 1)
        for index, link_no, h in todo:
            v = c.measure(h, start, now)
            if node is not None and not node.own(index):
                v = 0.0  # all of it node-wide: the node's alert (rules/node_wide.py)
            if op(v, c.value):
                limited = "" if link_no >= 0 else note(snap, c.field, index, now, c.window)
                hits[(index, link_no, -1)] = (v, {"rate_limited": limited} if limited else None)
                true[h] = None
            else:
                true.pop(h, None)
        return hits, unknown


class WindowedKind(ConditionKind):
    """A kind over a counter's last ``window`` (subclasses name the key and measure)."""

    keys: ClassVar[tuple[str, ...]] = ("field", "window", "op", "value")
    placeholders = frozenset({"field", "threshold", "window", "rate_limited"})
    default_op: ClassVar[Op] = ">"
    default_value: ClassVar[float] = 0.0
    description: ClassVar[str]
    model: ClassVar[type[Windowed]]
    node_wide_option: ClassVar[bool] = False  # takes ``skip_node_wide`` (GPU counters)

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("field", "window"), what):
            return None
        found = p.field(keys["field"], f"{what}.field", counter=True)
        window = p.window(keys["window"], f"{what}.window")
        op = p.op(keys.get("op"), f"{what}.op", self.default_op)
        value: float | None = self.default_value
        if "value" in keys:
            value = p.r.number(keys["value"], f"{what}.value")
        skip = False
        if "skip_node_wide" in keys:
            got = p.r.boolean(keys["skip_node_wide"], f"{what}.skip_node_wide")
            if got is None:
                return None
            skip = got
        if found is None or window is None or op is None or value is None:
            return None
        if skip and found[2]:
            p.error(keys["skip_node_wide"], f"{what}.skip_node_wide: for GPU counters, not links")
            return None
        return self.model(found[0], window, op, value, found[2], skip)

    def schema(self) -> sp.Schema:
        number: sp.Schema = {"type": "number", "default": self.default_value}
        if self.default_value == int(self.default_value):
            number["default"] = int(self.default_value)
        props: dict[str, sp.Schema] = {
            "field": sp.fields(),
            "window": sp.duration(),
            "op": sp.op(self.default_op),
            "value": number,
        }
        if self.node_wide_option:
            props["skip_node_wide"] = {"type": "boolean", "default": False}
        return sp.body(
            props,
            self.description,
            required=("field", "window"),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, Windowed)
        if c.link:
            return Needs(link_counters=frozenset({c.field}))
        # XID 92 within the window says the corrected count is a lower bound (rate_limited)
        return Needs(gpu_counters=frozenset({c.field}), xid_window=lookback(c.field, c.window))

    def trigger(self, c: Condition) -> Trigger:
        assert isinstance(c, Windowed)
        return "counter" if rises_only(c.op) else "sample"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, Windowed)
        return {
            "field": c.field,
            "window": format_duration(c.window),
            "threshold": c.value,
            "rate_limited": "",
        }
