"""``pcie_downtrained``: the PCIe link runs below its maximum generation or width."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import ConditionKind, Evaluator, Hits, Result, model_of
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot


@dataclass(frozen=True)
class PcieDowntrained(Condition):
    """The PCIe link runs below its maximum generation or width."""

    generation: bool = True
    width: bool = True


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, PcieDowntrained)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        targets, unknown = snap.targets(self.rule)
        hits: Hits = {}
        for g in targets:
            s = g.sample
            if s is None:
                unknown.add(g.index)
                continue
            f = s.fields
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
                unknown.add(g.index)
            elif down:
                hits[(g.index, -1, -1)] = (
                    gen if gen is not None else math.nan,
                    {
                        "generation": gen,
                        "generation_max": gen_max,
                        "width": width,
                        "width_max": width_max,
                    },
                )
        return hits, unknown


class PcieDowntrainedKind(ConditionKind):
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
