"""Node-wide memory activity: errors on several GPUs of a node within minutes.

A driver reload, a power event or one job that touches every GPU's memory makes the
corrected-error counters of many GPUs move together; that is one node event, not that many
failing GPUs. On one counter's activity (``rules/evidence.py``: 10-minute buckets in which
it grew), a GPU's active bucket ``b`` is *node-wide* when at least ``gpus`` GPUs of the
node (this one included) have an active bucket within one bucket of it (``b - 1 .. b + 1``:
errors within minutes of each other, whatever side of a bucket's edge they fell on).

The per-GPU ticket rules leave out a GPU whose activity in their window is all node-wide
(``increase``'s ``skip_node_wide``), and ``memory_trend``'s ``signal: node`` raises the
episode as one node alert. Each GPU's counter, history and certified evidence stay as they
are: only the tickets are grouped.

``with_memory_xids`` adds the memory XIDs (63, 64, 92, 94, 95) to a GPU's buckets, so that
the node alert sees a node-wide episode of XIDs as one of errors (``xid``'s own
``skip_node_wide`` leaves those out of the per-GPU XID ticket).

Pure functions over bucket lists; a look costs nothing when fewer than ``gpus`` GPUs were
active in the window, else O(k * g * log n) for k active buckets of g GPUs.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from gpuwatchd.rules.evidence import BUCKET, bucket_of
from gpuwatchd.rules.snapshot import Snapshot

NODE_GPUS = 3  # GPUs active within minutes of each other that make a node event
SPAN = 1  # buckets either side of a bucket that count as "within minutes"
Buckets = Sequence[int]  # one GPU's active 10-minute buckets, oldest first


def _active_near(buckets: Buckets, b: int) -> bool:
    i = bisect.bisect_left(buckets, b - SPAN)
    return i < len(buckets) and buckets[i] <= b + SPAN


def _active_in(buckets: Buckets, b0: int, b1: int) -> bool:
    i = bisect.bisect_left(buckets, b0)
    return i < len(buckets) and buckets[i] < b1


def is_node_wide(acts: Mapping[int, Buckets], b: int, gpus: int = NODE_GPUS) -> bool:
    """Whether at least ``gpus`` of ``acts`` (GPU -> activity) were active near bucket ``b``."""
    n = 0
    for act in acts.values():
        if _active_near(act, b):
            n += 1
            if n >= gpus:
                return True
    return False


def _busy(acts: Mapping[int, Buckets], b0: int, b1: int, gpus: int) -> bool:
    """At least ``gpus`` GPUs active in buckets ``b0 .. b1`` (with the span): else no
    bucket of the window can be node-wide."""
    return sum(_active_in(a, b0 - SPAN, b1 + SPAN) for a in acts.values()) >= gpus


def has_own_activity(
    acts: Mapping[int, Buckets], gpu: int, b0: int, b1: int, gpus: int = NODE_GPUS
) -> bool:
    """Whether GPU ``gpu`` has an active bucket in ``[b0, b1)`` that is not node-wide."""
    buckets = acts.get(gpu)
    if buckets is None or not _active_in(buckets, b0, b1):
        return False
    if not _busy(acts, b0, b1, gpus):
        return True
    lo = bisect.bisect_left(buckets, b0)
    for i in range(bisect.bisect_left(buckets, b1) - 1, lo - 1, -1):  # newest first
        if not is_node_wide(acts, buckets[i], gpus):
            return True
    return False


def node_wide_gpus(
    acts: Mapping[int, Buckets], b0: int, b1: int, gpus: int = NODE_GPUS
) -> list[int]:
    """The GPUs with a node-wide active bucket in ``[b0, b1)``, in index order."""
    if not _busy(acts, b0, b1, gpus):
        return []
    out: list[int] = []
    for gpu in sorted(acts):
        buckets = acts[gpu]
        lo = bisect.bisect_left(buckets, b0)
        hi = bisect.bisect_left(buckets, b1)
        if any(is_node_wide(acts, buckets[i], gpus) for i in range(hi - 1, lo - 1, -1)):
            out.append(gpu)
    return out


def field_activities(snap: Snapshot, field: str) -> dict[int, Buckets]:
    """Every GPU's activity of ``field`` (GPUs without the counter are left out): the node
    is judged as a whole, whatever GPUs a rule selects."""
    out: dict[int, Buckets] = {}
    for g in snap.gpus:
        h = g.data.hist.get(field)
        if h is not None and h.activity.buckets:
            out[g.index] = h.activity.buckets
    return out


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
