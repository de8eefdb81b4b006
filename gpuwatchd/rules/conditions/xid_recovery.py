"""Recovery on evidence for ``xid`` rules (``recovery: evidence``).

A fault an ``xid`` rule fires on is followed per series (a GPU, or a GPU and code) until
there is evidence that the action it needs was taken, instead of resolving after a quiet
time alone:

- a node reboot: a boot id other than the one the fault's last XID came in;
- a GPU reset (or the reboot): seen through NVML after the last XID: the GPU stopped
  answering (lost, reset required) and answers again with a new handle, the driver's recovery
  action (field 230) went back to none, a pending row remap was applied, or the volatile ECC
  counters restarted; or the driver's XID 154 saying the recovery action went back to none;
- hardware inspection: nothing the node can show; the fault holds until the GPU is replaced
  (the alert book then resolves every alert of the board that left: ``AlertBook._replaced``).

While there is no evidence, the condition keeps holding (so the alert, and the drain that
follows it, stay) and the alert says what it waits for (``{recovery}``). The evaluation
that finds the evidence holds once more (``{recovery}`` then says what was seen), so the
alert resolves once the rule's ``quiet`` has passed after the evidence without the XID,
also when a reboot took longer than that.

The same XID coming back within ``escalate_within`` of a recovery climbs the ladder
GPU reset -> node reboot -> hardware inspection after ``escalate_after`` returns, and the
page says so (``{escalation}``, and the action). Faults are saved in the ``StateStore`` as
soon as they change (a reboot must not forget them) and restored at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.core.records import GpuStatus, XidEvent
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.snapshot import GpuView
from gpuwatchd.rules.store import MAX_RECOVERIES, RecoveryRecord, StateStore
from gpuwatchd.xid import catalog as xid_catalog

log = logging.getLogger(__name__)

RESET, REBOOT, INSPECTION = 0, 1, 2
STEP_NAMES = ("GPU reset", "node reboot", "hardware inspection")
WAITS = (
    "a GPU reset (NVML shows the GPU back with a new handle, the recovery action cleared, the "
    "pending row remap applied or the volatile ECC counters restarted) or a node reboot",
    "a node reboot (a new boot id)",
    "hardware inspection: a reset or a reboot does not clear it; replace the GPU",
)
ESCALATED_ACTIONS = (
    "",
    "Reboot the node: the XID came back after a GPU reset.",
    "Take the GPU out of service for hardware inspection (RMA): the XID came back after a "
    "node reboot.",
)

# What NVML showed of the GPU since the fault's last XID (``Fault.flags``).
SAW_DOWN = 1  # it stopped answering (lost, reset required): the next answer has a new handle
SAW_ACTION = 2  # the driver's recovery action was set
SAW_PENDING = 4  # a row remap was pending (it is applied by a reset)

ECC_VOLATILE = ("ecc_corrected_volatile", "ecc_uncorrected_volatile")
REBOOT_ACTIONS = frozenset({xid_catalog.Action.REBOOT_NODE, xid_catalog.Action.RESTART_VM})


@dataclass(frozen=True)
class RecoveryPolicy:
    """``recovery: evidence`` with its escalation: after ``escalate_after`` returns of the
    same XID within ``escalate_within`` of a recovery, the next rung of the ladder."""

    escalate_after: int = 1
    escalate_within: float = 7 * 86400.0


@dataclass(slots=True)
class Fault:
    """One followed fault (see ``RecoveryRecord`` for the fields)."""

    uuid: str
    xid: int
    codes: set[int]
    last: float
    boot_id: str
    step: int
    returns: int = 0
    recovered: float | None = None
    proof: str = ""
    flags: int = 0
    ecc: float | None = None
    base: int = RESET  # the rung the codes themselves need (not saved: the catalog says)
    values: dict[str, Any] = field(default_factory=dict)  # the last XID's template values

    def record(self) -> RecoveryRecord:
        return RecoveryRecord(
            self.uuid,
            self.xid,
            tuple(sorted(self.codes)),
            self.last,
            self.boot_id,
            self.step,
            self.returns,
            self.recovered,
            self.proof,
            self.flags,
            self.ecc,
        )


def base_step(catalog: xid_catalog.Catalog, code: int, message: str = "") -> int:
    """The rung a code needs by itself: a reboot for the catalog's reboot actions."""
    return REBOOT if catalog.classify(code, message).action in REBOOT_ACTIONS else RESET


def ecc_volatile(view: GpuView) -> float | None:
    s = view.sample
    if s is None:
        return None
    found = [s.fields[f] for f in ECC_VOLATILE if f in s.fields]
    return sum(found) if found else None


def look(
    fault: Fault, view: GpuView | None, boot_id: str, cleared: float | None = None
) -> str | None:
    """Evidence that the fault's action was taken (its words), or None; notes in
    ``fault.flags`` what NVML shows on the way. ``cleared``: when the driver last reported
    the GPU's recovery action back to none in the kernel log (XID 154)."""
    if fault.step <= REBOOT and boot_id not in ("", "unknown") and boot_id != fault.boot_id:
        return "the node rebooted (a new boot id)"
    if fault.step != RESET:
        return None
    if cleared is not None and cleared > fault.last:
        return "the driver reported its recovery action back to none (XID 154)"
    if view is None:
        return None
    if view.status in (GpuStatus.LOST, GpuStatus.ERROR):
        fault.flags |= SAW_DOWN
        return None
    s = view.sample
    if s is None or s.timestamp <= fault.last:
        return None  # nothing NVML said after the XID
    if fault.flags & SAW_DOWN:
        return "the GPU answers NVML again with a new handle after it stopped (a reset)"
    action = s.fields.get("recovery_action")
    if action:
        fault.flags |= SAW_ACTION
    elif action is not None and fault.flags & SAW_ACTION:
        return "the driver's recovery action went back to none"
    pending = s.fields.get("remapped_rows_pending")
    if pending:
        fault.flags |= SAW_PENDING
    elif pending is not None and fault.flags & SAW_PENDING:
        return "the pending row remap was applied (a reset applies it)"
    ecc = ecc_volatile(view)
    if ecc is not None:
        if fault.ecc is not None and ecc < fault.ecc:
            return "the volatile ECC counters restarted (a GPU reset or driver reload)"
        fault.ecc = ecc if fault.ecc is None else max(fault.ecc, ecc)
    return None


class Recoveries:
    """The faults one rule follows, keyed by (GPU uuid or ``pci:<bus id>``, code or -1)."""

    __slots__ = ("boot_id", "dirty", "faults", "policy", "rule", "store")

    def __init__(self, rule: str, policy: RecoveryPolicy) -> None:
        self.rule = rule
        self.policy = policy
        self.faults: dict[tuple[str, int], Fault] = {}
        self.store: StateStore | None = None
        self.boot_id = ""
        self.dirty = False

    # -- persistence ----------------------------------------------------------------------
    def restore(self, store: StateStore, catalog: xid_catalog.Catalog) -> None:
        self.store = store
        self.boot_id = store.boot_id
        records, bad = store.load_recoveries(self.rule)
        if bad:
            log.warning("rule %s: %d unreadable saved XID recoveries skipped", self.rule, bad)
        for r in records:
            codes = set(r.codes)
            base = max(base_step(catalog, c) for c in codes)
            self.faults[(r.uuid, r.xid)] = Fault(
                r.uuid, r.xid, codes, r.last, r.boot_id, r.step, r.returns, r.recovered,
                r.proof, r.flags, r.ecc, base,
            )  # fmt: skip

    def adopt(self, old: Recoveries) -> None:
        self.faults = old.faults
        self.store = old.store
        self.boot_id = old.boot_id

    def save(self) -> None:
        store = self.store
        if self.dirty and store is not None:
            self.dirty = not store.save_recoveries(
                self.rule, [f.record() for f in self.faults.values()]
            )

    # -- the faults -----------------------------------------------------------------------
    def on_xid(
        self,
        ident: str,
        key_xid: int,
        ev: XidEvent,
        view: GpuView | None,
        catalog: xid_catalog.Catalog,
        values: dict[str, Any],
    ) -> Fault:
        """A matching XID: a new fault, more of a waiting one, or one that came back."""
        base = base_step(catalog, ev.xid, ev.message)
        fault = self.faults.get((ident, key_xid))
        p = self.policy
        if fault is None or (
            fault.recovered is not None and ev.timestamp - fault.recovered > p.escalate_within
        ):
            fault = Fault(ident, key_xid, {ev.xid}, ev.timestamp, self.boot_id, base, base=base)
            self.faults[(ident, key_xid)] = fault
            self._bound()
        elif fault.recovered is not None:  # back after a recovery
            if ev.xid in fault.codes:
                fault.returns += 1
                if fault.returns >= p.escalate_after and fault.step < INSPECTION:
                    fault.step += 1
                    fault.returns = 0
            fault.codes.add(ev.xid)
            fault.recovered = None
            fault.proof = ""
        else:
            fault.codes.add(ev.xid)
        fault.base = max(fault.base, base)
        fault.step = max(fault.step, base)
        fault.last = max(fault.last, ev.timestamp)
        fault.boot_id = self.boot_id
        fault.flags = 0
        fault.ecc = ecc_volatile(view) if view is not None else None
        fault.values = values
        self.dirty = True
        return fault

    def _bound(self) -> None:
        """At most ``MAX_RECOVERIES`` faults: the oldest recovered ones go first."""
        excess = len(self.faults) - MAX_RECOVERIES
        if excess <= 0:
            return
        order = sorted(self.faults.items(), key=lambda kv: (kv[1].recovered is None, kv[1].last))
        for k, _ in order[:excess]:
            del self.faults[k]

    def check(
        self, fault: Fault, view: GpuView | None, now: float, cleared: float | None = None
    ) -> bool:
        """True when the fault is (now) recovered."""
        if fault.recovered is not None:
            return True
        before = (fault.flags, fault.ecc)
        proof = look(fault, view, self.boot_id, cleared)
        if proof is not None:
            fault.recovered = now
            fault.proof = proof
            self.dirty = True
            log.info(
                "rule %s: %s%s recovered: %s",
                self.rule,
                fault.uuid or "the node",
                f" XID {fault.xid}" if fault.xid >= 0 else "",
                proof,
            )
            return True
        if (fault.flags, fault.ecc) != before:
            self.dirty = True
        return False

    def forget(self, fault: Fault) -> None:
        if self.faults.pop((fault.uuid, fault.xid), None) is not None:
            self.dirty = True

    def expire(self, now: float) -> None:
        """Forget recovered faults whose return would no longer escalate."""
        limit = self.policy.escalate_within
        gone = [
            k
            for k, f in self.faults.items()
            if f.recovered is not None and now - f.recovered > limit
        ]
        for k in gone:
            del self.faults[k]
        if gone:
            self.dirty = True


def recovery_values(fault: Fault, quiet: float) -> dict[str, Any]:
    """``{recovery}``, ``{escalation}`` and, on a climbed ladder, ``{action}``."""
    codes = "/".join(str(c) for c in sorted(fault.codes))
    then = f"resolves after {format_duration(quiet)} without XID {codes}"
    out: dict[str, Any] = {
        "recovery": (
            f"recovered ({fault.proof}); {then}"
            if fault.recovered is not None
            else f"waiting for {WAITS[fault.step]}; then it {then}"
        ),
        "escalation": "",
        "recovery_step": STEP_NAMES[fault.step],
    }
    if fault.step > fault.base:
        came_after = STEP_NAMES[fault.step - 1]
        out["escalation"] = f" (back after a {came_after}: now needs {STEP_NAMES[fault.step]})"
        out["action"] = ESCALATED_ACTIONS[fault.step]
    return out
