"""``peer_share``: one GPU holds far more than its fair share of the node's error episodes.

Counts episodes (runs of 10-minute buckets with growth, less than an hour apart; see
``rules/evidence.py``), not raw errors, so one burst weighs as one. With ``e`` of the
node's ``E`` episodes in ``window`` on one GPU of ``k``, the GPU is an outlier when
``P(X >= e)`` for ``X ~ Binomial(E, 1/k)`` is below ``alpha / k`` (every GPU is tested:
Bonferroni) and ``e >= min_episodes``. Peers at zero are no evidence by themselves:
a GPU needs ``min_episodes`` of its own, however quiet the others are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    ConditionKind,
    Evaluator,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.evidence import binomial_tail, bucket_of
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot


@dataclass(frozen=True)
class PeerShare(Condition):
    field: str = "ecc_corrected_volatile_dev"
    window: float = 86400.0
    alpha: float = 1e-3
    min_episodes: int = 3
    min_peers: int = 2


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, PeerShare)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        targets, unknown = snap.targets(self.rule)
        b1 = bucket_of(now) + 1
        b0 = b1 - int(c.window // 600)
        counts: list[tuple[int, int]] = []
        for g in targets:
            h = g.data.hist.get(c.field)
            counts.append((g.index, h.activity.episodes(b0, b1) if h is not None else 0))
        hits: Hits = {}
        k = len(counts)
        total = sum(e for _, e in counts)
        if k < c.min_peers + 1 or total == 0:
            return hits, unknown
        for index, e in counts:
            if e < c.min_episodes:
                continue
            p = binomial_tail(e, total, 1.0 / k)
            if p < c.alpha / k:
                hits[(index, -1, -1)] = (
                    float(e),
                    {"episodes": e, "node_episodes": total, "p_value": f"{p:.1e}"},
                )
        return hits, unknown


class PeerShareKind(ConditionKind):
    key = "peer_share"
    keys = ("field", "window", "alpha", "min_episodes", "min_peers")
    placeholders = frozenset({"field", "window", "episodes", "node_episodes", "p_value"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        r = p.r
        values: dict[str, Any] = {}
        if "field" in keys:
            found = p.field(keys["field"], f"{what}.field", counter=True, allow_link=False)
            values["field"] = found[0] if found is not None else None
        if "window" in keys:
            values["window"] = p.window(keys["window"], f"{what}.window")
        if "alpha" in keys:
            values["alpha"] = r.number(keys["alpha"], f"{what}.alpha", minimum=1e-12)
            if values["alpha"] is not None and values["alpha"] >= 0.5:
                p.error(keys["alpha"], f"{what}.alpha: a small chance, below 0.5 (e.g. 1e-3)")
                values["alpha"] = None
        if "min_episodes" in keys:
            values["min_episodes"] = r.integer(keys["min_episodes"], f"{what}.min_episodes", 1)
        if "min_peers" in keys:
            values["min_peers"] = r.integer(keys["min_peers"], f"{what}.min_peers", 1, 64)
        if any(v is None for v in values.values()):
            return None
        return PeerShare(**values)

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "field": {**sp.fields(links=False), "default": "ecc_corrected_volatile_dev"},
                "window": sp.duration("1d"),
                "alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.001,
                },
                "min_episodes": {"type": "integer", "minimum": 1, "default": 3},
                "min_peers": {"type": "integer", "minimum": 1, "maximum": 64, "default": 2},
            },
            "One GPU's share of the node's error episodes far above its fair share (binomial "
            "test against 1/k).",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, PeerShare)
        return Needs(gpu_counters=frozenset({c.field}))

    def trigger(self, c: Condition) -> Trigger:
        return "periodic"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, PeerShare)
        return {"field": c.field, "window": format_duration(c.window)}


KIND = PeerShareKind()
