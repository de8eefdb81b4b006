"""``pcie_downtrained``: the PCIe link runs below its maximum generation or width."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuwatchd.config.yamlsrc import Node
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
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot


@dataclass(frozen=True)
class PcieDowntrained(Condition):
    """The PCIe link runs below its maximum generation or width."""

    generation: bool = True
    width: bool = True


class _Evaluator(SampleEvaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, PcieDowntrained)

    def judge(self, sample: GpuSample) -> Hit | str | None:
        c = self.c
        f = sample.fields
        gen, gen_max = f.get("pcie_link_generation"), f.get("pcie_link_generation_max")
        width, width_max = f.get("pcie_link_width"), f.get("pcie_link_width_max")
        down = False
        known = False
        if c.generation and gen is not None and gen_max is not None:
            known = True
            down = gen < gen_max
        if c.width and width is not None and width_max is not None:
            known = True
            down = down or width < width_max
        if not known:
            return UNKNOWN
        if not down:
            return None
        return (
            gen if gen is not None else math.nan,
            {
                "generation": gen,
                "generation_max": gen_max,
                "width": width,
                "width_max": width_max,
            },
        )


class PcieDowntrainedKind(ConditionKind):
    def reads(self, c: Condition) -> frozenset[str] | None:
        return frozenset(
            {
                "pcie_link_generation",
                "pcie_link_generation_max",
                "pcie_link_width",
                "pcie_link_width_max",
            }
        )

    key = "pcie_downtrained"
    keys = ("generation", "width")
    placeholders = frozenset({"generation", "generation_max", "width", "width_max"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        gen = p.boolean(keys, "generation", what, True)
        width = p.boolean(keys, "width", what, True)
        if not gen and not width:
            p.error(body, f"{what}: generation and width are both off: watches nothing")
            return None
        return PcieDowntrained(gen, width)

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "generation": {"type": "boolean", "default": True},
                "width": {"type": "boolean", "default": True},
            },
            "PCIe link below its maximum generation or width.",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)


KIND = PcieDowntrainedKind()
