"""Node-wide memory activity: error episodes that start on several GPUs within minutes.

A driver reload, a power event or one job that touches every GPU's memory makes the
corrected-error counters of many GPUs move together; that is one node event, not that many
failing GPUs. On one counter's activity (``rules/evidence.py``: 10-minute buckets in which
it grew), an *episode* here is a run of active buckets after at least ``QUIET`` (6 hours)
of silence, and it is *node-wide* when at least ``gpus`` GPUs of the node (this one
included) start one within one bucket of its start (``s - 1 .. s + 1``: within minutes,
whatever side of a bucket's edge they fell on). Starts after quiet, not any activity: GPUs
that each log a trickle are busy in the same buckets by chance, and start short episodes
together by chance too (the backtest's ``trickle`` family: 21 node tickets on 3 nodes a
month with the one-hour episodes of ``rules/evidence.py``), but seldom after hours of quiet.

The per-GPU ticket rules leave out a GPU whose episodes in their window (runs less than
an hour apart, as in ``rules/evidence.py``) all started node-wide (``increase``'s
``skip_node_wide``): errors an hour or more after the event are the GPU's own again, and an
episode that started before the window counts as the GPU's own (it went on for longer
than the window). ``memory_trend``'s
``signal: node`` raises the node-wide episodes as one node alert. Each GPU's counter,
history and certified evidence stay as they are: only the tickets are grouped.
``with_memory_xids`` adds the memory XIDs (63, 64, 92, 94, 95) to a GPU's buckets, so that
the node alert sees a node-wide episode of XIDs as one of errors, and ``xid_event_gpus``
names the GPUs of a memory XID on 3 or more GPUs within a minute whether or not they were
quiet before (``xid``'s ``skip_node_wide`` leaves exactly those out of the per-GPU XID
ticket, so the node alert must stand for them).

Pure functions over bucket lists; a look costs nothing when fewer than ``gpus`` GPUs were
active in the window, else O(k * g * log n) for k active buckets of g GPUs.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from gpuwatchd.rules.conditions.xid import node_event
from gpuwatchd.rules.evidence import BUCKET, EPISODE_GAP, bucket_of
from gpuwatchd.rules.snapshot import Snapshot

NODE_GPUS = 3  # GPUs whose episodes start within minutes of each other: a node event
SPAN = 1  # buckets either side of a bucket that count as "within minutes"
QUIET = 36  # buckets of silence (6 hours) before an episode that can start node-wide
Buckets = Sequence[int]  # one GPU's active 10-minute buckets, oldest first


def _starts_near(buckets: Buckets, b: int) -> bool:
    """Whether an episode of ``buckets`` starts within ``SPAN`` of bucket ``b``."""
    i = bisect.bisect_left(buckets, b - SPAN)
    while i < len(buckets) and buckets[i] <= b + SPAN:
        if i == 0 or buckets[i] - buckets[i - 1] > QUIET:
            return True
        i += 1
    return False


def _active_in(buckets: Buckets, b0: int, b1: int) -> bool:
    i = bisect.bisect_left(buckets, b0)
    return i < len(buckets) and buckets[i] < b1


def is_node_wide(acts: Mapping[int, Buckets], start: int, gpus: int = NODE_GPUS) -> bool:
    """Whether at least ``gpus`` of ``acts`` (GPU -> buckets) start an episode near the
    bucket ``start``."""
    n = 0
    for buckets in acts.values():
        if _starts_near(buckets, start):
            n += 1
            if n >= gpus:
                return True
    return False


def _busy(acts: Mapping[int, Buckets], b0: int, b1: int, gpus: int) -> bool:
    """At least ``gpus`` GPUs active in buckets ``b0 .. b1`` (with the span): else no
    episode of the window can be node-wide."""
    return sum(_active_in(a, b0 - SPAN, b1 + SPAN) for a in acts.values()) >= gpus


def _window_starts(buckets: Buckets, b0: int, b1: int, gap: int) -> tuple[list[int], bool]:
    """The starts (after more than ``gap`` silent buckets) in ``[b0, b1)``, newest first,
    and whether the window's first active bucket continues a run that started before."""
    lo = bisect.bisect_left(buckets, b0)
    hi = bisect.bisect_left(buckets, b1)
    starts = [
        buckets[i] for i in range(hi - 1, lo - 1, -1) if i == 0 or buckets[i] - buckets[i - 1] > gap
    ]
    earlier = lo < hi and lo > 0 and buckets[lo] - buckets[lo - 1] <= gap
    return starts, earlier


def _quiet_start(buckets: Buckets, b: int) -> bool:
    i = bisect.bisect_left(buckets, b)
    return i == 0 or buckets[i] - buckets[i - 1] > QUIET


def has_own_activity(
    acts: Mapping[int, Buckets], gpu: int, b0: int, b1: int, gpus: int = NODE_GPUS
) -> bool:
    """Whether GPU ``gpu`` has activity in ``[b0, b1)`` that is its own: an episode there
    (``rules/evidence.py``'s, runs less than an hour apart) that did not start node-wide,
    or that started before ``b0``."""
    buckets = acts.get(gpu)
    if buckets is None or not _active_in(buckets, b0, b1):
        return False
    if not _busy(acts, b0, b1, gpus):
        return True
    starts, earlier = _window_starts(buckets, b0, b1, EPISODE_GAP)
    return earlier or any(
        not (_quiet_start(buckets, s) and is_node_wide(acts, s, gpus)) for s in starts
    )


def node_wide_gpus(
    acts: Mapping[int, Buckets], b0: int, b1: int, gpus: int = NODE_GPUS
) -> list[int]:
    """The GPUs with an episode that started node-wide in ``[b0, b1)``, in index order."""
    if not _busy(acts, b0, b1, gpus):
        return []
    return [
        gpu
        for gpu in sorted(acts)
        if any(is_node_wide(acts, s, gpus) for s in _window_starts(acts[gpu], b0, b1, QUIET)[0])
    ]


class NodeLook:
    """One rule's view of one field's node-wide activity: every GPU's active buckets
    (GPUs without the counter left out: the node is judged as a whole, whatever GPUs a rule
    selects), with the answers of ``has_own_activity`` and ``node_wide_gpus`` kept while
    they cannot change: both are pure functions of those buckets and the window's, and a
    node with errors asks them on every poll (a firing ticket is judged again at each one),
    while the buckets change once per 10-minute turn or new active bucket. ``look`` reads
    the node and starts over when any GPU's activity (its object or its ``version``) or the
    window moved."""

    __slots__ = ("_gpus", "_key", "_own", "acts", "b0", "b1")

    def __init__(self) -> None:
        self._key: tuple[object, ...] = ()
        self._own: dict[int, bool] = {}
        self._gpus: list[int] | None = None
        self.acts: dict[int, Buckets] = {}
        self.b0 = self.b1 = 0

    def look(self, snap: Snapshot, field: str, b0: int, b1: int) -> dict[int, Buckets]:
        acts: dict[int, Buckets] = {}
        key: list[object] = [b0, b1]
        for g in snap.gpus:
            h = g.data.hist.get(field)
            if h is not None and h.activity.buckets:
                act = h.activity
                acts[g.index] = act.buckets
                key += (g.index, act, act.version)
        frozen = tuple(key)
        if frozen != self._key:
            self._key = frozen
            self._own = {}
            self._gpus = None
        self.acts, self.b0, self.b1 = acts, b0, b1
        return acts

    def own(self, gpu: int) -> bool:
        """``has_own_activity`` for ``gpu`` over the window of the last ``look``."""
        got = self._own.get(gpu)
        if got is None:
            got = self._own[gpu] = has_own_activity(self.acts, gpu, self.b0, self.b1)
        return got

    def node_wide(self) -> list[int]:
        """``node_wide_gpus`` over the window of the last ``look``."""
        if self._gpus is None:
            self._gpus = node_wide_gpus(self.acts, self.b0, self.b1)
        return self._gpus


def xid_event_gpus(snap: Snapshot, b0: int) -> set[int]:
    """The GPUs with a memory XID from bucket ``b0`` on whose code came on 3 or more GPUs
    within a minute (``xid``'s node event, what its ``skip_node_wide`` leaves out), whether
    or not the GPUs were quiet before."""
    since = b0 * BUCKET
    return {
        snap.gpu_of(x.event)
        for x in snap.xids.events
        if x.event.xid in MEMORY_XIDS
        and x.event.kind != "sxid"
        and x.event.timestamp >= since
        and snap.gpu_of(x.event) >= 0
        and node_event(snap, x.event)
    }


MEMORY_XIDS = frozenset({63, 64, 92, 94, 95})  # row remap, ECC, remap failure, contained/not


def with_memory_xids(snap: Snapshot, acts: dict[int, Buckets], b0: int) -> dict[int, Buckets]:
    """``acts`` with each GPU's memory XIDs from bucket ``b0 - SPAN`` on as active buckets."""
    found: dict[int, set[int]] = {}
    since = (b0 - SPAN) * BUCKET
    for x in snap.xids.events:
        ev = x.event
        if ev.xid in MEMORY_XIDS and ev.kind != "sxid" and ev.timestamp >= since:
            gpu = snap.gpu_of(ev)
            if gpu >= 0:
                found.setdefault(gpu, set()).add(bucket_of(ev.timestamp))
    if not found:
        return acts
    out = dict(acts)
    for gpu, xids in found.items():
        own = out.get(gpu, ())
        lo = bisect.bisect_left(own, b0 - SPAN)
        out[gpu] = sorted(xids.union(own[lo:]))
    return out
