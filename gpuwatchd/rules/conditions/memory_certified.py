"""What the GPU itself certifies about its device memory: the evidence that pages.

``memory_trend``'s ``certified`` signal holds on a GPU when, within ``window`` (30 days by
default: how long a GPU stays *susceptible*), one of these is true:

- **a prior uncorrectable error, then more**: the GPU contained an uncorrectable error (XID
  94 or 95, a rise of the uncorrected device-memory counter, a new uncorrectable row remap,
  or XID 48) and its memory was active again at least an hour later (a corrected error, or
  another uncorrectable one): the field studies' strongest single predictor;
- **errors that continue after a row remap**: a correctable row remap that has been applied
  (no remap pending any more) and corrected errors at least an hour after it;
- **a second row remap**: correctable remaps in two different 10-minute buckets;
- **a bank running out of spare rows**: the row-remapper histogram's low or none count rose;
- **XID 92 on two days**: two XID 92 lines on this GPU at least a day apart within 7 days,
  neither part of a node-wide event (the same code on ``NODE_GPUS`` GPUs within a minute).

Statistical evidence (the acceleration test) is not here: it drains and opens a ticket.

The XIDs are taken from the node's XID log as they arrive and kept per GPU (a few floats
each), so a look costs a few bisects whatever the history. They are saved in the state
store (``rules.sqlite3``, as the XID recurrence rules' episodes: one row per XID, the GPU by
its UUID) and taken back after a restart, so an XID 92 before a restart and one after it
are two days of XID 92; the counters' activity comes back from the store's histories.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable

from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.evidence import BUCKET, EPISODE_GAP, bucket_of
from gpuwatchd.rules.snapshot import GpuView, Snapshot
from gpuwatchd.rules.store import EpisodeRecord

DAY = 86400.0
AFTER = EPISODE_GAP * BUCKET  # "again": at least an hour after the first sign
UE_XIDS = frozenset({48, 94, 95})
RATE_XID = 92
XID92_SPAN = 7 * DAY
XID92_APART = DAY
NODE_GPUS = 3  # the same XID on this many GPUs within NODE_SPAN is a node event
NODE_SPAN = 60.0
UE_FIELDS = ("ecc_uncorrected_volatile_dev", "remapped_rows_uncorrectable")
REMAP_FIELD = "remapped_rows_correctable"
PENDING_FIELD = "remapped_rows_pending"
BANK_FIELDS = ("row_remap_banks_low", "row_remap_banks_none")
# the counters it reads, and the pending flag (kept as a history too, so that a change of it
# is seen as movement: see ``Certificates.unchanged``)
FIELDS = frozenset({*UE_FIELDS, REMAP_FIELD, PENDING_FIELD, *BANK_FIELDS})
RECHECK = 300.0  # seconds a look is trusted while nothing it reads moved
SAVED_PER_GPU = 64  # XIDs of one kind saved per GPU (the newest): bounded whatever the log


def _first_active(hist_activity: list[int], b0: int, b1: int) -> int | None:
    i = bisect.bisect_left(hist_activity, b0)
    return hist_activity[i] if i < len(hist_activity) and hist_activity[i] < b1 else None


def _last_active(hist_activity: list[int], b0: int, b1: int) -> int | None:
    i = bisect.bisect_left(hist_activity, b1) - 1
    return hist_activity[i] if i >= 0 and hist_activity[i] >= b0 else None


class Certificates:
    """The XIDs the certified signal reads, per GPU, and when each GPU's row remap took
    effect; fed incrementally from the node's XID log."""

    __slots__ = ("applied", "dirty", "last_look", "node92", "seq", "ue", "uuids", "x92")

    def __init__(self) -> None:
        self.last_look: float | None = None
        self.seq = 0  # the last XID taken from the log
        self.ue: dict[int, list[float]] = {}  # GPU -> times of XID 48/94/95
        self.x92: dict[int, list[float]] = {}  # GPU -> times of XID 92
        self.node92: list[tuple[float, int]] = []  # (time, GPU) of every XID 92
        self.applied: dict[int, float] = {}  # GPU -> first look with its remap applied
        self.uuids: dict[int, str] = {}  # GPU -> its UUID, for saving
        self.dirty = False  # XIDs taken since the last save

    def unchanged(self, snap: Snapshot, fields: frozenset[str], now: float) -> bool:
        """True when nothing the signal reads moved (no counter of ``fields``, no new XID)
        since a look less than ``RECHECK`` ago; otherwise this is a look: note it."""
        last = self.last_look
        if (
            last is not None
            and now - last < RECHECK
            and snap.xids.seq == self.seq
            and not any(snap.field_moved(f) for f in fields)
        ):
            return True
        self.last_look = now
        return False

    def take(self, snap: Snapshot, now: float, keep: float) -> None:
        """Take the XIDs that arrived since the last look; forget those older than ``keep``."""
        log = snap.xids
        if log.seq != self.seq:
            new = list(log.newest_first(self.seq))
            self.seq = log.seq
            for ev in reversed(new):
                if ev.kind != "xid" or ev.enriches:
                    continue
                g = snap.gpu_of(ev)
                if g < 0 or (ev.xid not in UE_XIDS and ev.xid != RATE_XID):
                    continue
                self.dirty = True
                if g not in self.uuids:
                    self.uuids.update((v.index, v.info.uuid) for v in snap.gpus if v.info.uuid)
                if ev.xid in UE_XIDS:
                    bisect.insort(self.ue.setdefault(g, []), ev.timestamp)
                elif ev.xid == RATE_XID:
                    bisect.insort(self.x92.setdefault(g, []), ev.timestamp)
                    bisect.insort(self.node92, (ev.timestamp, g))
        horizon = now - keep
        for times in (*self.ue.values(), *self.x92.values()):
            if times and times[0] < horizon:
                del times[: bisect.bisect_left(times, horizon)]
        if self.node92 and self.node92[0][0] < now - XID92_SPAN - NODE_SPAN:
            del self.node92[: bisect.bisect_left(self.node92, (now - XID92_SPAN - NODE_SPAN,))]

    def node_wide(self, t: float) -> bool:
        """Whether the XID 92 at ``t`` came with XID 92 on ``NODE_GPUS`` GPUs within a minute."""
        lo = bisect.bisect_left(self.node92, (t - NODE_SPAN,))
        hi = bisect.bisect_right(self.node92, (t + NODE_SPAN, 1 << 30))
        return len({g for _, g in self.node92[lo:hi]}) >= NODE_GPUS

    def adopt(self, old: Certificates) -> None:
        self.seq, self.ue, self.x92 = old.seq, old.ue, old.x92  # a reload looks again at once
        self.node92, self.applied = old.node92, old.applied
        self.uuids, self.dirty = old.uuids, old.dirty

    def records(self) -> list[EpisodeRecord]:
        """The XIDs to save: one record per XID (start = end = its time), the newest
        ``SAVED_PER_GPU`` of each kind per GPU."""
        out: list[EpisodeRecord] = []
        for table, code in ((self.ue, 94), (self.x92, RATE_XID)):
            for g, times in table.items():
                uuid = self.uuids.get(g) or f"index:{g}"
                out.extend(EpisodeRecord(uuid, code, t, t, (), 0) for t in times[-SAVED_PER_GPU:])
        return out

    def load(self, records: Iterable[EpisodeRecord], snap: Snapshot, now: float) -> int:
        """Take back saved XIDs of the GPUs in ``snap`` (by UUID); how many made no sense
        (an unknown code, a time that is not finite or lies ahead of ``now``)."""
        bad = 0
        for r in records:
            if r.xid not in (94, RATE_XID) or not math.isfinite(r.start) or r.start > now:
                bad += 1
                continue
            if r.uuid.startswith("index:"):
                g = int(r.uuid.removeprefix("index:")) if r.uuid[6:].isdigit() else -1
            else:
                g = snap.by_uuid.get(r.uuid, -1)
            if g < 0:
                continue  # a GPU no longer in the node
            if r.xid == RATE_XID:
                bisect.insort(self.x92.setdefault(g, []), r.start)
                bisect.insort(self.node92, (r.start, g))
            else:
                bisect.insort(self.ue.setdefault(g, []), r.start)
        self.uuids.update((v.index, v.info.uuid) for v in snap.gpus if v.info.uuid)
        return bad


def certified(certs: Certificates, g: GpuView, field: str, window: float, now: float) -> str | None:
    """Why GPU ``g``'s memory is certified failing at ``now``, or None."""
    hist = g.data.hist
    b1 = bucket_of(now) + 1
    b0 = bucket_of(now - window)
    corrected = hist.get(field)
    active = corrected.activity.buckets if corrected is not None else []

    # A contained uncorrectable error, then memory activity again an hour or more later.
    marks: list[float] = [t for t in certs.ue.get(g.index, ()) if t >= now - window]
    for name in UE_FIELDS:
        h = hist.get(name)
        if h is not None:
            first = _first_active(h.activity.buckets, b0, b1)
            last = _last_active(h.activity.buckets, b0, b1)
            marks.extend(b * BUCKET for b in (first, last) if b is not None)
    if marks:
        ue = min(marks)
        again = bucket_of(ue + AFTER)
        if max(marks) >= ue + AFTER or _last_active(active, again, b1) is not None:
            return (
                f"an uncorrectable error {format_duration(now - ue)} ago, and memory errors since"
            )

    # Correctable row remaps: a second one; corrected errors after one took effect.
    remaps = hist.get(REMAP_FIELD)
    if remaps is not None:
        first = _first_active(remaps.activity.buckets, b0, b1)
        if first is not None:
            if remaps.activity.count(first + 1, b1) > 0:
                return "a second correctable row remap"
            # A pending remap waits for a GPU reset, and until then the weak row keeps
            # logging: only errors an hour after the first look that found it applied count.
            sample = g.latest
            pending = sample.fields.get(PENDING_FIELD, 0.0) if sample is not None else 0.0
            applied = certs.applied.get(g.index)
            if applied is None or applied < first * BUCKET:
                applied = None
                if pending <= 0:
                    certs.applied[g.index] = applied = now
            after = bucket_of(applied + AFTER) if applied is not None else b1
            if _last_active(active, after, b1) is not None:
                return "corrected errors continuing after a row remap"

    # The row-remapper histogram: a bank down to low or no spare rows.
    for name in BANK_FIELDS:
        h = hist.get(name)
        if h is not None and h.increase(now - window, now) > 0:
            level = name.rsplit("_", 1)[1]
            return f"an HBM bank down to {level} spare rows"

    # XID 92 on two days within a week, not as part of a node-wide event.
    times = [t for t in certs.x92.get(g.index, ()) if t >= now - XID92_SPAN]
    if len(times) >= 2 and times[-1] - times[0] >= XID92_APART:
        own = [t for t in times if not certs.node_wide(t)]
        if own and own[-1] - own[0] >= XID92_APART:
            return "XID 92 on two days within a week"
    return None
