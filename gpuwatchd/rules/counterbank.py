"""The counters the rules read, per GPU and per NVLink link, and their durable copy.

The engine tells the bank which fields the loaded rules need (``watch``); each sample then
extends those fields' ``CounterHistory`` (resets handled there). Histories come back from
the ``StateStore`` the first time a series is seen after a restart, and new points are
written back, one per 5-minute bucket, by ``flush``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpuwatchd.core.records import GpuInfo, GpuSample
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.snapshot import PROCESSES, GpuData
from gpuwatchd.rules.store import PERSIST_RESOLUTION, CounterRecord, StateStore


def _changed_fields(old: Mapping[str, float], new: Mapping[str, float], out: set[str]) -> None:
    """Add to ``out`` the fields whose value differs between two samples of a GPU."""
    if old == new:
        return
    get = old.get
    for k, v in new.items():
        if get(k) != v:
            out.add(k)
    gone = old.keys() - new.keys()
    if gone:
        out.update(gone)


# Counters whose fresh history is seeded from a lifetime (aggregate) counter: after a fresh
# install a GPU with a long corrected-error history is not judged as new (CounterHistory.seed).
# The aggregate counts every corrected error the GPU ever logged (device memory and SRAM:
# an upper bound of the device memory's own).
SEEDED_FROM = {"ecc_corrected_volatile_dev": "ecc_corrected_aggregate"}


def series_key(uuid: str, field_name: str, link: int = -1) -> str:
    return f"{uuid}|{field_name}" if link < 0 else f"{uuid}|{link}|{field_name}"


class CounterBank:
    """Per-GPU data (latest sample, counter histories) and its persistence."""

    __slots__ = (
        "_persisted",
        "_restore",
        "_store",
        "_unflushed",
        "changed",
        "gpu_fields",
        "gpus",
        "link_fields",
        "links_moved",
        "meta",
        "touched",
        "watch_links",
    )

    def __init__(self, store: StateStore) -> None:
        self._store = store
        self._restore: dict[str, CounterRecord] = store.load_counters()
        self.gpus: dict[str, GpuData] = {}
        self.gpu_fields: tuple[str, ...] = ()
        self.link_fields: tuple[str, ...] = ()
        self.watch_links = False
        self.links_moved = False  # a GPU's link samples changed (the engine resets it)
        self.meta: dict[CounterHistory, tuple[str, str, int]] = {}  # uuid, field, link
        self.touched: set[CounterHistory] = set()  # changed since the last evaluation
        # sample fields whose value changed (or came or went) on any GPU since the last
        # evaluation; PROCESSES stands for the compute-process list (the engine clears it)
        self.changed: set[str] = set()
        self._unflushed: set[CounterHistory] = set()  # changed since the last flush
        self._persisted: dict[CounterHistory, tuple[str, int, float]] = {}

    def watch(self, gpu_fields: set[str], link_fields: set[str], links: bool) -> None:
        """Record these counters from now on (and link samples when ``links``)."""
        self.gpu_fields = tuple(sorted(gpu_fields))
        self.link_fields = tuple(sorted(link_fields))
        self.watch_links = links or bool(link_fields)

    def data_of(self, info: GpuInfo) -> GpuData:
        data = self.gpus.get(info.uuid)
        if data is None:
            data = self.gpus[info.uuid] = GpuData(info.uuid, info.index)
        return data

    def observe(self, s: GpuSample) -> None:
        g = self.gpus.get(s.uuid)
        if g is None:
            g = self.gpus[s.uuid] = GpuData(s.uuid, s.gpu)
        g.index = s.gpu
        if g.fields is None:
            self.changed.update(s.fields)
        elif g.fields is not s.fields:
            _changed_fields(g.fields, s.fields, self.changed)
        if g.processes is not s.processes and g.processes != s.processes:
            self.changed.add(PROCESSES)
        g.fields = s.fields
        g.processes = s.processes
        t = s.timestamp
        if self.gpu_fields:
            fields = s.fields
            hist = g.hist
            for name in self.gpu_fields:
                v = fields.get(name)
                if v is not None:
                    h = hist.get(name)
                    if h is None:
                        h = self._history(g, name)
                        if len(h) == 0 and name in SEEDED_FROM:
                            prior = fields.get(SEEDED_FROM[name])
                            if prior is not None and h.seed(t, v, prior):
                                self._unflushed.add(h)
                    if h.add(t, v):
                        self.touched.add(h)
                        self._unflushed.add(h)
        if self.watch_links:
            links = s.links
            if links is g.links or links == g.links:
                return  # unchanged: no counter moved (and cached link results hold)
            g.links = links
            self.links_moved = True
            for name in self.link_fields:
                table = g.link_hist.get(name)
                for ls in links:
                    v = ls.fields.get(name)
                    if v is None:
                        continue
                    h = table.get(ls.link) if table is not None else None
                    if h is None:
                        h = self._history(g, name, ls.link)
                        table = g.link_hist[name]
                    if h.add(t, v):
                        self.touched.add(h)
                        self._unflushed.add(h)

    def _history(self, g: GpuData, name: str, link: int = -1) -> CounterHistory:
        h = CounterHistory()
        key = series_key(g.uuid, name, link)
        rec = self._restore.pop(key, None)
        persisted_t = -math.inf
        if rec is not None:
            points = list(rec.points)
            if rec.last_raw is not None and rec.last_t is not None:
                current = rec.last_raw + rec.offset
                if not points or (points[-1][1] != current and rec.last_t > points[-1][0]):
                    points.append((rec.last_t, current))
            h.restore(points, rec.last_raw, rec.offset, rec.last_t)
            if points:
                persisted_t = points[-1][0]
        self._persisted[h] = (key, h.version, persisted_t)
        self.meta[h] = (g.uuid, name, link)
        self.touched.add(h)
        if link < 0:
            g.hist[name] = h
        else:
            g.link_hist.setdefault(name, {})[link] = h
        return h

    def flush(self, now: float) -> None:
        """Write new counter points (one per 5-minute bucket) and reset bookkeeping."""
        batch: dict[str, CounterRecord] = {}
        cutoff = math.floor(now / PERSIST_RESOLUTION) * PERSIST_RESOLUTION
        changed, self._unflushed = self._unflushed, set()
        persisted = {}
        for h in changed:
            key, version, persisted_t = self._persisted[h]
            if h.version == version:
                continue
            points: list[tuple[float, float]] = []
            for t, v in h.points_between(persisted_t, cutoff - 1e-9):
                bucket = math.floor(t / PERSIST_RESOLUTION)
                if points and math.floor(points[-1][0] / PERSIST_RESOLUTION) == bucket:
                    points[-1] = (t, v)
                else:
                    points.append((t, v))
            batch[key] = CounterRecord(h.last_raw, h.offset, h.last_t, points)
            last_t = points[-1][0] if points else persisted_t
            persisted[h] = (key, h.version, last_t)
        if batch and not self._store.save_counters(batch, now):
            self._unflushed |= changed  # the disk failed: write these with the next flush
            return
        self._persisted.update(persisted)
