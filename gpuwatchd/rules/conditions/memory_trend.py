"""``memory_trend``: device-memory errors that start, step up, or accelerate.

It reads activity, not counts (``rules/evidence.py``): 10-minute buckets in which the
counter grew, episodes (runs of them less than an hour apart) and regimes (activity after
at least ``quiet`` of silence). One condition, six signals (``signal``):

- ``acceleration``: within one regime, the active buckets of a recent window ``W`` are
  tested against those of the regime before it (``B``) with the exact conditional
  binomial test of a rate ratio (``B`` begins after the regime's first bucket, which only
  marks where the regime starts): under "the recent rate is at most ``factor`` times the
  earlier one", ``x`` recent of ``x + y`` buckets is ``Binomial(x + y, p0)`` with
  ``p0 = factor * W / (factor * W + B)``. It holds when that chance is below ``alpha``,
  whatever the GPU's own baseline rate. ``window`` may list several recent windows (a
  fast leak shows in a short one, a slow one in a long one); ``alpha`` is then shared
  among them (Bonferroni). Gates: at least ``min_active`` buckets and ``min_episodes``
  episodes in the window (one burst is one episode), at least ``min_baseline`` of regime
  before the window, and no earlier window of the regime as busy as ``peak_ratio`` of
  this one (errors that come and go with one job). Two opt-in gates, asked only of a
  window already significant: ``dispersion`` (the counts scaled down by the baseline's
  quasi-Poisson dispersion) and ``session_veto`` (a window longer than a day is no hit
  when one episode holds more than half its active buckets and has ended: an hour of
  quiet after its last bucket, so a job session on a trickle, not a stream still going).
  With ``scan`` (a step, e.g. ``1d``), a change-point scan over the whole regime follows
  the fixed windows: every window of ``k * scan`` (``k`` = 1, 2, ...) that leaves a
  baseline of at least ``scan_baseline`` and ``scan_ratio`` times the window is tested the
  same way, each at ``scan_alpha``, so a rise that began days ago (a daily phase after a
  weekly one, a regular cadence) is judged from where it began, not only by its last
  days. The scan runs in active buckets (where new activity just came). Each scanned
  window keeps every gate; what the scan costs in false drains is
  measured by ``gpuwatchd backtest`` (docs/DETECTION.md), not promised by ``scan_alpha``.
  Once it holds on a GPU, it stays true while the shortest window still holds
  ``min_active`` active buckets: the evidence keeps arriving (a leak that went on at its
  new rate), so the alert does not resolve under it.
- ``stream``: the GPU's errors have come without an hour's break for longer than
  ``stream`` (one episode), and still come, in a regime that had at least ``min_episodes``
  episodes over at least ``min_baseline`` before it. The acceleration test counts an
  episode once however long it runs (a window needs ``min_episodes`` of them), so a leak
  that turns into a continuous stream soon after its regime began is one it never sees;
  job sessions are such streams too, but end within a job's length (``stream``). The
  stream's active buckets must also be a significant rise over the regime's before it
  (the acceleration's test, ``factor`` and ``alpha``): a steady trickle of a few errors an
  hour breaks now and then, and runs unbroken for days too.
- ``activity``: a new regime (or one younger than ``min_baseline``) with at least
  ``min_active`` buckets and ``min_episodes`` episodes in the longest window.
- ``corroborated``: activity in the longest window together with the GPU certifying the
  fault itself: a correctable row remap or XID 92 or 63 on this GPU in that window, or a
  bank with low or no spare rows left (row-remapper histogram) in its latest sample.
- ``node``: one node-level alert while any GPU's activity in the longest window is
  node-wide (began after quiet on 3 or more GPUs within minutes: ``rules/node_wide.py``;
  a memory XID, 63/64/92/94/95, counts as activity of its GPU here),
  with the GPUs it touched (``gpus``). A job, a driver or a power event, not that many
  failing GPUs; ``increase``'s ``skip_node_wide`` leaves those GPUs out of the per-GPU
  ticket.

This module is the kind (its condition, keys, schema and evaluator). The verdicts on one
GPU's activity are ``memory_judge.py``'s: the acceleration test and its scan in
``memory_acceleration.py``, the windows a look may skip in ``memory_bounds.py``; the
``certified`` evidence is ``memory_certified.py``'s.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import memory_certified as mc
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NO_HITS,
    NODE_KEY,
    ConditionKind,
    Evaluator,
    Hit,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.memory_judge import JudgeMemo, judge
from gpuwatchd.rules.conditions.memory_model import SIGNALS, MemoryTrend
from gpuwatchd.rules.conditions.reading import MAX_WINDOW, BodyReader
from gpuwatchd.rules.conditions.recheck import Recheck
from gpuwatchd.rules.evidence import BUCKET, Activity, bucket_of
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.node_wide import (
    NodeLook,
    node_wide_gpus,
    with_memory_xids,
    xid_event_gpus,
)
from gpuwatchd.rules.rate_limited import lookback, note
from gpuwatchd.rules.snapshot import GpuView, Snapshot
from gpuwatchd.rules.store import StateStore

RECHECK = 300.0  # seconds between looks at a GPU whose counter did not move
CERTIFIED_SIGNATURE = "memory-certified-xids-1"  # the saved XIDs' format (rules store)
log = logging.getLogger(__name__)
REMAP_FIELD = "remapped_rows_correctable"
CORROBORATING_XIDS = frozenset({63, 92})
# Row-remapper histogram levels that mean a bank has been remapping rows again and again.
SPARE_ROWS_SHORT = ("row_remap_banks_low", "row_remap_banks_none")


def _corroboration(c: MemoryTrend, g: GpuView, snap: Snapshot, now: float) -> str | None:
    remaps = g.data.hist.get(REMAP_FIELD)
    if remaps is not None and remaps.increase(now - c.window, now) > 0:
        return "a correctable row remap"
    sample = g.latest
    if sample is not None and any(sample.fields.get(f, 0.0) > 0 for f in SPARE_ROWS_SHORT):
        return "a bank with low or no spare rows left"
    start = now - c.window
    for x in snap.xids.events:
        ev = x.event
        if ev.xid in CORROBORATING_XIDS and ev.timestamp >= start and snap.gpu_of(ev) == g.index:
            return f"XID {ev.xid}"
    return None


class _Evaluator(Evaluator):
    __slots__ = (
        "c",
        "certified_hits",
        "certs",
        "look",
        "memos",
        "node",
        "restored",
        "sustained",
    )

    def __init__(self, rule: Rule) -> None:
        super().__init__(rule)
        self.c = model_of(rule, MemoryTrend)
        self.look = Recheck(RECHECK)
        self.certs = mc.Certificates()
        self.certified_hits: Hits = {}  # the last look's (certified), while nothing moved
        self.restored = False  # saved XIDs taken back (or adopted from a reload)
        self.sustained: dict[int, dict[str, Any]] = {}  # GPU -> its hit's values, while held
        self.memos: dict[int, JudgeMemo] = {}  # GPU -> its last verdict
        self.node = NodeLook()  # signal: node, while no memory XID is in its window

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator):
            self.certs.adopt(old.certs)
            self.restored = True
            if old.c.windows == self.c.windows and old.c.min_active == self.c.min_active:
                self.sustained = old.sustained

    def restore(self, store: StateStore, snap: Snapshot, now: float) -> None:
        if self.c.signal != "certified" or self.restored:
            return
        self.restored = True
        records, bad = store.load_episodes(self.rule.name, CERTIFIED_SIGNATURE)
        bad += self.certs.load(records, snap, now)
        if bad:
            log.warning(
                "rule %s: %d saved XID(s) made no sense and were dropped", self.rule.name, bad
            )
            self.certs.dirty = True  # rewrite the saved state without them

    def save(self, store: StateStore, now: float) -> None:
        certs = self.certs
        if certs.dirty and store.save_episodes(
            self.rule.name, CERTIFIED_SIGNATURE, certs.records()
        ):
            certs.dirty = False

    def _certified(self, snap: Snapshot, now: float, fresh: bool) -> Result:
        c = self.c
        certs = self.certs
        targets, unknown = snap.targets(self.rule)
        fields = mc.FIELDS | {c.field}
        if not fresh and certs.unchanged(snap, fields, now):
            # nothing it reads moved since a recent look: the same verdict, for the GPUs
            # still looked at (evidence only ages out over days: looked at every 5 min)
            indexes = {g.index for g in targets}
            return {k: v for k, v in self.certified_hits.items() if k[0] in indexes}, unknown
        certs.take(snap, now, c.window)
        hits: Hits = {}
        for g in targets:
            why = mc.certified(certs, g, c.field, c.window, now)
            if why is not None:
                hits[(g.index, -1, -1)] = (1.0, {"evidence": why})
        self.certified_hits = hits
        return dict(hits), unknown

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        if c.signal == "certified":
            return self._certified(snap, now, fresh)
        if c.signal == "node":
            return self._node(snap, now)
        look = self.look
        corroborated = c.signal == "corroborated"
        if not active and not fresh and not corroborated and look.node_quiet(snap, c.field, now):
            return NO_HITS, set()
        targets, unknown = snap.targets(self.rule)
        hits: Hits = {}
        for g in targets:
            h = g.data.hist.get(c.field)
            if h is None:
                continue
            act = h.activity
            if not act.buckets:
                continue
            if not corroborated and look.unchanged(h, act.version, now):
                continue
            memo = self.memos.get(g.index)
            if memo is None:
                memo = self.memos[g.index] = JudgeMemo()
            hit = judge(c, act, now, memo)
            if c.signal == "acceleration":
                hit = self._sustain(g.index, act, now, hit)
            if hit is not None and corroborated:
                why = _corroboration(c, g, snap, now)
                if why is None:
                    hit = None
                else:
                    assert hit[1] is not None
                    hit[1]["evidence"] = why
            look.record(h, act.version, now, hit is not None)
            if hit is not None:
                limited = note(snap, c.field, g.index, now, c.window)
                if limited:  # a new dict: the memo and the sustained verdict keep theirs
                    hit = hit[0], {**(hit[1] or {}), "rate_limited": limited}
                hits[(g.index, -1, -1)] = hit
        return hits, unknown

    def _node(self, snap: Snapshot, now: float) -> Result:
        c = self.c
        b1 = bucket_of(now) + 1
        b0 = b1 - int(c.window // BUCKET)
        acts = self.node.look(snap, c.field, b0, b1)
        with_xids = with_memory_xids(snap, acts, b0)
        found = self.node.node_wide() if with_xids is acts else node_wide_gpus(with_xids, b0, b1)
        gpus = sorted(set(found) | xid_event_gpus(snap, b0))
        if not gpus:
            return NO_HITS, set()
        values: dict[str, Any] = {"gpus": ", ".join(map(str, gpus))}
        return {NODE_KEY: (float(len(gpus)), values)}, set()

    def _sustain(self, gpu: int, act: Activity, now: float, hit: Hit | None) -> Hit | None:
        """An acceleration holds on while its evidence keeps arriving: after a hit, the
        condition stays true as long as the shortest window still holds ``min_active``
        active buckets (a leak that went on at its new rate is no longer a *rise* to the
        test, and its peak veto sees an earlier window as busy; yet nothing subsided)."""
        if hit is not None:
            assert hit[1] is not None
            self.sustained[gpu] = hit[1]
            return hit
        last = self.sustained.get(gpu)
        if last is None:
            return None
        c = self.c
        width = int(min(c.windows) // BUCKET)
        b1 = bucket_of(now) + 1
        x = act.count(b1 - width, b1)
        if x < c.min_active:
            del self.sustained[gpu]
            return None
        values = dict(last)
        values.update(
            active=x,
            episodes=act.episodes(b1 - width, b1),
            window=format_duration(width * BUCKET),
            recent_rate=round(x / (width * BUCKET / 86400.0), 2),
        )
        return float(x), values


class MemoryTrendKind(ConditionKind):
    key = "memory_trend"
    keys = (
        "signal",
        "field",
        "window",
        "factor",
        "alpha",
        "min_active",
        "min_episodes",
        "min_baseline",
        "quiet",
        "peak_ratio",
        "dispersion",
        "session_veto",
        "scan",
        "scan_alpha",
        "scan_baseline",
        "scan_ratio",
        "stream",
    )
    placeholders = frozenset(
        {
            "field",
            "window",
            "active",
            "episodes",
            "regime_age",
            "evidence",
            "p_value",
            "baseline_rate",
            "recent_rate",
            "gpus",
            "rate_limited",
            "stream_age",
        }
    )

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        r = p.r
        values: dict[str, Any] = {}
        if "signal" in keys:
            values["signal"] = r.string(keys["signal"], f"{what}.signal", SIGNALS)
        if "field" in keys:
            found = p.field(keys["field"], f"{what}.field", counter=True, allow_link=False)
            values["field"] = found[0] if found is not None else None
        if "window" in keys:
            values["windows"] = self._windows(p, keys["window"], f"{what}.window")
        for name in ("min_baseline", "quiet", "scan", "scan_baseline", "stream"):
            if name in keys:
                values[name] = p.window(keys[name], f"{what}.{name}")
        if "factor" in keys:
            values["factor"] = r.number(keys["factor"], f"{what}.factor", minimum=1.0)
        for name in ("alpha", "scan_alpha"):
            if name in keys:
                values[name] = r.number(keys[name], f"{what}.{name}", minimum=1e-12)
                if values[name] is not None and values[name] >= 0.5:
                    p.error(keys[name], f"{what}.{name}: a small chance, below 0.5 (e.g. 1e-4)")
                    values[name] = None
        if "scan_ratio" in keys:
            values["scan_ratio"] = r.number(keys["scan_ratio"], f"{what}.scan_ratio", minimum=0.0)
        for name in ("min_active", "min_episodes"):
            if name in keys:
                values[name] = r.integer(keys[name], f"{what}.{name}", 1, 10000)
        if "peak_ratio" in keys:
            values["peak_ratio"] = r.number(keys["peak_ratio"], f"{what}.peak_ratio", minimum=0.0)
        for name in ("dispersion", "session_veto"):
            if name in keys:
                values[name] = r.boolean(keys[name], f"{what}.{name}")
        if any(v is None for v in values.values()):
            return None
        c = MemoryTrend(**values)
        if c.signal == "certified":
            if c.window > MAX_WINDOW:
                p.error(body, f"{what}: window must be at most 30d (history kept)")
                return None
        elif c.window + c.min_baseline > MAX_WINDOW:
            p.error(body, f"{what}: window + min_baseline must be at most 30d (history kept)")
            return None
        return c

    @staticmethod
    def _windows(p: BodyReader, node: Node, what: str) -> tuple[float, ...] | None:
        items = p.r.sequence(node, what) if node.is_sequence() else [node]
        if not items:
            if items is not None:
                p.error(node, f"{what}: name at least one window")
            return None
        out: list[float] = []
        for item in items:
            w = p.window(item, what)
            if w is None:
                return None
            if w < BUCKET:
                p.error(item, f"{what}: at least 10m (one activity bucket), got {item.value!r}")
                return None
            out.append(w)
        return tuple(sorted(set(out)))

    def schema(self) -> sp.Schema:
        counters = sp.fields(links=False)
        return sp.body(
            {
                "signal": {"enum": list(SIGNALS), "default": "acceleration"},
                "field": {**counters, "default": "ecc_corrected_volatile_dev"},
                "window": {
                    "oneOf": [
                        sp.DURATION,
                        {"type": "array", "items": sp.DURATION, "minItems": 1},
                    ],
                    "default": ["1d", "3d"],
                },
                "factor": {"type": "number", "minimum": 1, "default": 1},
                "alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.003,
                },
                "min_active": {"type": "integer", "minimum": 1, "default": 3},
                "min_episodes": {"type": "integer", "minimum": 1, "default": 3},
                "min_baseline": sp.duration("1d"),
                "quiet": sp.duration("28d"),
                "peak_ratio": {"type": "number", "minimum": 0, "default": 0.3},
                "dispersion": {"type": "boolean", "default": False},
                "session_veto": {"type": "boolean", "default": False},
                "scan": sp.DURATION,
                "scan_alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.1,
                },
                "scan_baseline": sp.duration("7d"),
                "scan_ratio": {"type": "number", "minimum": 0, "default": 1.5},
                "stream": sp.duration("2d"),
            },
            "Device-memory errors as activity (10-minute buckets, episodes, regimes): a "
            "significant acceleration within a regime (exact conditional binomial test), new "
            "activity, or activity the GPU corroborates (a correctable remap, a bank low on "
            "spare rows, XID 92 or 63); errors without an hour's break for longer than "
            "stream, after earlier episodes of their regime (signal stream); or, as one node "
            "alert, activity on 3 or more GPUs within minutes (signal node).",
            optional_body=True,
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, MemoryTrend)
        if c.signal == "certified":
            return Needs(gpu_counters=frozenset({c.field, *mc.FIELDS}), xid_window=mc.NODE_SPAN)
        if c.signal == "corroborated":
            return Needs(gpu_counters=frozenset({c.field, REMAP_FIELD}), xid_window=c.window)
        if c.signal == "node":
            return Needs(gpu_counters=frozenset({c.field}), xid_window=c.window)
        # XID 92 within the window says the count is a lower bound (rate_limited)
        return Needs(gpu_counters=frozenset({c.field}), xid_window=lookback(c.field, c.window))

    def trigger(self, c: Condition) -> Trigger:
        assert isinstance(c, MemoryTrend)
        return "sample" if c.signal in ("corroborated", "certified") else "periodic"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, MemoryTrend)
        return {"field": c.field, "window": format_duration(c.window), "rate_limited": ""}


KIND = MemoryTrendKind()
