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
from gpuwatchd.core.records import GpuStatus
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
@dataclass(frozen=True)
class Threshold:
    """A sampled field compared with a value, per GPU or per NVLink link."""

    field: str
    op: Op
    value: float
    link: bool = False


@dataclass(frozen=True)
class Increase:
    """How much a counter grew in the last ``window`` (counter resets handled)."""

    field: str
    window: float
    op: Op = ">"
    value: float = 0.0
    link: bool = False


@dataclass(frozen=True)
class Rate:
    """A counter's average growth per second over the last ``window``."""

    field: str
    window: float
    op: Op = ">"
    value: float = 0.0
    link: bool = False


@dataclass(frozen=True)
class Count:
    """How many samples in the last ``window`` showed the counter growing."""

    field: str
    window: float
    op: Op = ">="
    value: float = 1.0
    link: bool = False


@dataclass(frozen=True)
class XidMatch:
    """XID events matched by code, catalog bucket or catalog severity."""

    codes: frozenset[int]
    count: int = 1
    window: float = 600.0
    quiet: float = 3600.0
    by_code: bool = False
    include_unknown_gpu: bool = True


@dataclass(frozen=True)
class Throttle:
    """Clocks-event (throttle) reasons present in the GPU's bitmask."""

    reasons: tuple[str, ...]
    mask: int
    match: Literal["any", "all"] = "any"


@dataclass(frozen=True)
class Trend:
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


@dataclass(frozen=True)
class PeerOutlier:
    """One GPU's value far from the median of the other GPUs on the node."""

    field: str
    direction: Literal["above", "below"]
    ratio: float
    min_delta: float = 0.0
    window: float | None = None  # counters: compare the increase over this window
    min_peers: int = 2


@dataclass(frozen=True)
class GpuStatusIs:
    """The GPU's poll status (lost, stale, error)."""

    statuses: frozenset[GpuStatus]


@dataclass(frozen=True)
class GpuCount:
    """Fewer GPUs than ``gpus.expected`` (NVML's count or the PCI bus's)."""

    pci: bool = True


@dataclass(frozen=True)
class PcieDowntrained:
    """The PCIe link runs below its maximum generation or width."""

    generation: bool = True
    width: bool = True


@dataclass(frozen=True)
class StuckWorkload:
    """A compute process holds the GPU while it does nothing."""

    max_utilization: float = 0.0
    min_processes: int = 1


Condition = (
    Threshold
    | Increase
    | Rate
    | Count
    | XidMatch
    | Throttle
    | Trend
    | PeerOutlier
    | GpuStatusIs
    | GpuCount
    | PcieDowntrained
    | StuckWorkload
)

# condition key in YAML -> placeholders its annotations may use (beyond the common ones)
NODE_LEVEL = frozenset({"gpu_count"})
LINK_PLACEHOLDERS = frozenset({"link"})


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
        return bool(getattr(self.condition, "link", False))

    @property
    def node_level(self) -> bool:
        return self.kind in NODE_LEVEL

    @property
    def hold(self) -> float:
        """How long the alert keeps firing after its condition stops holding."""
        if isinstance(self.condition, XidMatch):
            return self.condition.quiet
        return self.keep_firing_for


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
