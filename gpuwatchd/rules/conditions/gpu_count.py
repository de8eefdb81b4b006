"""``gpu_count``: fewer GPUs than ``gpus.expected`` (NVML's count or the PCI bus's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NODE_KEY,
    ConditionKind,
    Evaluator,
    Hits,
    Result,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot


@dataclass(frozen=True)
class GpuCount(Condition):
    """Fewer GPUs than ``gpus.expected`` (NVML's count or the PCI bus's)."""

    pci: bool = True
    node_level = True


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, GpuCount)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        view = snap.view
        hits: Hits = {}
        if view is None or view.expected_gpus is None:
            return hits, set()
        expected = view.expected_gpus
        seen = len(view.gpus)
        pci = view.pci_gpus if self.c.pci else None
        if seen < expected or (pci is not None and pci < expected):
            value = float(seen if pci is None else min(seen, pci))
            hits[NODE_KEY] = (value, {"expected": expected, "seen": seen, "pci_seen": pci})
        return hits, set()


class GpuCountKind(ConditionKind):
    key = "gpu_count"
    keys = ("pci",)
    placeholders = frozenset({"expected", "seen", "pci_seen"})
    node_level = True
    not_with: ClassVar[Mapping[str, str]] = {
        "select": "a gpu_count rule watches the whole node",
        "when": (
            "not available for gpu_count rules (it needs the GPU's latest sample, which a "
            "lost GPU does not have)"
        ),
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        return GpuCount(p.boolean(keys, "pci", what, True))

    def schema(self) -> sp.Schema:
        return sp.body(
            {"pci": {"type": "boolean", "default": True}},
            "Fewer GPUs than gpus.expected (NVML's count, or the PCI bus's).",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)


KIND = GpuCountKind()
