"""The rule language as data: what a loaded rule file becomes.

Every value here is validated and in base units (seconds, celsius, hertz, ratios). The
loader (``loader.py``) builds these from YAML and keeps each rule's source location so
that reload errors and rule-test failures can point at the file.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.errors import Location
from gpuwatchd.rules.templates import Template

Op = Literal[">", ">=", "<", "<=", "==", "!="]
OPS: tuple[Op, ...] = (">", ">=", "<", "<=", "==", "!=")
_OP_FUNCS: Mapping[str, Callable[[float, float], bool]] = MappingProxyType(
    {
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
        "==": operator.eq,
        "!=": operator.ne,
    }
)


def compare(op: str, left: float, right: float) -> bool:
    return _OP_FUNCS[op](left, right)


def rises_only(op: str) -> bool:
    """True when ``x op v`` can only turn true as ``x`` grows (``>``/``>=``)."""
    return op in (">", ">=")


# -- conditions ---------------------------------------------------------------------------
class Condition:
    """Base of every condition kind's model (``rules/conditions/<kind>.py``).

    ``link``: the condition is evaluated per NVLink link. ``node_level``: one series for the
    whole node. ``hold``: how long an alert keeps firing after the condition stops holding.
    """

    link: bool = False
    node_level: bool = False

    def hold(self, keep_firing_for: float) -> float:
        return keep_firing_for


# -- rules --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Guard:
    """``when:``: a GPU takes part only while this holds on its latest sample."""

    field: str
    op: Op
    value: float


@dataclass(frozen=True)
class Selector:
    """``select:``: which GPUs the rule watches (empty = all)."""

    models: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()  # UUIDs and PCI bus ids in NVML form


@dataclass(frozen=True)
class Escalation:
    """``escalate:``: what changes when the same alert fires again after a reboot."""

    within: float
    severity: AlertSeverity
    drain: bool
    annotations: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Rule:
    name: str
    severity: AlertSeverity
    kind: str  # the condition's key in YAML (threshold, xid, trend, ...)
    condition: Condition
    loc: Location
    description: str = ""
    for_: float = 0.0
    keep_firing_for: float = 0.0
    when: Guard | None = None
    select: Selector | None = None
    labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    annotations: Mapping[str, Template] = field(default_factory=lambda: MappingProxyType({}))
    drain: bool = False
    routes: tuple[str, ...] = ()
    escalate: Escalation | None = None

    @property
    def per_link(self) -> bool:
        return self.condition.link

    @property
    def node_level(self) -> bool:
        return self.condition.node_level

    @property
    def hold(self) -> float:
        """How long the alert keeps firing after its condition stops holding."""
        return self.condition.hold(self.keep_firing_for)


@dataclass(frozen=True)
class RuleSet:
    """The rules from every file, in load order; names are unique."""

    rules: tuple[Rule, ...] = ()
    files: tuple[str, ...] = ()

    def names(self) -> list[str]:
        return [r.name for r in self.rules]

    def get(self, name: str) -> Rule | None:
        for rule in self.rules:
            if rule.name == name:
                return rule
        return None

    def without(self, names: set[str]) -> RuleSet:
        return RuleSet(tuple(r for r in self.rules if r.name not in names), self.files)
