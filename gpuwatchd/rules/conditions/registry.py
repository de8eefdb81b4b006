"""Every condition kind of the rule language, in the order docs and errors list them.

Adding a kind: write ``conditions/<kind>.py`` (model, parsing, evaluation, schema piece;
see ``base.ConditionKind``) and add its ``KIND`` here. The loader, the engine, the
canonical form and ``rules/schema.json`` (regenerate it with
``python -m gpuwatchd.rules.schema``) pick it up from this list.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.rules.conditions import (
    count,
    drain_outcome,
    gpu_count,
    gpu_status,
    increase,
    memory_trend,
    pcie_downtrained,
    peer_deviation,
    peer_outlier,
    peer_share,
    rate,
    recovery_action,
    stuck_workload,
    sxid,
    threshold,
    throttle,
    trend,
    xid,
    xid_recurrence,
)
from gpuwatchd.rules.conditions.base import ConditionKind

KINDS: tuple[ConditionKind, ...] = (
    threshold.KIND,
    increase.KIND,
    rate.KIND,
    count.KIND,
    xid.KIND,
    sxid.KIND,
    throttle.KIND,
    trend.KIND,
    peer_outlier.KIND,
    peer_deviation.KIND,
    gpu_status.KIND,
    recovery_action.KIND,
    gpu_count.KIND,
    pcie_downtrained.KIND,
    stuck_workload.KIND,
    memory_trend.KIND,
    xid_recurrence.KIND,
    peer_share.KIND,
    drain_outcome.KIND,
)

BY_KEY: Mapping[str, ConditionKind] = MappingProxyType({k.key: k for k in KINDS})
