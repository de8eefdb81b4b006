"""What the condition kinds see of the node when the engine evaluates its rules.

The engine keeps one ``Snapshot`` and refreshes it at each evaluation: the GPUs in the
node view (with the engine's data for each: latest sample, counter histories), which
counter histories moved since the last evaluation, whether link samples or GPU statuses
changed, the recent trusted XIDs, and the drain outcomes that hold. Condition evaluators
read it; they never reach into the engine.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpuwatchd.core.nodestate import GpuState, NodeView
from gpuwatchd.core.records import (
    DrainOutcome,
    GpuInfo,
    GpuStatus,
    LinkSample,
    ProcessInfo,
    XidEvent,
)
from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.model import Guard, Rule, Selector
from gpuwatchd.xid import catalog as xid_catalog

XID_RETENTION_MIN = 3600.0
PROCESSES = "@processes"  # in ``Snapshot.changed``: a GPU's compute-process list changed

OP_FUNCS: Mapping[str, Callable[[float, float], bool]] = MappingProxyType(
    {
        ">": operator.gt,
        ">=": operator.ge,
        "<": operator.lt,
        "<=": operator.le,
        "==": operator.eq,
        "!=": operator.ne,
    }
)


class GpuData:
    """What the engine keeps of one GPU (by UUID, so it survives index changes): counter
    histories, and what it last observed of the GPU's samples to tell what changed (the
    latest sample itself is the node view's)."""

    __slots__ = ("fields", "hist", "index", "link_hist", "links", "processes", "uuid")

    def __init__(self, uuid: str, index: int) -> None:
        self.uuid = uuid
        self.index = index
        self.fields: Mapping[str, float] | None = None  # of the last sample observed
        self.processes: tuple[ProcessInfo, ...] = ()
        self.hist: dict[str, CounterHistory] = {}
        self.link_hist: dict[str, dict[int, CounterHistory]] = {}
        self.links: tuple[LinkSample, ...] | None = None


class GpuView:
    """One GPU as seen by one evaluation: ``latest`` is its last good sample (from the
    node view), ``sample`` the same only while its status is ok."""

    __slots__ = ("data", "index", "info", "latest", "sample", "status")

    def __init__(self, gs: GpuState, data: GpuData) -> None:
        self.index = gs.info.index
        self.info = gs.info
        self.status = gs.status
        self.data = data
        self.latest = gs.sample
        self.sample = gs.sample if gs.status is GpuStatus.OK else None


@dataclass(frozen=True, slots=True)
class SeqXid:
    seq: int
    event: XidEvent


class XidLog:
    """Trusted XIDs, numbered in arrival order, kept for the longest window a rule reads."""

    __slots__ = ("events", "retention", "seq")

    def __init__(self) -> None:
        self.events: deque[SeqXid] = deque()
        self.seq = 0
        self.retention = XID_RETENTION_MIN

    def add(self, event: XidEvent) -> None:
        self.seq += 1
        self.events.append(SeqXid(self.seq, event))

    def enrich(self, event: XidEvent) -> None:
        """The partner report of an XID already counted: its details replace the first
        report's in place (same incident, no new count)."""
        events = self.events
        pci = (event.pci_bus_id or "").upper()
        for i in range(len(events) - 1, -1, -1):
            held = events[i].event
            if held.xid == event.xid and (held.pci_bus_id or "").upper() == pci:
                events[i] = SeqXid(events[i].seq, event)
                return

    def newest_first(self, after: int) -> Iterator[XidEvent]:
        """The events numbered above ``after``, newest first."""
        for x in reversed(self.events):
            if x.seq <= after:
                return
            yield x.event

    def trim(self, now: float) -> None:
        horizon = now - self.retention - 60.0
        events = self.events
        while events and events[0].event.timestamp < horizon:
            events.popleft()


class DrainOutcomes:
    """The drain outcomes that hold now, by (kind, key): an outcome's end removes it.
    ``seq`` counts the changes, so a rule on them runs only when one came or went."""

    __slots__ = ("held", "seq")

    def __init__(self) -> None:
        self.held: dict[tuple[str, str], DrainOutcome] = {}
        self.seq = 0

    def observe(self, outcome: DrainOutcome) -> None:
        ident = (outcome.kind.value, outcome.key)
        if outcome.holds:
            self.held[ident] = outcome
        elif self.held.pop(ident, None) is None:
            return
        self.seq += 1

    def holding(self, kinds: frozenset[str]) -> list[DrainOutcome]:
        """The outcomes of these kinds that hold now, oldest first."""
        return [o for (kind, _), o in self.held.items() if kind in kinds]


def selected(sel: Selector, info: GpuInfo) -> bool:
    if sel.models and info.name not in sel.models:
        return False
    return not sel.gpus or info.uuid.upper() in sel.gpus or info.pci_bus_id.upper() in sel.gpus


class Snapshot:
    """The node as the rules see it at one evaluation (see the module docstring)."""

    __slots__ = (
        "_guards",
        "_statuses",
        "by_index",
        "by_pci",
        "by_uuid",
        "catalog",
        "changed",
        "drains",
        "gpus",
        "links_moved",
        "meta",
        "status_moved",
        "sxids",
        "touched",
        "view",
        "xids",
    )

    def __init__(
        self,
        catalog: xid_catalog.Catalog,
        touched: set[CounterHistory],
        meta: dict[CounterHistory, tuple[str, str, int]],
        changed: set[str] | None = None,
    ) -> None:
        self.catalog = catalog
        # sample fields that changed on some GPU since the last evaluation
        self.changed: set[str] = changed if changed is not None else set()
        self.gpus: list[GpuView] = []
        self.by_index: dict[int, GpuView] = {}
        self.by_uuid: dict[str, int] = {}
        self.by_pci: dict[str, int] = {}
        self.view: NodeView | None = None
        self.touched = touched  # counter histories that moved since the last evaluation
        self.meta = meta  # history -> (uuid, field, link or -1)
        self.xids = XidLog()
        self.sxids = XidLog()  # NVSwitch SXids: their own numbering, never an XID rule's
        self.drains = DrainOutcomes()  # what the drain stage reported and still holds
        self.links_moved = True  # a GPU's link samples changed since the last evaluation
        self.status_moved = True  # a GPU's status changed since the last evaluation
        self._guards: dict[Guard, tuple[set[int], set[int]]] = {}
        self._statuses: tuple[GpuStatus, ...] = ()

    @property
    def node(self) -> str:
        return self.view.node_name if self.view is not None else ""

    def sync(self, view: NodeView, data_of: Callable[[GpuInfo], GpuData]) -> None:
        """Take the GPUs (and their statuses) of a new node view."""
        self.view = view
        self._guards.clear()
        cur = self.gpus
        gpus = view.gpus
        statuses = tuple(gs.status for gs in gpus)
        if len(cur) != len(gpus) or any(
            g.info is not gs.info for g, gs in zip(cur, gpus, strict=True)
        ):
            cur = [GpuView(gs, data_of(gs.info)) for gs in gpus]
            self.gpus = cur
            self.by_index = {g.index: g for g in cur}
            self.by_uuid = {g.info.uuid: g.index for g in cur}
            self.by_pci = {g.info.pci_bus_id.upper(): g.index for g in cur}
            self._statuses = statuses
            self.status_moved = True
            return
        ok = GpuStatus.OK
        for g, gs in zip(cur, gpus, strict=True):
            status = gs.status
            g.status = status
            g.latest = gs.sample
            g.sample = gs.sample if status is ok else None
        if statuses != self._statuses:
            self._statuses = statuses
            self.status_moved = True

    def settled(self, now: float) -> None:
        """The evaluation is over: what moved has been seen."""
        self.touched.clear()
        self.changed.clear()
        self.links_moved = False
        self.status_moved = False
        self.xids.trim(now)
        self.sxids.trim(now)

    # -- for the conditions ---------------------------------------------------------------
    def selected(self, rule: Rule) -> list[GpuView]:
        """The GPUs ``select`` names (all without one)."""
        if rule.select is None:
            return self.gpus
        sel = rule.select
        return [g for g in self.gpus if selected(sel, g.info)]

    def targets(self, rule: Rule) -> tuple[list[GpuView], set[int]]:
        """The GPUs a rule looks at now (``select``, then ``when``) and those whose ``when``
        cannot be evaluated (no sample). Guards are computed once per evaluation."""
        gpus = self.selected(rule)
        guard = rule.when
        if guard is None:
            return gpus, set()
        found = self._guards.get(guard)
        if found is None:
            passed: set[int] = set()
            unknown: set[int] = set()
            op = OP_FUNCS[guard.op]
            for g in self.gpus:
                s = g.sample
                v = s.fields.get(guard.field) if s is not None else None
                if v is None:
                    unknown.add(g.index)
                elif op(v, guard.value):
                    passed.add(g.index)
            found = self._guards[guard] = (passed, unknown)
        passed, unknown = found
        return [g for g in gpus if g.index in passed], {g.index for g in gpus} & unknown

    @staticmethod
    def series(g: GpuView, name: str, link: bool) -> list[tuple[int, CounterHistory]]:
        """A field's counter histories on a GPU: ``(link or -1, history)``."""
        if link:
            table = g.data.link_hist.get(name)
            return sorted(table.items()) if table else []
        h = g.data.hist.get(name)
        return [(-1, h)] if h is not None else []

    def field_moved(self, name: str) -> bool:
        """True when a history of ``name`` moved since the last evaluation."""
        meta = self.meta
        return any(meta[h][1] == name for h in self.touched)

    def gpu_of(self, ev: XidEvent) -> int:
        """The index of the GPU an XID names, or -1."""
        return self.gpu_of_ids(ev.gpu, ev.pci_bus_id, ev.uuid)

    def gpu_of_ids(self, gpu: int | None, pci_bus_id: str | None, uuid: str | None) -> int:
        """The index of the GPU named by index, PCI bus id or UUID (in that order), or -1."""
        if gpu is not None and gpu in self.by_index:
            return gpu
        if pci_bus_id:
            found = self.by_pci.get(pci_bus_id.upper())
            if found is not None:
                return found
        if uuid:
            found = self.by_uuid.get(uuid)
            if found is not None:
                return found
        return -1
