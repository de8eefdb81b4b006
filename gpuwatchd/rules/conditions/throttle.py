"""``throttle``: clocks-event (throttle) reasons present in the GPU's bitmask."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.fields import CLOCK_EVENT_REASON_BITS, decode_clock_event_reasons
from gpuwatchd.core.records import GpuSample
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    UNKNOWN,
    ConditionKind,
    Evaluator,
    Hit,
    SampleEvaluator,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader, hint
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot


@dataclass(frozen=True)
class Throttle(Condition):
    """Clocks-event (throttle) reasons present in the GPU's bitmask."""

    reasons: tuple[str, ...]
    mask: int
    match: Literal["any", "all"] = "any"


class _Evaluator(SampleEvaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, Throttle)

    def judge(self, sample: GpuSample) -> Hit | str | None:
        c = self.c
        mask = sample.fields.get("clock_event_reasons")
        if mask is None:
            return UNKNOWN
        m = int(mask) & c.mask
        if (m == c.mask) if c.match == "all" else m:
            return (mask, {"reasons": ", ".join(decode_clock_event_reasons(m))})
        return None


class ThrottleKind(ConditionKind):
    def reads(self, c: Condition) -> frozenset[str] | None:
        return frozenset({"clock_event_reasons"})

    key = "throttle"
    keys = ("reasons", "match")
    placeholders = frozenset({"reasons"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("reasons",), what):
            return None
        reasons: list[str] = []
        mask = 0
        for text, item in p.strings(keys["reasons"], f"{what}.reasons"):
            bit = CLOCK_EVENT_REASON_BITS.get(text)
            if bit is None:
                p.error(
                    item,
                    f"{what}.reasons: unknown clock-event reason {text!r}"
                    f"{hint(text, CLOCK_EVENT_REASON_BITS)} (one of "
                    f"{', '.join(CLOCK_EVENT_REASON_BITS)})",
                )
                continue
            reasons.append(text)
            mask |= bit
        if not reasons:
            if not p.r.problems:
                p.error(keys["reasons"], f"{what}.reasons: name at least one reason")
            return None
        match = "any"
        if "match" in keys:
            match = p.r.string(keys["match"], f"{what}.match", ("any", "all")) or "any"
        return Throttle(tuple(reasons), mask, "all" if match == "all" else "any")

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "reasons": sp.enum_list(list(CLOCK_EVENT_REASON_BITS)),
                "match": {"enum": ["any", "all"], "default": "any"},
            },
            "Clocks-event (throttle) reasons set; sustain it with 'for'.",
            required=("reasons",),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)


KIND = ThrottleKind()
