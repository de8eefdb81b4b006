"""``trend``: a counter whose rate accelerates (recent window vs the baseline before it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    ConditionKind,
    Evaluator,
    Hit,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import MAX_WINDOW, BodyReader
from gpuwatchd.rules.conditions.recheck import Recheck
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot

RECHECK = 300.0  # seconds between looks at a series that did not move


@dataclass(frozen=True)
class Trend(Condition):
    """A counter whose rate accelerates: the rate in the last ``window`` is at least
    ``factor`` times the rate over the ``baseline`` before it, with enough evidence: at
    least ``min_increase`` in ``window``, spread over at least ``min_slices`` of its
    ``slices`` equal parts (so one burst is not a trend)."""

    field: str
    window: float = 86400.0
    baseline: float = 7 * 86400.0
    factor: float = 4.0
    min_increase: float = 6.0
    slices: int = 6
    min_slices: int = 4
    link: bool = False


def accelerating(c: Trend, h: CounterHistory, now: float) -> Hit | None:
    w0 = now - c.window
    b0 = w0 - c.baseline
    recent = h.increase(w0, now)
    if recent < c.min_increase:
        return None
    if h.ts[0] > b0:
        return None  # the baseline period is not covered by history yet
    base = h.increase(b0, w0)
    ratio = (recent / c.window) / (max(base, 1.0) / c.baseline)
    if ratio < c.factor:
        return None
    width = c.window / c.slices
    prev = h.value_at(w0)
    busy = 0
    for i in range(1, c.slices + 1):
        v = h.value_at(w0 + i * width)
        if v is not None and prev is not None and v > prev:
            busy += 1
        prev = v
    if busy < c.min_slices:
        return None
    return recent, {"ratio": ratio, "baseline_rate": base / c.baseline * 3600.0}


class _Evaluator(Evaluator):
    __slots__ = ("c", "look")

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, Trend)
        self.look = Recheck(RECHECK)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        look = self.look
        if not active and not fresh and look.node_quiet(snap, c.field, now):
            return NO_HITS, set()
        targets, unknown = snap.targets(self.rule)
        hits: Hits = {}
        for g in targets:
            for link, h in snap.series(g, c.field, c.link):
                if len(h) < 2 or look.unchanged(h, h.version, now):
                    continue
                hit = accelerating(c, h, now)
                look.record(h, h.version, now, hit is not None)
                if hit is not None:
                    hits[(g.index, link, -1)] = hit
        return hits, unknown


class TrendKind(ConditionKind):
    key = "trend"
    keys = ("field", "window", "baseline", "factor", "min_increase", "slices", "min_slices")
    placeholders = frozenset({"field", "window", "ratio", "baseline_rate"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("field",), what):
            return None
        r = p.r
        found = p.field(keys["field"], f"{what}.field", counter=True)
        values: dict[str, Any] = {}
        for name in ("window", "baseline"):
            if name in keys:
                values[name] = p.window(keys[name], f"{what}.{name}")
        if "factor" in keys:
            values["factor"] = r.number(keys["factor"], f"{what}.factor", minimum=1.0)
        if "min_increase" in keys:
            values["min_increase"] = r.number(
                keys["min_increase"], f"{what}.min_increase", minimum=1.0
            )
        for name in ("slices", "min_slices"):
            if name in keys:
                values[name] = r.integer(keys[name], f"{what}.{name}", 1, 100)
        if found is None or any(v is None for v in values.values()):
            return None
        trend = Trend(found[0], link=found[2], **values)
        if trend.min_slices > trend.slices:
            where = keys.get("min_slices", body)
            p.error(
                where, f"{what}.min_slices: {trend.min_slices} is more than slices ({trend.slices})"
            )
            return None
        if trend.window + trend.baseline > MAX_WINDOW:
            p.error(body, f"{what}: window + baseline must be at most 30d (history kept)")
            return None
        return trend

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "field": sp.fields(),
                "window": sp.duration("1d"),
                "baseline": sp.duration("7d"),
                "factor": {"type": "number", "minimum": 1, "default": 4},
                "min_increase": {"type": "number", "minimum": 1, "default": 6},
                "slices": {"type": "integer", "minimum": 1, "maximum": 100, "default": 6},
                "min_slices": {"type": "integer", "minimum": 1, "maximum": 100, "default": 4},
            },
            "An accelerating counter: the rate of the last window versus the baseline before "
            "it, with a minimum of evidence.",
            required=("field",),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, Trend)
        if c.link:
            return Needs(link_counters=frozenset({c.field}))
        return Needs(gpu_counters=frozenset({c.field}))

    def trigger(self, c: Condition) -> Trigger:
        return "periodic"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, Trend)
        return {"field": c.field, "window": format_duration(c.window)}


KIND = TrendKind()
