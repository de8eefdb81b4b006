"""What an XID means and what to do about it: NVIDIA's catalog plus gpuwatchd's policy.

The data (every code, its resolution buckets, the XID 144-150 decode rules, the XID 154
recovery-action codes) is NVIDIA's, generated into ``catalog_data.py``. This module turns
it into a severity and an action, from the code's *immediate* resolution bucket:

``critical``
    The GPU or node must leave service: RESET_GPU, RESTART_BM, RESTART_VM,
    WORKFLOW_XID_48 (double-bit ECC), WORKFLOW_NVLINK_ERR (XID 74), and XID 154 or an
    NVLink5 rule that asks for a reset, drain or reboot.
``warning``
    Someone should look, but work can go on: CONTACT_SUPPORT (including codes the
    catalog marks "Unused" on A100 and newer), CHECK_MECHANICALS, CHECK_UVM, UPDATE_SWFW,
    codes with no bucket (162-172), undecodable NVLink5 XIDs 144-150, and NVLink5 rules
    that say "follow the XID 154 that comes with it" (XID_154_EVAL).
``info``
    The application failed, or nothing is needed; the GPU stays healthy: RESTART_APP,
    IGNORE, WORKFLOW_XID_45 (cleanup after another XID), XID 154 back to "None".
``unknown``
    Not in the catalog: an XID code newer than the workbook, and NVSwitch SXid detail
    lines (SXids are documented in the Fabric Manager User Guide, not here).

Actions are stable tokens (``Action``); ``action_text`` says it in words. XID 154 is read by
its hex recovery-action code (``to 0x2 (...)``), never by the words, which drivers change.
Operators override severity, action, the action's words and membership of the fatal set
per code with ``Catalog.with_overrides``.

The *fatal set* is gpuwatchd's list of codes that page and drain (the shipped rule
``GpuXidFatal`` matches it): the codes whose immediate bucket is in ``FATAL_BUCKETS``, plus
codes an override marks ``fatal: true``, minus those marked ``fatal: false``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, TypeVar

from gpuwatchd.xid import catalog_data
from gpuwatchd.xid.rows import NvlinkDecodeRow, RecoveryActionRow, XidRow


class XidSeverity(enum.StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"
    UNKNOWN = "unknown"


_RANK = {
    XidSeverity.CRITICAL: 3,
    XidSeverity.WARNING: 2,
    XidSeverity.UNKNOWN: 1,
    XidSeverity.INFO: 0,
}


class Action(enum.StrEnum):
    NONE = "none"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    DRAIN_AND_RESET = "drain_and_reset"
    DRAIN_P2P = "drain_p2p"
    REBOOT_NODE = "reboot_node"
    RESTART_VM = "restart_vm"
    RECOVER_IMEX_DOMAIN = "recover_imex_domain"
    CHECK_HARDWARE = "check_hardware"
    UPDATE_SOFTWARE = "update_software"
    CONTACT_SUPPORT = "contact_support"
    INVESTIGATE = "investigate"


@dataclass(frozen=True, slots=True)
class Policy:
    severity: XidSeverity
    action: Action
    text: str


_S, _A = XidSeverity, Action

# Immediate resolution bucket -> gpuwatchd's severity and action. Every bucket the
# workbook uses must be here (a test checks), so a new bucket is a decision, not a default.
BUCKET_POLICY: Mapping[str, Policy] = {
    "RESET_GPU": Policy(_S.CRITICAL, _A.RESET_GPU, "Drain the GPU's work and reset the GPU."),
    "RESTART_BM": Policy(_S.CRITICAL, _A.REBOOT_NODE, "Reboot the node."),
    "RESTART_VM": Policy(_S.CRITICAL, _A.RESTART_VM, "Restart the VM that owns the GPU."),
    "WORKFLOW_XID_48": Policy(
        _S.CRITICAL,
        _A.RESET_GPU,
        "Reset the GPU; if XID 63 or 64 came with it, drain and reset. For an SRAM error,"
        " check the SRAM error-threshold flag and run field diagnostics if it is set.",
    ),
    "WORKFLOW_NVLINK_ERR": Policy(
        _S.CRITICAL,
        _A.RESET_GPU,
        "An NVLink link went down: reset the GPU (or reboot the node) to bring it back, and"
        " decode the error registers to see whether the link or its peer is at fault.",
    ),
    "XID_154": Policy(
        _S.CRITICAL,
        _A.INVESTIGATE,
        "Do what the XID 154 message's recovery-action code asks.",
    ),
    "WORKFLOW_NVLINK5_ERR": Policy(
        _S.WARNING,
        _A.INVESTIGATE,
        "Decode the message's IntrInfo and ErrorStatus registers with the XID 144-150 rules;"
        " follow the XID 154 that accompanies a fatal one.",
    ),
    "CONTACT_SUPPORT": Policy(_S.WARNING, _A.CONTACT_SUPPORT, "Contact your support organization."),
    "CHECK_MECHANICALS": Policy(
        _S.WARNING, _A.CHECK_HARDWARE, "Check the GPU's seating and power connections."
    ),
    "CHECK_UVM": Policy(
        _S.WARNING, _A.INVESTIGATE, "If UVM or vGPU is in use, reset the GPU; otherwise ignore."
    ),
    "UPDATE_SWFW": Policy(
        _S.WARNING, _A.UPDATE_SOFTWARE, "Update the driver and firmware to current versions."
    ),
    "RESTART_APP": Policy(
        _S.INFO, _A.RESTART_APP, "Restart the application; the GPU stays usable."
    ),
    "IGNORE": Policy(_S.INFO, _A.NONE, "No action required."),
    "WORKFLOW_XID_45": Policy(
        _S.INFO,
        _A.NONE,
        "Follow the XID this cleanup accompanies; seen alone, restart Fabric Manager.",
    ),
}
NO_BUCKET_POLICY = Policy(
    _S.WARNING,
    _A.INVESTIGATE,
    "The catalog gives no resolution bucket for this code; read its trigger conditions.",
)
UNKNOWN_BUCKET_POLICY = Policy(
    _S.WARNING, _A.CONTACT_SUPPORT, "This resolution bucket is new to gpuwatchd."
)

# Resolution buckets of the XID 144-150 decode rules.
NVLINK5_RULE_POLICY: Mapping[str, Policy] = {
    "RESET_GPU": BUCKET_POLICY["RESET_GPU"],
    "IGNORE": BUCKET_POLICY["IGNORE"],
    "XID_154_EVAL": Policy(
        _S.WARNING,
        _A.RESTART_APP,
        "Take the action of the XID 154 that comes with this error; without one, restart"
        " the application.",
    ),
}

# XID 154 recovery-action code (by NVML name) -> severity and action.
RECOVERY_POLICY: Mapping[str, Policy] = {
    "NONE": Policy(_S.INFO, _A.NONE, "The GPU needs no recovery any more."),
    "GPU_RESET": Policy(_S.CRITICAL, _A.RESET_GPU, "Drain the GPU's work and reset the GPU."),
    "NODE_REBOOT": Policy(_S.CRITICAL, _A.REBOOT_NODE, "Reboot the node."),
    "DRAIN_P2P": Policy(
        _S.CRITICAL, _A.DRAIN_P2P, "Drain peer-to-peer (NVLink) work from the GPU."
    ),
    "DRAIN_AND_RESET": Policy(
        _S.CRITICAL, _A.DRAIN_AND_RESET, "Drain the GPU's work, then reset the GPU."
    ),
    "RECOVER_IMEX_DOMAIN": Policy(
        _S.CRITICAL, _A.RECOVER_IMEX_DOMAIN, "Recover the GPU's IMEX domain."
    ),
    "BUS_RESET": Policy(_S.CRITICAL, _A.RESET_GPU, "Reset the GPU (a PCIe bus reset)."),
    "SYSTEM_REBOOT": Policy(_S.CRITICAL, _A.REBOOT_NODE, "Reboot the node."),
}
UNKNOWN_RECOVERY_POLICY = Policy(
    _S.CRITICAL,
    _A.CONTACT_SUPPORT,
    "The driver asks for a recovery action gpuwatchd does not know.",
)

# Immediate resolution buckets whose codes are fatal by default: the GPU's work is lost or
# corrupt, or the GPU needs hands on it (GpuXidFatal pages and drains on these).
FATAL_BUCKETS: frozenset[str] = frozenset(
    {
        "RESET_GPU",
        "RESTART_BM",
        "RESTART_VM",
        "WORKFLOW_XID_48",
        "WORKFLOW_NVLINK_ERR",
        "WORKFLOW_NVLINK5_ERR",
        "CHECK_MECHANICALS",
    }
)
# Buckets whose codes are judged per report, from the message: the NVLink5 XIDs 144-150
# by their decoded registers (fatal only when the matching decode rule says RESET_GPU),
# XID 154 by its recovery-action code.
VERDICT_BUCKET = "WORKFLOW_NVLINK5_ERR"
MESSAGE_JUDGED_BUCKETS: frozenset[str] = frozenset({VERDICT_BUCKET, "XID_154"})
MAX_ACTION_TEXT = 500  # characters of an override's own words for the action
OVERRIDE_FIELDS = ("severity", "action", "text", "fatal")

_RECOVERY_RE = re.compile(
    r"recovery action changed from (0x[0-9a-fA-F]+)\b.*?\bto (0x[0-9a-fA-F]+)", re.S
)
_REGISTERS_RE = re.compile(r"\((0x[0-9a-fA-F]+(?:[\s,]+0x[0-9a-fA-F]+)+)\s*\)")


@dataclass(frozen=True, slots=True)
class Verdict:
    """How gpuwatchd rates one report: ``reason`` says which rule decided."""

    severity: XidSeverity
    action: Action
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"severity": self.severity.value, "action": self.action.value, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One XID code: NVIDIA's catalog row plus gpuwatchd's severity and action for it."""

    xid: int
    mnemonic: str
    description: str
    applies_to: tuple[tuple[str, bool], ...]
    immediate: str
    immediate_text: str
    investigatory: str
    investigatory_text: str
    xid154_linkage: str
    trigger: str
    severity: XidSeverity
    action: Action
    action_text: str
    fatal: bool = False
    overridden: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "xid": self.xid,
            "mnemonic": self.mnemonic,
            "description": self.description,
            "applies_to": dict(self.applies_to),
            "immediate": self.immediate,
            "immediate_text": self.immediate_text,
            "investigatory": self.investigatory,
            "investigatory_text": self.investigatory_text,
            "xid154_linkage": self.xid154_linkage,
            "trigger": self.trigger,
            "severity": self.severity.value,
            "action": self.action.value,
            "action_text": self.action_text,
            "fatal": self.fatal,
            "overridden": self.overridden,
        }


@dataclass(frozen=True, slots=True)
class RecoveryChange:
    """An XID 154 message, decoded: the recovery action went from one code to another."""

    before: int
    after: int
    after_action: RecoveryActionRow | None


@dataclass(frozen=True, slots=True)
class NvlinkMatch:
    """An XID 144-150 decode rule that matches a message's registers."""

    rule: NvlinkDecodeRow
    variant: str  # "V1" (driver < R575) or "V2" (R575 and later)
    bucket: str  # the rule's immediate bucket, or its Action 2 when that mask matched
    intrinfo: int
    error_status: int


def parse_recovery_change(message: str) -> RecoveryChange | None:
    """Decode "GPU recovery action changed from 0x0 (None) to 0x2 (...)" by its codes."""
    m = _RECOVERY_RE.search(message)
    if m is None:
        return None
    after = int(m.group(2), 16)
    row = next((r for r in catalog_data.RECOVERY_ACTIONS if r.code == after), None)
    return RecoveryChange(int(m.group(1), 16), after, row)


def _mask(bits: str) -> tuple[int, int] | None:
    """A 32-character mask (bit 31 first, ``-`` = any) as (bits that count, their values)."""
    if not bits:
        return None
    care = value = 0
    for i, ch in enumerate(bits):
        bit = 1 << (len(bits) - 1 - i)
        if ch != "-":
            care |= bit
            if ch == "1":
                value |= bit
    return care, value


def _statuses(text: str) -> frozenset[int] | None:
    """Error-status cell -> accepted values; None means any value."""
    if not text:
        return None
    return frozenset(int(part, 16) for part in text.split("/"))


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    row: NvlinkDecodeRow
    masks: tuple[tuple[str, tuple[int, int]], ...]  # (variant, mask)
    action2_masks: tuple[tuple[str, tuple[int, int]], ...]
    statuses: frozenset[int] | None


def _compile_rule(row: NvlinkDecodeRow) -> _CompiledRule:
    def pairs(v1: str, v2: str) -> tuple[tuple[str, tuple[int, int]], ...]:
        out = []
        for variant, bits in (("V1", v1), ("V2", v2)):
            m = _mask(bits)
            if m is not None:
                out.append((variant, m))
        return tuple(out)

    return _CompiledRule(
        row,
        pairs(row.intrinfo_v1, row.intrinfo_v2),
        pairs(row.action2_intrinfo_v1, row.action2_intrinfo_v2),
        _statuses(row.error_status),
    )


def nvlink5_registers(message: str) -> tuple[int, int] | None:
    """(IntrInfo, ErrorStatus): the first two registers in the message's parentheses."""
    found = _REGISTERS_RE.findall(message)
    if not found:
        return None
    regs = re.split(r"[\s,]+", found[-1].strip())
    return int(regs[0], 16), int(regs[1], 16)


def _recovery_verdict(code: int) -> Verdict:
    row = next((r for r in catalog_data.RECOVERY_ACTIONS if r.code == code), None)
    policy = RECOVERY_POLICY.get(row.nvml_name, UNKNOWN_RECOVERY_POLICY) if row else None
    policy = policy or UNKNOWN_RECOVERY_POLICY
    name = row.nvml_name if row else "unknown"
    return Verdict(
        policy.severity, policy.action, f"XID 154: recovery action now 0x{code:x} ({name})"
    )


# What to tell the operator for an action an override chose (the first policy that
# takes the action says it; a few actions no bucket takes have their own words).
ACTION_TEXT: Mapping[Action, str] = {
    **{
        action: text
        for action, text in reversed(
            [(p.action, p.text) for p in (*BUCKET_POLICY.values(), *RECOVERY_POLICY.values())]
        )
    },
    Action.INVESTIGATE: "Investigate: read the XID's trigger conditions and the kernel log.",
    Action.CHECK_HARDWARE: "Check the GPU's hardware: seating, power, cooling.",
    Action.NONE: "No action required.",
}


def _policy_for_bucket(name: str) -> Policy:
    if not name:
        return NO_BUCKET_POLICY
    return BUCKET_POLICY.get(name, UNKNOWN_BUCKET_POLICY)


def _worst(verdicts: list[Verdict]) -> Verdict:
    return max(verdicts, key=lambda v: _RANK[v.severity])


@dataclass(frozen=True, slots=True)
class _Override:
    severity: XidSeverity | None = None
    action: Action | None = None
    text: str | None = None  # the site's own words for the action
    fatal: bool | None = None  # in (True) or out of (False) the fatal set


class Catalog:
    """NVIDIA's XID catalog with gpuwatchd's policy; immutable, cheap to share.

    Use ``Catalog.default()`` and ``with_overrides``; the constructor's argument is internal.
    """

    def __init__(self, overrides: Mapping[int, _Override] | None = None) -> None:
        self._overrides: dict[int, _Override] = dict(overrides or {})
        bucket_text = {b.name: b.text for b in catalog_data.BUCKETS}
        self._bucket_text = bucket_text
        self._base: dict[int, CatalogEntry] = {
            row.code: self._entry(row, bucket_text) for row in catalog_data.XIDS
        }
        self._entries = {
            code: self._apply(entry, self._overrides.get(code))
            for code, entry in self._base.items()
        }
        self._fatal = frozenset(
            {e.xid for e in self._entries.values() if e.fatal}
            | {code for code, o in self._overrides.items() if o.fatal}
        )
        self._rules: dict[int, tuple[_CompiledRule, ...]] = {}
        for row in catalog_data.NVLINK5_DECODE:
            self._rules.setdefault(row.xid, ())
            self._rules[row.xid] += (_compile_rule(row),)

    @staticmethod
    def _entry(row: XidRow, bucket_text: Mapping[str, str]) -> CatalogEntry:
        policy = _policy_for_bucket(row.immediate)
        return CatalogEntry(
            xid=row.code,
            mnemonic=row.mnemonic,
            description=row.description,
            applies_to=row.applies_to,
            immediate=row.immediate,
            immediate_text=bucket_text.get(row.immediate, ""),
            investigatory=row.investigatory,
            investigatory_text=bucket_text.get(row.investigatory, ""),
            xid154_linkage=row.xid154_linkage,
            trigger=row.trigger,
            severity=policy.severity,
            action=policy.action,
            action_text=policy.text,
            fatal=row.immediate in FATAL_BUCKETS,
        )

    @staticmethod
    def _apply(entry: CatalogEntry, override: _Override | None) -> CatalogEntry:
        if override is None:
            return entry
        action = override.action or entry.action
        text = entry.action_text
        if action is not entry.action:  # the page must say what the override asks for
            text = ACTION_TEXT.get(action, f"{action.value} (set by xid.overrides)")
        return replace(
            entry,
            severity=override.severity or entry.severity,
            action=action,
            action_text=override.text or text,
            fatal=entry.fatal if override.fatal is None else override.fatal,
            overridden=True,
        )

    def action_text(self, xid: int, verdict: Verdict) -> str:
        """What the page says to do about one report of ``xid`` rated ``verdict``.

        An override's ``text`` always (the site's runbook for the code); else the entry's
        words when the verdict asks for the entry's action; else the verdict's action in
        words, with the reason (an XID 154 or NVLink5 message decoded to another action)."""
        override = self._overrides.get(xid)
        if override is not None and override.text:
            return override.text
        entry = self._entries.get(xid)
        if entry is not None and verdict.action is entry.action:
            return entry.action_text
        words = ACTION_TEXT.get(verdict.action, verdict.action.value)
        return f"{words} ({verdict.reason})"

    def fatal_codes(self) -> frozenset[int]:
        """The fatal set: catalog codes of a fatal bucket, with the overrides applied
        (codes outside NVIDIA's catalog join it only by an override's ``fatal: true``)."""
        return self._fatal

    def verdict_codes(self) -> frozenset[int]:
        """Codes whose membership of the fatal set is judged per report, from the decoded
        message (the NVLink5 XIDs 144-150), unless an override pins ``fatal``."""
        return frozenset(
            code
            for code, entry in self._base.items()
            if entry.immediate == VERDICT_BUCKET
            and (code not in self._overrides or self._overrides[code].fatal is None)
        )

    def nvlink5_verdict(self, xid: int, message: str) -> str:
        """``fatal``, ``nonfatal`` or ``undecoded``: how one XID 144-150 message decodes.

        Fatal when the worst matching decode rule asks for a GPU reset (RESET_GPU); a rule
        saying IGNORE or "follow the XID 154" (XID_154_EVAL) is not fatal on its own. A
        message no rule matches is ``undecoded``."""
        verdict = self._classify_nvlink5(xid, message)
        if verdict is None:
            return "undecoded"
        return "fatal" if verdict.severity is XidSeverity.CRITICAL else "nonfatal"

    def judged_fatal(self, xid: int, message: str = "", kind: str = "xid") -> bool:
        """Whether one report is in the fatal set: by its code, except that an NVLink5
        XID 144-150 whose registers decode is fatal only when they decode as fatal (an
        undecodable one stays fatal: it cannot be told apart). An override's ``fatal``
        wins. SXids are not XIDs: never."""
        if kind == "sxid":
            return False
        if xid in self._rules:
            override = self._overrides.get(xid)
            if override is None or override.fatal is None:
                verdict = self.nvlink5_verdict(xid, message)
                if verdict != "undecoded":
                    return verdict == "fatal"
        return xid in self._fatal

    @classmethod
    def default(cls) -> Catalog:
        """The shared catalog without overrides."""
        return _default_catalog()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, xid: object) -> bool:
        return xid in self._entries

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self._entries[code] for code in sorted(self._entries))

    def codes(self) -> tuple[int, ...]:
        return tuple(sorted(self._entries))

    def knows(self, xid: int) -> bool:
        """Whether NVIDIA's catalog lists ``xid`` or an override says what it is."""
        return xid in self._entries or xid in self._overrides

    def unbucketed_codes(self) -> frozenset[int]:
        """Catalog codes without an immediate resolution bucket (162-172 in the shipped
        edition): NVIDIA lists them but says nothing about what to do."""
        return frozenset(code for code, e in self._base.items() if not e.immediate)

    def lookup(self, xid: int) -> CatalogEntry | None:
        """The entry for ``xid`` (overrides applied), or None if NVIDIA does not list it."""
        return self._entries.get(xid)

    def bucket_text(self, name: str) -> str:
        """NVIDIA's text for a resolution bucket ("" if the workbook does not define it)."""
        return self._bucket_text.get(name, "")

    def with_overrides(self, overrides: Mapping[int, Mapping[str, str | bool]]) -> Catalog:
        """A catalog where the given codes have the given severity, action, words for the
        action and/or membership of the fatal set.

        ``{79: {"severity": "warning", "action": "investigate", "fatal": False},
        94: {"fatal": True, "text": "Drain and open a vendor case."}}``. Codes outside the
        catalog may be given too (they then classify as told instead of ``unknown``).
        Raises ValueError naming the code and field on anything it cannot use.
        """
        merged = dict(self._overrides)
        for xid, fields in overrides.items():
            if isinstance(xid, bool) or not isinstance(xid, int) or xid < 0:
                raise ValueError(f"override key {xid!r}: expected an XID number")
            unknown = set(fields) - set(OVERRIDE_FIELDS)
            if unknown or not fields:
                raise ValueError(
                    f"XID {xid} override: expected one or more of {', '.join(OVERRIDE_FIELDS)},"
                    f" got {sorted(fields)}"
                )
            severity = _parse_enum(XidSeverity, _text(fields, "severity", xid), xid, "severity")
            action = _parse_enum(Action, _text(fields, "action", xid), xid, "action")
            text = _words(_text(fields, "text", xid), xid)
            fatal = fields.get("fatal")
            if fatal is not None and not isinstance(fatal, bool):
                raise ValueError(f"XID {xid} override: fatal must be true or false, not {fatal!r}")
            before = merged.get(xid, _Override())
            merged[xid] = _Override(
                severity or before.severity,
                action or before.action,
                text or before.text,
                before.fatal if fatal is None else fatal,
            )
        return Catalog(merged)

    def classify(self, xid: int, message: str = "", kind: str = "xid") -> Verdict:
        """Severity and action for one report, reading its message where the code needs it."""
        if kind == "sxid":
            return _classify_sxid(xid, message)
        verdict = self._classify_xid(xid, message)
        override = self._overrides.get(xid)
        if override is None:
            return verdict
        return Verdict(
            override.severity or verdict.severity,
            override.action or verdict.action,
            f"{verdict.reason}; overridden by configuration",
        )

    def _classify_xid(self, xid: int, message: str) -> Verdict:
        entry = self._base.get(xid)
        if entry is None:
            return Verdict(
                XidSeverity.UNKNOWN, Action.INVESTIGATE, f"XID {xid} is not in NVIDIA's catalog"
            )
        if entry.immediate == "XID_154":
            decoded = self._classify_recovery(message)
            if decoded is not None:
                return decoded
        elif entry.immediate == "WORKFLOW_NVLINK5_ERR":
            decoded = self._classify_nvlink5(xid, message)
            if decoded is not None:
                return decoded
        bucket = entry.immediate or "no bucket"
        return Verdict(entry.severity, entry.action, f"XID {xid} {entry.mnemonic}: {bucket}")

    @staticmethod
    def _classify_recovery(message: str) -> Verdict | None:
        change = parse_recovery_change(message)
        return None if change is None else _recovery_verdict(change.after)

    def recovery_verdict(self, code: int) -> Verdict:
        """The verdict for an XID 154 whose recovery action is now ``code`` (overrides apply)."""
        verdict = _recovery_verdict(code)
        override = self._overrides.get(154)
        if override is None:
            return verdict
        return Verdict(
            override.severity or verdict.severity,
            override.action or verdict.action,
            f"{verdict.reason}; overridden by configuration",
        )

    def match_nvlink5(self, xid: int, message: str) -> list[NvlinkMatch]:
        """The XID 144-150 decode rules that match the registers in ``message``.

        The rules differ by driver branch (V1 before R575, V2 from R575); both are tried,
        since the masks of the two never select the same register value for different
        rules of one XID (a test checks that).
        """
        regs = nvlink5_registers(message)
        if regs is None:
            return []
        intrinfo, status = regs
        found: list[NvlinkMatch] = []
        for rule in self._rules.get(xid, ()):
            if rule.statuses is not None and status not in rule.statuses:
                continue
            for variant, (care, value) in rule.action2_masks:
                if intrinfo & care == value:
                    found.append(NvlinkMatch(rule.row, variant, rule.row.action2, intrinfo, status))
                    break
            else:
                for variant, (care, value) in rule.masks:
                    if intrinfo & care == value:
                        found.append(
                            NvlinkMatch(rule.row, variant, rule.row.immediate, intrinfo, status)
                        )
                        break
        return found

    def _classify_nvlink5(self, xid: int, message: str) -> Verdict | None:
        matches = self.match_nvlink5(xid, message)
        if not matches:
            return None
        verdicts = []
        for m in matches:
            policy = NVLINK5_RULE_POLICY.get(m.bucket, UNKNOWN_BUCKET_POLICY)
            reason = (
                f"XID {xid} {m.rule.subcode} ({m.variant} IntrInfo 0x{m.intrinfo:08x},"
                f" ErrorStatus 0x{m.error_status:08x}): {m.bucket}, {m.rule.severity}"
            )
            verdicts.append(Verdict(policy.severity, policy.action, reason))
        return _worst(verdicts)


_E = TypeVar("_E", XidSeverity, Action)


def _parse_enum(kind: type[_E], value: str | None, xid: int, what: str) -> _E | None:
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(m.value for m in kind)
        raise ValueError(
            f"XID {xid} override: unknown {what} {value!r} (expected one of {choices})"
        ) from None


def _text(fields: Mapping[str, str | bool], name: str, xid: int) -> str | None:
    value = fields.get(name)
    if value is None or isinstance(value, str):
        return value
    raise ValueError(f"XID {xid} override: {name} must be text, not {value!r}")


def _words(text: str | None, xid: int) -> str | None:
    """An override's words for the action: one line of printable text, bounded."""
    if text is None:
        return None
    if not text.strip():
        raise ValueError(f"XID {xid} override: text is empty")
    if len(text) > MAX_ACTION_TEXT:
        raise ValueError(
            f"XID {xid} override: text is {len(text)} characters, at most {MAX_ACTION_TEXT}"
        )
    if not text.isprintable():
        raise ValueError(f"XID {xid} override: text must be one line of printable characters")
    return text.strip()


SXID_VERDICTS = ("fatal", "nonfatal", "unrated", "detail")


def sxid_verdict(message: str) -> str:
    """``fatal``, ``nonfatal``, ``unrated`` or ``detail``: what an SXid line says of itself.

    The NVSwitch driver prints ``CODE, Fatal, Link N ...`` or ``CODE, Non-fatal, ...`` on the
    report's main line and follows it with detail lines (``Data {...}``, ``Severity 0
    Engine instance ...``) that carry the same code and say nothing of their own. A line
    that is neither (``26006, SOE HALTED`` as reports quote it) is ``unrated``: a report the
    line does not rate, which the shipped rules answer with a ticket, never silence."""
    head = message.lstrip().lower()
    if head.startswith(("non-fatal", "nonfatal")):
        return "nonfatal"
    if head.startswith("fatal"):
        return "fatal"
    if head.startswith(("data {", "severity ")) or not head:
        return "detail"
    return "unrated"


def _classify_sxid(code: int, message: str) -> Verdict:
    where = "see the NVIDIA Fabric Manager User Guide"
    verdict = sxid_verdict(message)
    if verdict == "nonfatal":
        return Verdict(XidSeverity.WARNING, Action.INVESTIGATE, f"SXid {code} non-fatal; {where}")
    if verdict == "fatal":
        return Verdict(XidSeverity.CRITICAL, Action.INVESTIGATE, f"SXid {code} fatal; {where}")
    if verdict == "unrated":
        return Verdict(
            XidSeverity.WARNING, Action.INVESTIGATE, f"SXid {code} says no severity; {where}"
        )
    return Verdict(XidSeverity.UNKNOWN, Action.INVESTIGATE, f"SXid {code} detail line; {where}")


@cache
def _default_catalog() -> Catalog:
    return Catalog()


def lookup(xid: int) -> CatalogEntry | None:
    """The default catalog's entry for ``xid``, or None."""
    return _default_catalog().lookup(xid)


def decoded_verdict(xid: int, message: str, kind: str = "xid") -> str | None:
    """``Catalog.nvlink5_verdict`` of the default catalog for an XID 144-150 report; None
    for any other report (the verdict label of ``gpuwatchd_xid_nvlink5_decoded_total``)."""
    catalog = _default_catalog()
    if kind != "xid" or xid not in catalog._rules:
        return None
    return catalog.nvlink5_verdict(xid, message)


@cache
def message_judged_codes() -> frozenset[int]:
    """Codes a report of which is judged by its message (XIDs 144-150 and 154): an NVML
    event of one, which has no message, is worth waiting for its kernel line."""
    judged = MESSAGE_JUDGED_BUCKETS
    return frozenset(row.code for row in catalog_data.XIDS if row.immediate in judged)


def recovery_actions() -> tuple[RecoveryActionRow, ...]:
    """XID 154's recovery-action codes (NVML enum, workbook wording)."""
    return catalog_data.RECOVERY_ACTIONS


__all__ = [
    "FATAL_BUCKETS",
    "SXID_VERDICTS",
    "Action",
    "Catalog",
    "CatalogEntry",
    "NvlinkMatch",
    "RecoveryChange",
    "Verdict",
    "XidSeverity",
    "decoded_verdict",
    "lookup",
    "message_judged_codes",
    "nvlink5_registers",
    "parse_recovery_change",
    "recovery_actions",
    "sxid_verdict",
]
