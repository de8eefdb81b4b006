"""``recovery_action``: the driver asks for a GPU reset, a node reboot or a drain.

The driver says so two ways: the polled NVML field 230 (``recovery_action``) and an XID 154
in the kernel log (``GPU recovery action changed from 0x0 (None) to 0x2 (...)``), read by
its hex code (``gpuwatchd.xid.catalog.parse_recovery_change``). One condition reads both,
so one fault is one alert (one page), whichever path reports it, and the kernel-log path
still answers while NVML is down or the field is not supported.

Per GPU, the newer of the two decides: a sample taken after the last XID 154 reports the
field's value; otherwise the XID 154's new action holds (until a sample after it, or an XID
154 back to ``0x0 (None)``). A GPU with neither cannot be told.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    ConditionKind,
    Evaluator,
    Hits,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import Snapshot
from gpuwatchd.xid.catalog import parse_recovery_change, recovery_actions

FIELD = "recovery_action"
XID_RECOVERY = 154


@dataclass(frozen=True)
class RecoveryActionAsked(Condition):
    """The driver's recovery action is not "none" (NVML field 230, XID 154 lines)."""

    kernel_log: bool = True


def action_name(code: int) -> str:
    """``0x2 (NODE_REBOOT)``: the code as the driver prints it, with NVML's name."""
    row = next((r for r in recovery_actions() if r.code == code), None)
    return f"0x{code:x} ({row.nvml_name if row else 'unknown'})"


class _Evaluator(Evaluator):
    __slots__ = ("c", "cursor", "kernel")

    def __init__(self, rule: Rule, snap: Snapshot) -> None:
        super().__init__(rule)
        self.c = model_of(rule, RecoveryActionAsked)
        self.cursor = snap.xids.seq
        # GPU index -> (time, new action code) of its last XID 154 with a readable code
        self.kernel: dict[int, tuple[float, int]] = {}

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator):
            self.cursor, self.kernel = old.cursor, old.kernel

    def _read_xids(self, snap: Snapshot) -> None:
        log = snap.xids
        cursor, self.cursor = self.cursor, log.seq
        if cursor >= log.seq or not self.c.kernel_log:
            return
        for ev in reversed(list(log.newest_first(cursor))):
            if ev.xid != XID_RECOVERY or ev.kind != "xid":
                continue
            change = parse_recovery_change(ev.message)
            gpu = snap.gpu_of(ev)
            if change is None or gpu < 0:
                continue  # an NVML event has no text: field 230 speaks for it
            seen = self.kernel.get(gpu)
            if seen is None or ev.timestamp >= seen[0]:
                self.kernel[gpu] = (ev.timestamp, change.after)

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        self._read_xids(snap)
        hits: Hits = {}
        unknown: set[int] = set()
        for g in snap.selected(self.rule):
            field = g.sample.fields.get(FIELD) if g.sample is not None else None
            line = self.kernel.get(g.index)
            if (
                field is not None
                and g.sample is not None
                and (line is None or g.sample.timestamp >= line[0])
            ):
                code, source = int(field), "NVML field 230"
            elif line is not None:
                code, source = line[1], "XID 154 in the kernel log"
            else:
                unknown.add(g.index)
                continue
            if code > 0:
                values: dict[str, Any] = {"recovery": action_name(code), "source": source}
                hits[(g.index, -1, -1)] = (float(code), values)
        return hits, unknown


class RecoveryActionKind(ConditionKind):
    key = "recovery_action"
    keys = ("kernel_log",)
    placeholders = frozenset({"recovery", "source"})
    not_with: ClassVar[Mapping[str, str]] = {
        "when": (
            "not available for recovery_action rules (a GPU that asks for a reboot may have "
            "no sample to guard on)"
        ),
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        return RecoveryActionAsked(p.boolean(keys, "kernel_log", what, True))

    def schema(self) -> sp.Schema:
        return sp.body(
            {
                "kernel_log": {
                    "type": "boolean",
                    "default": True,
                    "description": "Also read XID 154 lines of the kernel log (their new "
                    "recovery-action code), not only NVML field 230.",
                }
            },
            "The driver's recovery action (NVML field 230, XID 154 lines) is not none.",
        )

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule, snap)

    def trigger(self, c: Condition) -> Trigger:
        return "sample"  # evaluated every cycle: a sample or an XID 154 can change it


KIND = RecoveryActionKind()
