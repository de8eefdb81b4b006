"""``peer_deviation``: a GPU's gauge far from the median of the node's other GPUs.

For each GPU, its peers are the node's other GPUs that the rule looks at (``select``, and
``when`` on both sides: "under load" compares loaded GPUs with loaded GPUs) and that have a
value. With ``m`` the peers' median and ``s`` their robust spread (1.4826 x the median
absolute deviation from ``m``, which estimates a standard deviation without letting one
odd GPU widen it), the condition holds where

    value - m > max(k x s, floor)        (direction above; below: m - value; both: |...|)

and at least ``min_peers`` peers have a value. The floor keeps a node whose GPUs agree to a
tenth of a degree from flagging a 1 C difference; ``k`` scales with the node's own spread;
a shift of every GPU together moves the median with it and flags none. Sustain it with the
rule's ``for``. ``similar: {field, within}`` narrows each GPU's peers to those under at
least a similar load: for ``above``, peers whose ``field`` (power draw, say) is not lower
than the GPU's own by more than ``within`` (a fraction), so a GPU that one job works harder
is not compared with idler ones, while a GPU that runs hotter on *less* power (a throttling
one) still is; ``below`` mirrors it, ``both`` keeps peers within the band either way.
Pure arithmetic on the latest samples: a few microseconds for 8 GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    ConditionKind,
    Evaluator,
    Hits,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import GpuView, Snapshot

Direction = Literal["above", "below", "both"]
DIRECTIONS: tuple[Direction, ...] = ("above", "below", "both")
MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal


@dataclass(frozen=True)
class PeerDeviation(Condition):
    """A GPU's gauge more than max(k robust spreads, floor) from its peers' median."""

    field: str
    floor: float
    direction: Direction = "above"
    k: float = 3.0
    min_peers: int = 3
    similar_field: str | None = None  # peers only with this gauge close to the GPU's
    similar_within: float = 0.25  # ... within this fraction of the larger of the two


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


def peer_stats(peers: list[float]) -> tuple[float, float]:
    """(median, robust spread) of the peers' values (``peers`` sorted)."""
    m = _median(peers)
    return m, MAD_TO_SIGMA * _median(sorted(abs(v - m) for v in peers))


def similar(a: float, b: float, within: float, direction: Direction = "both") -> bool:
    """Whether a peer's load ``b`` is comparable with a GPU's load ``a``: for ``both``
    within ``within`` of the larger (both near 0: yes); for ``above`` not lower than ``a``
    by more than that (a GPU is not judged hotter than idler peers); ``below`` mirrors."""
    band = within * max(abs(a), abs(b), 1e-9)
    if direction == "above":
        return b >= a - band
    if direction == "below":
        return b <= a + band
    return abs(a - b) <= band


def deviations(
    values: list[float], c: PeerDeviation, loads: list[float] | None = None
) -> list[tuple[int, float, float, float] | None]:
    """Per value: ``(i, deviation, median, limit)`` where the condition holds, else None.

    ``deviation`` is value minus the median of the *other* values (with ``loads``, only of
    those whose load is similar, ``c.similar_within``); ``limit`` the larger of ``k``
    robust spreads and the floor."""
    ordered = sorted(values)
    out: list[tuple[int, float, float, float] | None] = []
    if len(values) < c.min_peers + 1:
        return [None] * len(values)
    for i, v in enumerate(values):
        if loads is None:
            peers = list(ordered)
            peers.remove(v)
        else:
            peers = sorted(
                values[j]
                for j in range(len(values))
                if j != i and similar(loads[i], loads[j], c.similar_within, c.direction)
            )
            if len(peers) < c.min_peers:
                out.append(None)
                continue
        m, spread = peer_stats(peers)
        limit = max(c.k * spread, c.floor)
        d = v - m
        far = (
            d > limit
            if c.direction == "above"
            else -d > limit
            if c.direction == "below"
            else abs(d) > limit
        )
        out.append((i, d, m, limit) if far else None)
    return out


class _Evaluator(Evaluator):
    __slots__ = ("c",)

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, PeerDeviation)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        targets, unknown = snap.targets(self.rule)
        values: list[float] = []
        loads: list[float] = []
        gpus: list[GpuView] = []
        for g in targets:
            s = g.sample
            v = s.fields.get(c.field) if s is not None else None
            load = 0.0
            if s is not None and c.similar_field is not None:
                seen = s.fields.get(c.similar_field)
                v = None if seen is None else v  # no load to compare: cannot be told
                load = seen or 0.0
            if v is None:
                unknown.add(g.index)
                continue
            values.append(v)
            loads.append(load)
            gpus.append(g)
        hits: Hits = {}
        for found in deviations(values, c, loads if c.similar_field is not None else None):
            if found is not None:
                i, d, m, limit = found
                extra = {"peers_median": m, "deviation": d, "limit": limit}
                hits[(gpus[i].index, -1, -1)] = (values[i], extra)
        return hits, unknown


class PeerDeviationKind(ConditionKind):
    key = "peer_deviation"
    keys = ("field", "direction", "k", "floor", "min_peers", "similar")
    placeholders = frozenset({"field", "peers_median", "deviation", "limit"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("field", "floor"), what):
            return None
        r = p.r
        found = p.field(keys["field"], f"{what}.field", allow_link=False)
        if found is not None and found[1].kind == "counter":
            p.error(
                keys["field"],
                f"{what}.field: {found[0]!r} is a counter; peer_deviation compares gauges "
                "(for a counter's growth use peer_outlier with a window, or peer_share)",
            )
            found = None
        values: dict[str, Any] = {}
        if "direction" in keys:
            values["direction"] = r.string(keys["direction"], f"{what}.direction", DIRECTIONS)
        if "k" in keys:
            values["k"] = r.number(keys["k"], f"{what}.k", minimum=0.0, maximum=100.0)
        floor = p.value(keys["floor"], f"{what}.floor", found[1] if found else None)
        if floor is not None and floor <= 0:
            p.error(keys["floor"], f"{what}.floor: must be above 0 (in the field's unit)")
            floor = None
        if "min_peers" in keys:
            values["min_peers"] = r.integer(keys["min_peers"], f"{what}.min_peers", 2, 64)
        if "similar" in keys:
            sim = r.mapping(keys["similar"], ["field", "within"], f"{what}.similar", ("field",))
            if sim is None or "field" not in sim:
                return None
            load = p.field(sim["field"], f"{what}.similar.field", allow_link=False)
            values["similar_field"] = load[0] if load is not None else None
            if load is not None and load[1].kind == "counter":
                p.error(sim["field"], f"{what}.similar.field: {load[0]!r} is a counter")
                values["similar_field"] = None
            if "within" in sim:
                values["similar_within"] = r.number(
                    sim["within"], f"{what}.similar.within", minimum=0.0, maximum=10.0
                )
        if found is None or floor is None or any(v is None for v in values.values()):
            return None
        return PeerDeviation(found[0], floor, **values)

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "field": sp.fields(links=False),
                "direction": {"enum": list(DIRECTIONS), "default": "above"},
                "k": {"type": "number", "minimum": 0, "maximum": 100, "default": 3},
                "floor": sp.VALUE,
                "min_peers": {"type": "integer", "minimum": 2, "maximum": 64, "default": 3},
                "similar": {
                    "type": "object",
                    "description": "Peers only under a similar load: their field within "
                    "`within` (a fraction of the larger) of the GPU's own.",
                    "properties": {
                        "field": sp.fields(links=False),
                        "within": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 10,
                            "default": 0.25,
                        },
                    },
                    "required": ["field"],
                    "additionalProperties": False,
                },
            },
            "A GPU's gauge more than max(k robust spreads, floor) from the median of the "
            "node's other GPUs (median absolute deviation); at least min_peers of them.",
            required=("field", "floor"),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def trigger(self, c: Condition) -> Trigger:
        return "sample"

    def reads(self, c: Condition) -> frozenset[str] | None:
        assert isinstance(c, PeerDeviation)
        return frozenset({c.field} if c.similar_field is None else {c.field, c.similar_field})

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, PeerDeviation)
        return {"field": c.field}


KIND = PeerDeviationKind()
