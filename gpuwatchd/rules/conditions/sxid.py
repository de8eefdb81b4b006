"""``sxid``: NVSwitch SXid reports, judged by what their line says (fatal or non-fatal).

The NVSwitch driver writes ``nvidia-nvswitchN: SXid (PCI:...): CODE, Fatal, Link N ...`` or
``..., Non-fatal, ...`` and follows the report with detail lines (``Data {...}``,
``Severity 0 Engine instance ...``) under the same code; detail lines never count. SXid
codes are the NVSwitch's own numbering (NVIDIA's Fabric Manager User Guide), not XIDs, and
only trusted kernel records reach this condition, like XIDs.

The alert is the node's (one series, no GPU): the switch's PCI address is in the
``{switch}`` placeholder. Which GPUs sit behind the switch's links needs the NVLink
topology, which this condition does not read.
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
    count: int = 1
    window: float = 600.0
    quiet: float = 3600.0
    node_level: bool = True

    def hold(self, keep_firing_for: float) -> float:
        return self.quiet


def _values(ev: XidEvent, count: int) -> dict[str, Any]:
    text = " ".join(ev.message.split())
    if len(text) > MAX_TEXT:
        text = text[: MAX_TEXT - 3] + "..."
    return {"sxid": ev.xid, "sxid_text": text, "switch": ev.pci_bus_id or "", "count": count}


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
        want = "fatal" if c.fatal else "nonfatal"
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
            hits[NODE_KEY] = (float(count), _values(newest, count))
        return hits, set()


class SxidKind(ConditionKind):
    key = "sxid"
    keys = ("fatal", "count", "window", "quiet")
    placeholders = frozenset({"sxid", "sxid_text", "switch", "count", "window"})
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
        if not p.need(body, keys, ("fatal",), what):
            return None
        r = p.r
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
        return SxidMatch(fatal, count, window, quiet)

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "fatal": {
                    "type": "boolean",
                    "description": "true: SXid lines that say Fatal; false: Non-fatal ones.",
                },
                "count": {"type": "integer", "minimum": 1, "default": 1},
                "window": sp.duration("10m"),
                "quiet": sp.duration("1h"),
            },
            "NVSwitch SXid reports judged by their line (Fatal, Non-fatal); count in window; "
            "resolves after quiet. One alert for the node.",
            required=("fatal",),
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule, snap)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, SxidMatch)
        return Needs(xid_window=c.window)

    def trigger(self, c: Condition) -> Trigger:
        return "sample"  # the SXid log has its own numbering: looked at every cycle

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, SxidMatch)
        return {"window": format_duration(c.window)}


KIND = SxidKind()
