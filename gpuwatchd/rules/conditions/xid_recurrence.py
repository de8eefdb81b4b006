"""``xid_recurrence``: an XID that keeps coming back on one GPU, faster and faster.

XID lines are grouped before anything is counted:

- an *episode* is one GPU's lines of one code less than ``episode_gap`` apart (one job
  printing the same XID a thousand times is one episode);
- an episode is an *independent repeat* when it starts at least ``independent_gap`` after
  the previous independent one and, where both lines name a process, from another
  process (a job that hits the same fault again an hour later is not new evidence
  about the GPU... unless it is another job);
- an episode whose code shows up on ``node_gpus`` or more GPUs of the node within
  ``node_window`` is a *node event* (a driver, fabric or software fault, not one bad GPU):
  it never counts for a GPU. ``signal: node`` raises those as one node-level alert.

``signal: recurrence`` then tests the GPU's independent repeats like ``memory_trend``
tests activity: the repeats of the last ``window`` against those earlier in ``history``,
with the exact conditional binomial test of a rate ratio (``factor``, ``alpha``), at
least ``min_repeats`` in the window and ``min_baseline`` of history before it. A code
that is new on the GPU with ``min_repeats`` independent repeats in the window holds too
when ``new_counts`` is set (a first streak; off by default).

Episodes survive a restart: the evaluator saves them with the rule engine's state
(``StateStore.save_episodes``, by GPU UUID, 36 days, at most 1024 per GPU) every minute and
at shutdown, and takes them back before its first evaluation. A save first groups the XIDs
the engine took in since the rule's last look (the rule runs on the periodic tick), so the
newest episodes are saved too. Rows that do not make sense
(unknown code, start after end, unreadable) are dropped with a warning; a rule whose
grouping parameters changed (codes, gaps, node settings) starts afresh. Episodes that start
after now (a start with the clock behind: an RTC that lost its time, NTP not yet synced)
are neither used nor dropped: they are kept aside, saved again with the rest, and taken
back once the clock has caught up with them (issue 26: such a start deleted them all).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    NODE_KEY,
    ConditionKind,
    Evaluator,
    Hits,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import MAX_WINDOW, BodyReader
from gpuwatchd.rules.conditions.xid import catalog_codes, code_values
from gpuwatchd.rules.evidence import rate_ratio_p_value
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot
from gpuwatchd.rules.store import (
    EPISODE_RETENTION,
    EPISODES_PER_GPU,
    EpisodeRecord,
    StateStore,
)

log = logging.getLogger(__name__)

Signal = Literal["recurrence", "node"]
SIGNALS: tuple[Signal, ...] = ("recurrence", "node")
MAX_EPISODES = 4096  # per GPU and code: older ones are forgotten first


@dataclass(frozen=True)
class XidRecurrence(Condition):
    codes: frozenset[int]
    signal: Signal = "recurrence"
    window: float = 2 * 86400.0
    history: float = 21 * 86400.0
    factor: float = 1.0
    alpha: float = 1e-3
    min_repeats: int = 3
    min_baseline: float = 86400.0
    new_counts: bool = False
    episode_gap: float = 180.0
    independent_gap: float = 3600.0
    node_gpus: int = 3
    node_window: float = 60.0


# Flags of a saved episode.
INDEPENDENT, NODE, OPEN, RECENT = 1, 2, 4, 8
MAX_PIDS = 64  # processes remembered per episode


class _Episode:
    __slots__ = ("end", "gpu", "independent", "node", "pids", "start", "uuid", "xid")

    def __init__(self, gpu: int, xid: int, t: float, pid: int | None, uuid: str = "") -> None:
        self.gpu = gpu
        self.uuid = uuid  # the GPU's UUID ("" when the view had none): saved by it
        self.xid = xid
        self.start = t
        self.end = t
        self.pids: set[int] = set() if pid is None else {pid}
        self.independent = False
        self.node = False


def signature(c: XidRecurrence) -> str:
    """What the episodes depend on: saved ones are used only by a rule that groups alike."""
    codes = ",".join(map(str, sorted(c.codes)))
    return f"v1 codes={codes} gap={c.episode_gap:g} indep={c.independent_gap:g} " + (
        f"node={c.node_gpus}/{c.node_window:g}"
    )


class _Evaluator(Evaluator):
    __slots__ = (
        "adopted",
        "ahead",
        "c",
        "cursor",
        "dirty",
        "last_node",
        "open",
        "pending",
        "recent",
        "repeats",
        "snap",
    )

    def __init__(self, rule: Rule, snap: Snapshot) -> None:
        super().__init__(rule)
        self.c = model_of(rule, XidRecurrence)
        self.snap = snap  # the engine's snapshot: its XID log is read at a save too
        self.cursor = snap.xids.seq
        self.open: dict[tuple[int, int], _Episode] = {}  # (gpu, xid) -> latest episode
        self.repeats: dict[tuple[int, int], deque[_Episode]] = {}  # independent ones
        self.recent: deque[_Episode] = deque()  # episode starts, for node events
        self.last_node: dict[int, float] = {}  # xid -> start of the last node event
        self.pending: dict[str, list[EpisodeRecord]] = {}  # saved, GPU not seen yet
        self.ahead: list[EpisodeRecord] = []  # saved, starting after now: clock behind
        self.dirty = False  # changed since the last save
        self.adopted = False

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator) and signature(old.c) == signature(self.c):
            self.cursor, self.open, self.repeats = old.cursor, old.open, old.repeats
            self.recent, self.last_node = old.recent, old.last_node
            self.pending, self.dirty, self.adopted = old.pending, old.dirty, True
            self.ahead = old.ahead

    # -- saving and restoring ---------------------------------------------------------------
    def save(self, store: StateStore, now: float) -> None:
        if self.snap.xids.seq != self.cursor:
            # XIDs the engine took in since this rule last looked (it runs on the periodic
            # tick, the save may come first: at a stop): grouped now, or they would be
            # missing from the saved episodes after a restart (issue 24: 7 of 12 found)
            self.restore(store, self.snap, now)  # the saved ones first (once)
            self._take(self.snap)
        if self.ahead:  # the clock caught up with some: they count from the next look
            due = [r for r in self.ahead if r.start <= now]
            if due:
                self.ahead = [r for r in self.ahead if r.start > now]
                for r in due:
                    self.pending.setdefault(r.uuid, []).append(r)
        if not self.dirty:
            return
        if store.save_episodes(self.rule.name, signature(self.c), self._records(now)):
            self.dirty = False

    def _records(self, now: float) -> list[EpisodeRecord]:
        flags: dict[int, int] = {}
        episodes: dict[int, _Episode] = {}

        def mark(ep: _Episode, flag: int) -> None:
            episodes[id(ep)] = ep
            flags[id(ep)] = flags.get(id(ep), 0) | flag | (NODE if ep.node else 0)

        for reps in self.repeats.values():
            for ep in reps:
                mark(ep, INDEPENDENT)
        for ep in self.open.values():
            mark(ep, OPEN)
        for ep in self.recent:
            mark(ep, RECENT)
        oldest = now - EPISODE_RETENTION
        per_gpu: dict[str, list[EpisodeRecord]] = {}
        for key, ep in episodes.items():
            if ep.end < oldest:
                continue
            uuid = ep.uuid or f"index:{ep.gpu}"
            pids = tuple(sorted(ep.pids))[:MAX_PIDS]
            rec = EpisodeRecord(uuid, ep.xid, ep.start, ep.end, pids, flags[key])
            per_gpu.setdefault(uuid, []).append(rec)
        out: list[EpisodeRecord] = []
        for recs in per_gpu.values():
            recs.sort(key=lambda r: r.start)
            out.extend(recs[-EPISODES_PER_GPU:])
        for records in self.pending.values():  # GPUs not seen since the start: keep them
            out.extend(r for r in records if r.end >= oldest)
        out.extend(self.ahead)  # never dropped for the clock being behind
        return out

    def restore(self, store: StateStore, snap: Snapshot, now: float) -> None:
        if self.adopted:
            return
        self.adopted = True  # once
        records, bad = store.load_episodes(self.rule.name, signature(self.c))
        kept: list[EpisodeRecord] = []
        for r in records:
            if (
                r.xid not in self.c.codes
                or not (math.isfinite(r.start) and math.isfinite(r.end))
                or r.start > r.end
                or r.flags & ~(INDEPENDENT | NODE | OPEN | RECENT)
            ):
                bad += 1
                continue
            if r.start > now:
                self.ahead.append(r)
                continue
            kept.append(r)
        if bad:
            log.warning(
                "rule %s: %d saved XID episode(s) made no sense (unknown code, start after "
                "end, or unreadable) and were dropped",
                self.rule.name,
                bad,
            )
            self.dirty = True  # rewrite the saved state without them
        if self.ahead:
            log.warning(
                "rule %s: %d saved XID episode(s) start after now (is the clock behind?): "
                "kept aside, and used once the clock has caught up with them",
                self.rule.name,
                len(self.ahead),
            )
        for r in kept:
            self.pending.setdefault(r.uuid, []).append(r)
        self._place(snap)

    def _place(self, snap: Snapshot) -> None:
        """Move saved episodes whose GPU is in the view into the evaluator's tables."""
        found: list[tuple[int, EpisodeRecord]] = []
        for uuid in list(self.pending):
            if uuid.startswith("index:"):
                gpu = int(uuid.removeprefix("index:"))
            else:
                gpu = snap.by_uuid.get(uuid, -1)
                if gpu < 0:
                    continue
            found.extend((gpu, r) for r in self.pending.pop(uuid))
        found.sort(key=lambda item: item[1].start)
        moved: set[tuple[int, int]] = set()
        for gpu, r in found:
            ep = _Episode(gpu, r.xid, r.start, None, "" if r.uuid.startswith("index:") else r.uuid)
            ep.end, ep.pids = r.end, set(r.pids)
            ep.independent, ep.node = bool(r.flags & INDEPENDENT), bool(r.flags & NODE)
            key = (gpu, r.xid)
            if ep.independent:
                self.repeats.setdefault(key, deque(maxlen=MAX_EPISODES)).append(ep)
                moved.add(key)
            if r.flags & OPEN:
                self.open[key] = ep
            if r.flags & RECENT:
                self.recent.append(ep)
            if ep.node:
                self.last_node[r.xid] = max(self.last_node.get(r.xid, ep.start), ep.start)
        for key in moved:  # in time order, also next to episodes seen since the start
            reps = self.repeats[key]
            if any(a.start > b.start for a, b in zip(reps, list(reps)[1:], strict=False)):
                self.repeats[key] = deque(sorted(reps, key=lambda e: e.start), MAX_EPISODES)
        if found:
            self.recent = deque(sorted(self.recent, key=lambda e: e.start))

    def _take(self, snap: Snapshot) -> set[tuple[int, int]]:
        """Group the XIDs that arrived since the last look; the keys that moved."""
        c = self.c
        log = snap.xids
        new = list(log.newest_first(self.cursor))
        self.cursor = log.seq
        if self.pending and snap.by_uuid:
            self._place(snap)
        moved: set[tuple[int, int]] = set()
        for ev in reversed(new):
            if ev.xid not in c.codes:
                continue
            gpu = snap.gpu_of(ev)
            if gpu < 0:
                continue
            key = (gpu, ev.xid)
            t = ev.timestamp
            ep = self.open.get(key)
            self.dirty = True
            if ep is not None and t - ep.end < c.episode_gap:
                ep.end = max(ep.end, t)
                if ev.pid is not None and len(ep.pids) < MAX_PIDS:
                    ep.pids.add(ev.pid)
                continue
            view = snap.by_index.get(gpu)
            uuid = view.info.uuid if view is not None else ""
            ep = self.open[key] = _Episode(gpu, ev.xid, t, ev.pid, uuid)
            reps = self.repeats.setdefault(key, deque(maxlen=MAX_EPISODES))
            last = reps[-1] if reps else None
            if last is None or (
                t - last.start >= c.independent_gap
                and not (ep.pids and last.pids and ep.pids <= last.pids)
            ):
                ep.independent = True
                reps.append(ep)
            self._node_check(ep)
            moved.add(key)
        return moved

    def _node_check(self, ep: _Episode) -> None:
        c = self.c
        recent = self.recent
        recent.append(ep)
        while recent and recent[0].start < ep.start - c.node_window:
            recent.popleft()
        same = [e for e in recent if e.xid == ep.xid and abs(e.start - ep.start) <= c.node_window]
        if len({e.gpu for e in same}) >= c.node_gpus:
            for e in same:
                e.node = True
            self.last_node[ep.xid] = ep.start

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        moved = self._take(snap)
        hits: Hits = {}
        if c.signal == "node":
            for xid, t in self.last_node.items():
                if now - t < c.window:
                    gpus = sorted({e.gpu for e in self.recent if e.xid == xid and e.node})
                    values = {"xid": xid, "gpus": ", ".join(map(str, gpus))}
                    hits[NODE_KEY] = (float(len(gpus)), values | code_values(snap.catalog, xid))
            return hits, set()
        keys = self.repeats if (active or fresh or not moved) else moved
        allowed = None
        if self.rule.select is not None:
            allowed = {g.index for g in snap.selected(self.rule)}
        for key in keys:
            if allowed is not None and key[0] not in allowed:
                continue
            hit = self._recurring(key, now)
            if hit is not None:
                hit[1].update(code_values(snap.catalog, key[1]))
                hits[(key[0], -1, key[1] if len(c.codes) > 1 else -1)] = hit
        return hits, set()

    def _recurring(self, key: tuple[int, int], now: float) -> tuple[float, dict[str, Any]] | None:
        c = self.c
        reps = [e.start for e in self.repeats.get(key, ()) if not e.node]
        w0 = now - c.window
        h0 = now - c.history
        x = sum(1 for t in reps if w0 <= t <= now)
        if x < c.min_repeats:
            return None
        earlier = [t for t in reps if h0 <= t < w0]
        values: dict[str, Any] = {"xid": key[1], "repeats": x}
        if not earlier:
            if not c.new_counts:
                return None
            values["p_value"] = "new"
            return float(x), values
        baseline = w0 - max(earlier[0], h0)
        if baseline < c.min_baseline:
            return None
        y = len(earlier)
        p = rate_ratio_p_value(x, c.window, y, baseline, c.factor)
        if p >= c.alpha:
            return None
        values["p_value"] = f"{p:.1e}"
        values["baseline_rate"] = round(y / (baseline / 86400.0), 2)
        values["recent_rate"] = round(x / (c.window / 86400.0), 2)
        return float(x), values


class XidRecurrenceKind(ConditionKind):
    key = "xid_recurrence"
    keys = (
        "codes",
        "signal",
        "window",
        "history",
        "factor",
        "alpha",
        "min_repeats",
        "min_baseline",
        "new_counts",
        "episode_gap",
        "independent_gap",
        "node_gpus",
        "node_window",
    )
    placeholders = frozenset(
        {
            "xid",
            "xid_text",
            "action",
            "repeats",
            "p_value",
            "baseline_rate",
            "recent_rate",
            "gpus",
            "window",
        }
    )
    not_with: ClassVar[dict[str, str]] = {
        "when": "not available for xid_recurrence rules (XIDs come from lost GPUs too)",
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        if not p.need(body, keys, ("codes",), what):
            return None
        r = p.r
        known = catalog_codes()
        codes: set[int] = set()
        for item in r.sequence(keys["codes"], f"{what}.codes") or []:
            code = r.integer(item, f"{what}.codes", minimum=0, maximum=999_999)
            if code is None:
                continue
            if code not in known:
                p.error(item, f"{what}.codes: XID {code} is not in NVIDIA's XID catalog")
                continue
            codes.add(code)
        values: dict[str, Any] = {}
        if "signal" in keys:
            values["signal"] = r.string(keys["signal"], f"{what}.signal", SIGNALS)
        for name in ("window", "history", "min_baseline", "episode_gap", "independent_gap"):
            if name in keys:
                values[name] = p.window(keys[name], f"{what}.{name}")
        if "node_window" in keys:
            values["node_window"] = p.window(keys["node_window"], f"{what}.node_window")
        if "factor" in keys:
            values["factor"] = r.number(keys["factor"], f"{what}.factor", minimum=1.0)
        if "alpha" in keys:
            values["alpha"] = r.number(keys["alpha"], f"{what}.alpha", minimum=1e-12)
            if values["alpha"] is not None and values["alpha"] >= 0.5:
                p.error(keys["alpha"], f"{what}.alpha: a small chance, below 0.5 (e.g. 1e-3)")
                values["alpha"] = None
        if "min_repeats" in keys:
            values["min_repeats"] = r.integer(keys["min_repeats"], f"{what}.min_repeats", 1, 1000)
        if "node_gpus" in keys:
            values["node_gpus"] = r.integer(keys["node_gpus"], f"{what}.node_gpus", 2, 64)
        if "new_counts" in keys:
            values["new_counts"] = p.boolean(keys, "new_counts", what, False)
        if not codes or any(v is None for v in values.values()):
            if not codes and not p.r.problems:
                p.error(keys["codes"], f"{what}.codes: name at least one XID")
            return None
        c = XidRecurrence(frozenset(codes), **values)
        if c.window >= c.history or c.history > MAX_WINDOW:
            p.error(body, f"{what}: window must be shorter than history (at most 30d)")
            return None
        return c

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "codes": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "minItems": 1,
                },
                "signal": {"enum": list(SIGNALS), "default": "recurrence"},
                "window": sp.duration("2d"),
                "history": sp.duration("21d"),
                "factor": {"type": "number", "minimum": 1, "default": 1},
                "alpha": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "exclusiveMaximum": 0.5,
                    "default": 0.001,
                },
                "min_repeats": {"type": "integer", "minimum": 1, "default": 3},
                "min_baseline": sp.duration("1d"),
                "new_counts": {"type": "boolean", "default": False},
                "episode_gap": sp.duration("3m"),
                "independent_gap": sp.duration("1h"),
                "node_gpus": {"type": "integer", "minimum": 2, "maximum": 64, "default": 3},
                "node_window": sp.duration("1m"),
            },
            "XID episodes that recur on one GPU ever faster (independent repeats, exact "
            "conditional binomial test), or the same XID on several GPUs at once (a node "
            "event).",
            required=("codes",),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule, snap)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, XidRecurrence)
        return Needs(xid_window=c.node_window + c.episode_gap)

    def trigger(self, c: Condition) -> Trigger:
        return "periodic"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, XidRecurrence)
        return {"window": format_duration(c.window)}


KIND = XidRecurrenceKind()
