"""``sxid``: NVSwitch SXid reports, judged by what their line says (fatal or non-fatal).

The NVSwitch driver writes ``nvidia-nvswitchN: SXid (PCI:...): CODE, Fatal, Link N ...`` or
``..., Non-fatal, ...`` and follows the report with detail lines (``Data {...}``,
``Severity 0 Engine instance ...``) under the same code; detail lines never count. SXid
codes are the NVSwitch's own numbering (NVIDIA's Fabric Manager User Guide), not XIDs, and
only trusted kernel records reach this condition, like XIDs.

A line with neither word and not a detail line (``26006, SOE HALTED``) is ``unrated``:
``unrated: true`` selects those instead (the shipped rules open a ticket on them).

The alert is the node's (one series, no GPU: the drain is the node's either way): the
switch's PCI address is in ``{switch}``, and the GPUs wired to it (their NVLinks' far ends,
``GpuInfo.nvlink_peers``, read from NVML at open) in ``{gpus}`` and ``{behind}``
(`` (GPUs 0, 1, 2, 3 behind it)``, or nothing where NVML does not tell the topology).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.records import XidEvent
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
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot
from gpuwatchd.xid.catalog import sxid_verdict

VERDICTS = ("fatal", "nonfatal")
MAX_TEXT = 200  # characters of the SXid's own text on a page


@dataclass(frozen=True)
class SxidMatch(Condition):
    """SXid reports whose line says ``fatal`` (or ``nonfatal``), ``count`` in ``window``."""

    fatal: bool = True
    unrated: bool = False  # lines without a severity word instead of fatal/nonfatal
    count: int = 1
    window: float = 600.0
    quiet: float = 3600.0
    node_level: bool = True

    def hold(self, keep_firing_for: float) -> float:
        return self.quiet


def gpus_behind(snap: Snapshot, switch: str) -> list[int]:
    """The GPUs whose NVLinks end at ``switch`` (a PCI bus id), by index."""
    bus = switch.upper()
    return sorted(g.index for g in snap.gpus if bus and bus in g.info.nvlink_peers)


def _values(snap: Snapshot, ev: XidEvent, count: int) -> dict[str, Any]:
    text = " ".join(ev.message.split())
    if not text.isprintable():  # a page never carries a terminal escape from the log
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    behind = gpus_behind(snap, ev.pci_bus_id or "")
    gpus = ", ".join(str(i) for i in behind)
    return {
        "sxid": ev.xid,
        "sxid_text": text,
        "switch": ev.pci_bus_id or "",
        "count": count,
        "gpus": gpus,
        "behind": f" (GPU{'s' if len(behind) > 1 else ''} {gpus} behind it)" if behind else "",
    }


class _Evaluator(Evaluator):
    __slots__ = ("c", "cursor")

    def __init__(self, rule: Rule, snap: Snapshot) -> None:
        super().__init__(rule)
        self.c = model_of(rule, SxidMatch)
        self.cursor = snap.sxids.seq

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator):
            self.cursor = old.cursor

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        c = self.c
        log = snap.sxids
        cursor, self.cursor = self.cursor, log.seq
        hits: Hits = {}
        if cursor >= log.seq:
            return hits, set()
        want = "unrated" if c.unrated else "fatal" if c.fatal else "nonfatal"
        newest = next(
            (e for e in log.newest_first(cursor) if sxid_verdict(e.message) == want), None
        )
        if newest is None:
            return hits, set()
        start = min(now, newest.timestamp) - c.window
        count = sum(
            1
            for x in log.events
            if x.event.timestamp >= start and sxid_verdict(x.event.message) == want
        )
        if count >= c.count:
            hits[NODE_KEY] = (float(count), _values(snap, newest, count))
        return hits, set()


class SxidKind(ConditionKind):
    key = "sxid"
    keys = ("fatal", "unrated", "count", "window", "quiet")
    placeholders = frozenset({"sxid", "sxid_text", "switch", "count", "window", "gpus", "behind"})
    node_level = True
    not_with: ClassVar[Mapping[str, str]] = {
        "keep_firing_for": "an sxid rule resolves after condition.sxid.quiet; set that instead",
        "for": (
            "an sxid rule fires on the report itself; use condition.sxid.count and window to "
            "ask for repeats"
        ),
        "when": "not available for sxid rules (an NVSwitch has no GPU sample)",
        "select": "not available for sxid rules (an NVSwitch is not a GPU)",
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        r = p.r
        unrated = p.boolean(keys, "unrated", what, False)
        if unrated:
            if "fatal" in keys:
                p.error(keys["fatal"], f"{what}.fatal: not with unrated: true")
                return None
            fatal: bool | None = False
        else:
            if not p.need(body, keys, ("fatal",), what):
                return None
            fatal = r.boolean(keys["fatal"], f"{what}.fatal")
        if fatal is None:
            return None
        count = 1
        if "count" in keys:
            count = r.integer(keys["count"], f"{what}.count", minimum=1, maximum=10000) or 1
        window = 600.0
        if "window" in keys:
            window = p.window(keys["window"], f"{what}.window") or window
        quiet = 3600.0
        if "quiet" in keys:
            quiet = p.window(keys["quiet"], f"{what}.quiet") or quiet
        return SxidMatch(fatal, unrated, count, window, quiet)

    def schema(self) -> sp.Schema:
        out = sp.body(
            {
                "fatal": {
                    "type": "boolean",
                    "description": "true: SXid lines that say Fatal; false: Non-fatal ones.",
                },
                "unrated": {
                    "type": "boolean",
                    "default": False,
                    "description": "true (instead of fatal): SXid lines that say neither "
                    "Fatal nor Non-fatal and are not detail lines.",
                },
                "count": {"type": "integer", "minimum": 1, "default": 1},
                "window": sp.duration("10m"),
                "quiet": sp.duration("1h"),
            },
            "NVSwitch SXid reports judged by their line (Fatal, Non-fatal, neither); count in "
            "window; resolves after quiet. One alert for the node.",
        )
        out["anyOf"] = [{"required": ["fatal"]}, {"required": ["unrated"]}]
        return out

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule, snap)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, SxidMatch)
        return Needs(xid_window=c.window)

    def trigger(self, c: Condition) -> Trigger:
        return "sxid"  # a new SXid; without one a window's count can only fall

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, SxidMatch)
        return {"window": format_duration(c.window)}


KIND = SxidKind()
