"""What a condition kind is: the contract every module in this package fulfils.

A kind is a ``ConditionKind`` instance named ``KIND`` in its module and listed in
``registry.KINDS``. It reads its YAML body into its model (a frozen ``Condition``
dataclass), describes that body in JSON Schema, says what the engine must record for it
(``needs``) and when its answer can change (``trigger``), and makes one ``Evaluator`` per
rule, which keeps that rule's private bookkeeping between evaluations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.records import GpuSample
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.conditions.schema_parts import Schema
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot
from gpuwatchd.rules.store import StateStore

Key = tuple[int, int, int]  # (GPU index or -1, link or -1, XID or -1)
NODE_KEY: Key = (-1, -1, -1)
Hit = tuple[float, dict[str, Any] | None]  # (value, extra template values)
Hits = dict[Key, Hit]
NO_HITS: Hits = {}
Result = tuple[Hits, set[int]]  # what holds, and the GPUs that cannot be told (hold)

# What can change a rule's answer between two evaluations; a rule whose trigger did not
# move and that has no pending or firing alert is not evaluated again. "sample": any new
# sample (every evaluation); "fields": a change of one of the sample fields the condition
# ``reads`` (or of a GPU's status); "sxid": a new NVSwitch SXid; "drain": a drain outcome
# came or ended.
Trigger = str
TRIGGERS: tuple[Trigger, ...] = (
    "sample",
    "fields",
    "counter",
    "periodic",
    "xid",
    "sxid",
    "status",
    "links",
    "drain",
)

C = TypeVar("C", bound=Condition)


@dataclass(frozen=True)
class Needs:
    """What the engine records for a condition: counter histories of these fields (per GPU
    or per link), and XIDs for this long."""

    gpu_counters: frozenset[str] = frozenset()
    link_counters: frozenset[str] = frozenset()
    xid_window: float = 0.0


class Evaluator:
    """One rule's evaluation. ``evaluate`` returns the series where the condition holds
    and the GPUs that cannot be told; ``active`` says the rule has a pending or firing
    alert, ``fresh`` that this is its first evaluation (after a load or reload)."""

    __slots__ = ("rule",)

    def __init__(self, rule: Rule) -> None:
        self.rule = rule

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        raise NotImplementedError

    def adopt(self, old: Evaluator) -> None:
        """Take over what must survive a reload from the same rule's previous evaluator."""

    def restore(self, store: StateStore, snap: Snapshot, now: float) -> None:
        """Take back what an earlier run saved (before the first evaluation; an evaluator
        that adopted a previous one's state ignores it)."""

    def save(self, store: StateStore, now: float) -> None:
        """Write what must survive a restart (every minute and at shutdown)."""


UNKNOWN = "unknown"  # SampleEvaluator.judge: this sample cannot tell


class SampleEvaluator(Evaluator):
    """A condition judged on each target GPU's latest sample alone: ``judge`` says whether
    it holds (a ``Hit``), not (None), or cannot be told (``UNKNOWN``); a GPU without a
    sample cannot be told either."""

    __slots__ = ()

    def judge(self, sample: GpuSample) -> Hit | str | None:
        raise NotImplementedError

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        targets, unknown = snap.targets(self.rule)
        hits: Hits = {}
        for g in targets:
            verdict = UNKNOWN if g.sample is None else self.judge(g.sample)
            if verdict == UNKNOWN:
                unknown.add(g.index)
            elif isinstance(verdict, tuple):
                hits[(g.index, -1, -1)] = verdict
        return hits, unknown


class ConditionKind(ABC):
    """One condition kind of the rule language (see the module docstring)."""

    key: ClassVar[str]  # the condition's key in YAML
    keys: ClassVar[tuple[str, ...]]  # its body's keys, in canonical order
    placeholders: ClassVar[frozenset[str]]  # annotation placeholders beyond the common ones
    node_level: ClassVar[bool] = False  # one series for the node, no GPU placeholders
    # rule keys that do not apply to this kind -> why (reported at the key)
    not_with: ClassVar[Mapping[str, str]] = {}

    @abstractmethod
    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        """The model of a body whose keys are known to be ``keys``; ``None`` after
        reporting each problem through ``p``."""

    @abstractmethod
    def schema(self) -> Schema:
        """The JSON Schema of the body."""

    @abstractmethod
    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        """A new evaluator for ``rule`` (whose condition is this kind's)."""

    def needs(self, c: Condition) -> Needs:
        return Needs()

    def trigger(self, c: Condition) -> Trigger:
        return "sample"

    def reads(self, c: Condition) -> frozenset[str] | None:
        """The sample fields (``counterbank.PROCESSES`` for the compute-process list) the
        answer depends on, when it depends on nothing else of a sample: then the rule runs
        only when one of them changed on some GPU (trigger "fields"). None: unknown."""
        return None

    def values(self, c: Condition) -> dict[str, Any]:
        """Template values fixed by the condition (``{field}``, ``{window}``, ...)."""
        return {}


def model_of(rule: Rule, cls: type[C]) -> C:
    """The rule's condition as its kind's model class."""
    c = rule.condition
    if not isinstance(c, cls):
        raise TypeError(f"rule {rule.name!r}: {type(c).__name__} is not {cls.__name__}")
    return c
