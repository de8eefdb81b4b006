"""``stuck_workload``: a compute process holds the GPU while it does nothing."""

from __future__ import annotations

from dataclasses import dataclass

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.fields import GPU_FIELDS
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
from gpuwatchd.rules.snapshot import PROCESSES, Snapshot


@dataclass(frozen=True)
class StuckWorkload(Condition):
    """A compute process holds the GPU while it does nothing."""

    max_utilization: float = 0.0
    min_processes: int = 1


class _Evaluator(SampleEvaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, StuckWorkload)

    def judge(self, sample: GpuSample) -> Hit | str | None:
        util = sample.fields.get("utilization_gpu")
        procs = sample.fields.get("compute_processes")
        if procs is None and sample.processes:
            procs = float(len(sample.processes))
        if util is None or procs is None:
            return UNKNOWN
        if procs >= self.c.min_processes and util <= self.c.max_utilization:
            return (util, {"utilization": util, "processes": procs})
        return None


class StuckWorkloadKind(ConditionKind):
    def reads(self, c: Condition) -> frozenset[str] | None:
        return frozenset({"utilization_gpu", "compute_processes", PROCESSES})

    key = "stuck_workload"
    keys = ("max_utilization", "min_processes")
    placeholders = frozenset({"utilization", "processes"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        util: float | None = 0.0
        if "max_utilization" in keys:
            util = p.value(
                keys["max_utilization"], f"{what}.max_utilization", GPU_FIELDS["utilization_gpu"]
            )
            if util is not None and not 0.0 <= util < 1.0:
                p.error(
                    keys["max_utilization"],
                    f"{what}.max_utilization: a ratio from 0 to below 1 (5% is 0.05)",
                )
                util = None
        procs = 1
        if "min_processes" in keys:
            procs = p.r.integer(keys["min_processes"], f"{what}.min_processes", 1, 1000) or 1
        if util is None:
            return None
        return StuckWorkload(util, procs)

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "max_utilization": sp.VALUE,
                "min_processes": {"type": "integer", "minimum": 1, "default": 1},
            },
            "A compute process holds the GPU at (near) 0% utilization.",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)


KIND = StuckWorkloadKind()
