"""``peer_outlier``: one GPU's value far from the median of the other GPUs on the node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

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
from gpuwatchd.rules.conditions.recheck import Recheck
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import GpuView, Snapshot

RECHECK = 60.0  # counters: look again this often even when none moved (errors age out)


@dataclass(frozen=True)
class PeerOutlier(Condition):
    """One GPU's value far from the median of the other GPUs on the node."""

    field: str
    direction: Literal["above", "below"]
    ratio: float
    min_delta: float = 0.0
    window: float | None = None  # counters: compare the increase over this window
    min_peers: int = 2


def median(values: list[float]) -> float:
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2.0


class _Evaluator(Evaluator):
    __slots__ = ("c", "look")

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, PeerOutlier)
        self.look = Recheck(RECHECK)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        # Counters: nothing to do unless one of them moved (or once a minute, for errors
        # leaving the window).
        if c.window is not None and not active and self.look.node_quiet(snap, c.field, now):
            return {}, set()
        targets, unknown = snap.targets(self.rule)
        pairs: list[tuple[float, GpuView]] = []
        for g in targets:
            if c.window is None:
                s = g.sample
                v = s.fields.get(c.field) if s is not None else None
                if v is None:
                    unknown.add(g.index)
                    continue
            else:
                h = g.data.hist.get(c.field)
                if h is None:
                    continue
                v = h.increase(now - c.window, now)
            pairs.append((v, g))
        hits: Hits = {}
        if len(pairs) < c.min_peers + 1:
            return hits, unknown
        values = sorted(v for v, _ in pairs)
        lo, hi = values[0], values[-1]
        if hi - lo < c.min_delta:
            return hits, unknown
        if c.direction == "below" and lo >= c.ratio * hi:
            return hits, unknown
        if c.direction == "above" and hi <= c.ratio * lo:
            return hits, unknown
        for v, g in pairs:
            others = list(values)
            others.remove(v)
            m = median(others)
            if c.direction == "below":
                bad = v < c.ratio * m and m - v >= c.min_delta
            else:
                bad = v > c.ratio * m and v - m >= c.min_delta
            if bad:
                hits[(g.index, -1, -1)] = (v, {"peers_median": m})
        return hits, unknown


class PeerOutlierKind(ConditionKind):
    key = "peer_outlier"
    keys = ("field", "direction", "ratio", "min_delta", "window", "min_peers")
    placeholders = frozenset({"field", "peers_median"})

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("field", "direction", "ratio"), what):
            return None
        r = p.r
        window = None
        if "window" in keys:
            window = p.window(keys["window"], f"{what}.window")
            if window is None:
                return None
        found = p.field(
            keys["field"], f"{what}.field", counter=window is not None, allow_link=False
        )
        direction = r.string(keys["direction"], f"{what}.direction", ("above", "below"))
        ratio = r.number(keys["ratio"], f"{what}.ratio", minimum=0.0)
        min_delta: float | None = 0.0
        if "min_delta" in keys:
            min_delta = p.value(
                keys["min_delta"], f"{what}.min_delta", found[1] if found and not window else None
            )
        min_peers = 2
        if "min_peers" in keys:
            min_peers = r.integer(keys["min_peers"], f"{what}.min_peers", 1, 64) or 2
        if found is None or direction is None or ratio is None or min_delta is None:
            return None
        if (direction == "above" and ratio < 1.0) or (direction == "below" and ratio > 1.0):
            p.error(
                keys["ratio"],
                f"{what}.ratio: for direction {direction!r} the ratio must be "
                f"{'>= 1' if direction == 'above' else '<= 1'} (e.g. "
                f"{'3: three times the median' if direction == 'above' else '0.8: 80% of it'})",
            )
            return None
        return PeerOutlier(
            found[0],
            "above" if direction == "above" else "below",
            ratio,
            min_delta,
            window,
            min_peers,
        )

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "field": sp.fields(links=False),
                "direction": {"enum": ["above", "below"]},
                "ratio": {"type": "number", "minimum": 0},
                "min_delta": sp.VALUE,
                "window": sp.duration(),
                "min_peers": {"type": "integer", "minimum": 1, "maximum": 64, "default": 2},
            },
            "A GPU far from the median of the other GPUs (a gauge now, or a counter's "
            "increase over window).",
            required=("field", "direction", "ratio"),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, PeerOutlier)
        return Needs(gpu_counters=frozenset({c.field}) if c.window is not None else frozenset())

    def trigger(self, c: Condition) -> Trigger:
        assert isinstance(c, PeerOutlier)
        return "periodic" if c.window is not None else "sample"

    def reads(self, c: Condition) -> frozenset[str] | None:
        assert isinstance(c, PeerOutlier)
        return frozenset({c.field})

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, PeerOutlier)
        out: dict[str, Any] = {"field": c.field}
        if c.window is not None:
            out["window"] = format_duration(c.window)
        return out


KIND = PeerOutlierKind()
