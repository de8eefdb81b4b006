"""``xid``: XID events matched by code, catalog bucket, catalog severity or the fatal set.

``fatal: true`` selects the catalog's fatal set with the config's ``xid.overrides`` applied
(``Catalog.fatal_codes``); next to ``codes``, ``buckets`` or ``severities`` it narrows them
(``fatal: false``: only codes outside the fatal set), so a code an override moves into the
fatal set pages from the fatal rule alone. The NVLink5 XIDs 144-150 are judged per report,
by their decoded verdict (``Catalog.judged_fatal``): a message whose registers decode as
non-fatal is matched by ``fatal: false``, not by ``fatal: true``, whatever its code.
NVSwitch SXid reports are never matched (their codes are another numbering).
``episode_gap`` counts *episodes* instead of lines: the lines of one process (by pid, else
process name) on one GPU less than ``episode_gap`` apart are one episode, and another
process starts another, so one program printing a storm of XIDs counts once.
``recovery: evidence`` resolves a fault only after evidence that its action was taken (a
new boot id, a GPU reset seen through NVML) and climbs reset -> reboot -> inspection when the
same XID comes back (``xid_recovery``); the default ``quiet`` resolves after the quiet time.
``unclassified: true`` selects what nobody has classified: the catalog's codes without a
resolution bucket, and every code the catalog does not list (a driver newer than the
catalog) unless an override says what it is, so that no code goes unanswered.
``skip_node_wide: true`` leaves out node events: an XID whose code came on 3 or more GPUs
of the node within a minute (a driver, fabric, power or job event; ``xid_recurrence``'s
``signal: node`` raises it once). An XID is judged once a minute has passed since it, so
that the other GPUs' lines of the same event are in (the rule then runs on the periodic
tick: about a minute or two after the line).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.records import XidEvent
from gpuwatchd.core.units import format_duration
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.base import (
    ConditionKind,
    Evaluator,
    Hits,
    Key,
    Needs,
    Result,
    Trigger,
    model_of,
)
from gpuwatchd.rules.conditions.reading import BodyReader, hint
from gpuwatchd.rules.conditions.xid_recovery import Recoveries, RecoveryPolicy, recovery_values
from gpuwatchd.rules.model import Condition, Rule
from gpuwatchd.rules.snapshot import SeqXid, Snapshot
from gpuwatchd.rules.store import StateStore
from gpuwatchd.xid import catalog as xid_catalog
from gpuwatchd.xid import catalog_data
from gpuwatchd.xid.catalog import parse_recovery_change

RECOVERY_MODES = ("quiet", "evidence")
XID_RECOVERY_ACTION = 154
NODE_GPUS = 3  # GPUs with the same code within NODE_WINDOW that make a node event
NODE_WINDOW = 60.0
CATALOG_SEVERITIES = tuple(s.value for s in xid_catalog.XidSeverity)


def catalog_codes() -> frozenset[int]:
    return frozenset(row.code for row in catalog_data.XIDS)


def catalog_buckets() -> dict[str, frozenset[int]]:
    """Immediate resolution bucket -> the XID codes that have it."""
    out: dict[str, set[int]] = {}
    for row in catalog_data.XIDS:
        if row.immediate:
            out.setdefault(row.immediate, set()).add(row.code)
    return {k: frozenset(v) for k, v in out.items()}


def _investigatory_buckets() -> frozenset[str]:
    return frozenset(row.investigatory for row in catalog_data.XIDS if row.investigatory)


@dataclass(frozen=True)
class XidMatch(Condition):
    """XID events matched by code, catalog bucket or catalog severity."""

    codes: frozenset[int]
    count: int = 1
    window: float = 600.0
    quiet: float = 3600.0
    by_code: bool = False
    include_unknown_gpu: bool = True
    # Codes judged per report (XIDs 144-150), and which verdict the rule wants of them.
    judged: frozenset[int] = frozenset()
    fatal: bool | None = None
    unknown: bool = False  # also codes outside the catalog (and its overrides)
    episode_gap: float | None = None  # count episodes of one process, not lines
    recovery: RecoveryPolicy | None = None  # resolve on evidence (None: after quiet)
    skip_node_wide: bool = False  # leave out a code seen on NODE_GPUS GPUs within NODE_WINDOW

    def hold(self, keep_firing_for: float) -> float:
        return self.quiet


def count_episodes(events: list[XidEvent], gap: float) -> int:
    """Episodes among one GPU's ``events`` (in time order): the lines of one process (pid,
    else process name; lines naming neither are one process) less than ``gap`` apart."""
    last: dict[object, float] = {}
    episodes = 0
    for e in events:
        who: object = e.pid if e.pid is not None else e.process
        seen = last.get(who)
        if seen is None or e.timestamp - seen >= gap:
            episodes += 1
        last[who] = e.timestamp
    return episodes


def mig_text(ev: XidEvent) -> str:
    """``{mig}``: where on a MIG-split GPU the driver placed the report, or ""."""
    if ev.gpu_instance is None:
        return ""
    where = f" in MIG GPU instance {ev.gpu_instance}"
    if ev.compute_instance is not None:
        where += f", compute instance {ev.compute_instance},"
    return where


def xid_values(snap: Snapshot, ev: XidEvent, count: int) -> dict[str, Any]:
    """Template values for an XID: its text and what to do about it (config overrides apply)."""
    catalog = snap.catalog
    entry = catalog.lookup(ev.xid)
    verdict = catalog.classify(ev.xid, ev.message, ev.kind)
    text = entry.description if entry is not None else "not in NVIDIA's XID catalog"
    action = catalog.action_text(ev.xid, verdict)
    values: dict[str, Any] = {
        "xid": ev.xid,
        "xid_text": text,
        "action": action,
        "count": count,
        "mig": mig_text(ev),
    }
    if snap.gpu_of(ev) < 0 and ev.pci_bus_id:
        values["pci_bus_id"] = ev.pci_bus_id
    return values


def code_values(catalog: xid_catalog.Catalog, xid: int) -> dict[str, Any]:
    """Template values for a code seen without one message to read (an episode, a node
    event): its text and what to do about it, the config's overrides applied."""
    entry = catalog.lookup(xid)
    text = entry.description if entry is not None else "not in NVIDIA's XID catalog"
    return {"xid_text": text, "action": catalog.action_text(xid, catalog.classify(xid))}


def action_cleared(snap: Snapshot, after: int, into: dict[int, float]) -> None:
    """Note in ``into`` (GPU index -> time) the XID 154s numbered above ``after`` whose
    recovery action went back to none (``... from 0x1 (GPU Reset Required) to 0x0
    (None)``): the driver saying the GPU recovered. Only new XIDs are read, so a long
    wait costs nothing per evaluation however many XIDs the log holds."""
    for ev in snap.xids.newest_first(after):
        if ev.xid != XID_RECOVERY_ACTION or ev.kind == "sxid":
            continue
        change = parse_recovery_change(ev.message)
        if change is not None and change.after == 0 and change.before != 0:
            index = snap.gpu_of(ev)
            into[index] = max(into.get(index, ev.timestamp), ev.timestamp)


class _Evaluator(Evaluator):
    __slots__ = ("adopted", "c", "cleared", "cleared_seq", "cursor", "recoveries")

    def __init__(self, rule: Rule, snap: Snapshot) -> None:
        super().__init__(rule)
        self.c = model_of(rule, XidMatch)
        self.cursor = snap.xids.seq  # XIDs numbered above this are new to the rule
        policy = self.c.recovery
        self.recoveries = Recoveries(rule.name, policy) if policy is not None else None
        self.adopted = False
        # GPU index -> time of its newest XID 154 back to none; the log number read up to
        self.cleared: dict[int, float] = {}
        self.cleared_seq = 0

    def adopt(self, old: Evaluator) -> None:
        if isinstance(old, _Evaluator):
            self.cursor = old.cursor
            self.cleared, self.cleared_seq = old.cleared, old.cleared_seq
            if self.recoveries is not None and old.recoveries is not None:
                self.recoveries.adopt(old.recoveries)
                self.adopted = True

    def restore(self, store: StateStore, snap: Snapshot, now: float) -> None:
        if self.recoveries is not None and not self.adopted:
            self.recoveries.restore(store, snap.catalog)

    def save(self, store: StateStore, now: float) -> None:
        if self.recoveries is not None:
            self.recoveries.save()

    def evaluate(self, snap: Snapshot, now: float, active: bool, fresh: bool) -> Result:
        hits = self._new_hits(snap, now)
        if self.recoveries is not None:
            self._follow(self.recoveries, snap, hits, now)
        return hits, set()

    def _follow(self, rec: Recoveries, snap: Snapshot, hits: Hits, now: float) -> None:
        """Recovery on evidence: new hits start or feed faults; a fault without evidence
        of its recovery keeps holding and says what it waits for."""
        for key, (_, values) in hits.items():
            ev = values.pop("_event", None) if values is not None else None
            if values is None or not isinstance(ev, XidEvent):
                continue
            view = snap.by_index.get(key[0])
            rec.on_xid(self._ident(snap, key[0], ev), key[2], ev, view, snap.catalog, values)
        cleared = self.cleared
        action_cleared(snap, self.cleared_seq, cleared)
        self.cleared_seq = snap.xids.seq
        for fault in list(rec.faults.values()):
            if fault.recovered is not None:
                continue
            index = snap.by_uuid.get(fault.uuid, -1) if fault.uuid.startswith("GPU-") else -1
            if fault.uuid.startswith("GPU-") and index < 0:
                # the GPU is not (yet) there: its alert holds where it is; a fault of a GPU
                # gone for longer than a return would count is forgotten (it was replaced)
                if now - fault.last > rec.policy.escalate_within:
                    rec.forget(fault)
                continue
            view = snap.by_index.get(index)
            # The evaluation that finds the evidence still holds (once): the alert's quiet
            # time counts from the evidence, also after a reboot that took longer than it.
            rec.check(fault, view, now, cleared.get(index))
            key = (index, -1, fault.xid)
            found = hits.get(key)
            values = dict(found[1] or {}) if found is not None else dict(fault.values)
            if not values:
                code = min(fault.codes)
                values = {"xid": code, "count": 1, "mig": "", **code_values(snap.catalog, code)}
            values.update(recovery_values(fault, self.c.quiet))
            hits[key] = (found[0] if found is not None else float(values.get("count", 1)), values)
        rec.expire(now)
        rec.save()

    @staticmethod
    def _ident(snap: Snapshot, index: int, ev: XidEvent) -> str:
        view = snap.by_index.get(index)
        if view is not None and view.info.uuid:
            return view.info.uuid
        return f"pci:{(ev.pci_bus_id or '').upper()}" if ev.pci_bus_id else ""

    def _new_hits(self, snap: Snapshot, now: float) -> Hits:
        c = self.c
        log = snap.xids
        cursor, self.cursor = self.cursor, log.seq
        hits: Hits = {}
        if cursor >= log.seq:
            return hits
        upto = log.seq
        if c.skip_node_wide:
            upto = self.cursor = _settled(log.events, cursor, now)
            if upto <= cursor:
                return hits
        allowed: set[int] | None = None
        if self.rule.select is not None:
            allowed = {g.index for g in snap.selected(self.rule)}
        codes = c.codes
        judged, fatal, catalog = c.judged, c.fatal, snap.catalog

        unknown = c.unknown

        def wanted(e: XidEvent) -> bool:
            if e.kind == "sxid":
                return False
            if c.skip_node_wide and node_event(snap, e):
                return False
            if e.xid not in codes:
                return unknown and not catalog.knows(e.xid)
            return e.xid not in judged or catalog.judged_fatal(e.xid, e.message) == fatal

        latest: dict[Key, XidEvent] = {}
        for x in reversed(log.events):
            if x.seq <= cursor:
                break
            if x.seq > upto:
                continue  # not yet settled: judged at a later look
            ev = x.event
            if not wanted(ev):
                continue
            key = (snap.gpu_of(ev), -1, ev.xid if c.by_code else -1)
            if allowed is not None and key[0] not in allowed:
                continue
            latest.setdefault(key, ev)
        if not latest:
            return hits
        for key, ev in latest.items():
            # The window ends at the newest event, not at ``now``: an XID that reaches the
            # engine later than its own time (a slow poll, a late log line) still counts.
            start = min(now, ev.timestamp) - c.window
            matching = [
                x.event
                for x in log.events
                if x.event.timestamp >= start
                and (not c.by_code or x.event.xid == key[2])
                and wanted(x.event)
                and snap.gpu_of(x.event) == key[0]
            ]
            gap = c.episode_gap
            count = len(matching) if gap is None else count_episodes(matching, gap)
            if count >= c.count:
                values = xid_values(snap, ev, count)
                if self.recoveries is not None:
                    values["_event"] = ev
                hits[key] = (float(count), values)
        return hits


def _settled(events: Iterable[SeqXid], cursor: int, now: float) -> int:
    """The log number up to which the events after ``cursor`` are a minute old or more:
    judged now; the rest waits for the other GPUs' lines of the same event."""
    upto = cursor
    for x in events:
        if x.seq <= cursor:
            continue
        if x.event.timestamp > now - NODE_WINDOW:
            break
        upto = x.seq
    return upto


def node_event(snap: Snapshot, ev: XidEvent) -> bool:
    """The same code on ``NODE_GPUS`` or more GPUs within ``NODE_WINDOW`` of ``ev``."""
    gpus = set()
    for x in snap.xids.events:
        e = x.event
        if e.xid == ev.xid and e.kind != "sxid" and abs(e.timestamp - ev.timestamp) <= NODE_WINDOW:
            gpus.add(snap.gpu_of(e))
            if len(gpus) >= NODE_GPUS:
                return True
    return False


class XidKind(ConditionKind):
    key = "xid"
    keys = (
        "codes",
        "buckets",
        "severities",
        "unclassified",
        "fatal",
        "count",
        "window",
        "quiet",
        "by_code",
        "episode_gap",
        "recovery",
        "escalate_after",
        "escalate_within",
        "skip_node_wide",
    )
    placeholders = frozenset(
        {
            "xid",
            "xid_text",
            "action",
            "count",
            "window",
            "mig",
            "recovery",
            "escalation",
            "recovery_step",
        }
    )
    not_with: ClassVar[Mapping[str, str]] = {
        "keep_firing_for": "an xid rule resolves after condition.xid.quiet; set that instead",
        "for": (
            "an xid rule fires on the event itself; use condition.xid.count and window to "
            "ask for repeats"
        ),
        "when": (
            "not available for xid rules (it needs the GPU's latest sample, which a lost "
            "GPU does not have)"
        ),
    }

    def parse(
        self, p: BodyReader, body: Node, keys: dict[str, Node], what: str
    ) -> Condition | None:
        selectors = ("codes", "buckets", "severities", "unclassified")
        if not any(k in keys for k in (*selectors, "fatal")):
            p.error(
                body,
                f"{what}: needs at least one of codes, buckets, severities, unclassified, fatal",
            )
            return None
        r = p.r
        known = catalog_codes()
        buckets = catalog_buckets()
        codes: set[int] = set()
        if "codes" in keys:
            for item in r.sequence(keys["codes"], f"{what}.codes") or []:
                code = r.integer(item, f"{what}.codes", minimum=0, maximum=999_999)
                if code is None:
                    continue
                if code not in known:
                    near = sorted(known, key=lambda c: abs(c - code))[:3]
                    p.error(
                        item,
                        f"{what}.codes: XID {code} is not in NVIDIA's XID catalog "
                        f"(nearest known: {', '.join(map(str, sorted(near)))})",
                    )
                    continue
                codes.add(code)
        if "buckets" in keys:
            for text, item in p.strings(keys["buckets"], f"{what}.buckets"):
                members = buckets.get(text)
                if members is None:
                    if text in _investigatory_buckets():
                        why = (
                            "is only an investigatory bucket; buckets match the catalog's "
                            "immediate resolution"
                        )
                    else:
                        why = "is not an immediate resolution bucket of the XID catalog"
                        why += hint(text, buckets)
                    p.error(
                        item,
                        f"{what}.buckets: {text!r} {why} (one of: {', '.join(sorted(buckets))})",
                    )
                    continue
                codes |= members
        if "severities" in keys:
            for text, item in p.strings(keys["severities"], f"{what}.severities"):
                if text not in CATALOG_SEVERITIES:
                    p.error(
                        item,
                        f"{what}.severities: {text!r} is not a catalog severity (one of "
                        f"{', '.join(CATALOG_SEVERITIES)}){hint(text, CATALOG_SEVERITIES)}",
                    )
                    continue
                for entry in p.catalog:  # the config's xid.overrides apply
                    if entry.severity.value == text:
                        codes.add(entry.xid)
        fatal: bool | None = None
        judged: frozenset[int] = frozenset()
        unknown = p.boolean(keys, "unclassified", what, False)
        if unknown:
            codes |= p.catalog.unbucketed_codes()
        if "fatal" in keys:
            fatal = r.boolean(keys["fatal"], f"{what}.fatal")
            if fatal is None:
                return None
            in_set = p.catalog.fatal_codes()  # the config's xid.overrides apply
            by_verdict = p.catalog.verdict_codes()  # judged per report (144-150)
            if not any(k in keys for k in selectors):
                codes = set(in_set) if fatal else set(catalog_codes() - in_set)
                codes |= by_verdict
            else:
                codes = {c for c in codes if c in by_verdict or (c in in_set) == fatal}
            judged = frozenset(codes & by_verdict)
        count = 1
        if "count" in keys:
            count = r.integer(keys["count"], f"{what}.count", minimum=1, maximum=10000) or 1
        window = 600.0
        if "window" in keys:
            window = p.window(keys["window"], f"{what}.window") or window
        quiet = 3600.0
        if "quiet" in keys:
            quiet = p.window(keys["quiet"], f"{what}.quiet") or quiet
        by_code = p.boolean(keys, "by_code", what, False)
        episode_gap: float | None = None
        if "episode_gap" in keys:
            episode_gap = p.window(keys["episode_gap"], f"{what}.episode_gap")
        recovery = self._recovery(p, keys, what)
        skip_node_wide = p.boolean(keys, "skip_node_wide", what, False)
        if not codes and not unknown:
            p.error(body, f"{what}: matches no XID code")
            return None
        return XidMatch(
            frozenset(codes),
            count,
            window,
            quiet,
            by_code,
            judged=judged,
            fatal=fatal,
            unknown=unknown,
            episode_gap=episode_gap,
            recovery=recovery,
            skip_node_wide=skip_node_wide,
        )

    @staticmethod
    def _recovery(p: BodyReader, keys: dict[str, Node], what: str) -> RecoveryPolicy | None:
        r = p.r
        mode = "quiet"
        if "recovery" in keys:
            mode = r.string(keys["recovery"], f"{what}.recovery", RECOVERY_MODES) or "quiet"
        for name in ("escalate_after", "escalate_within"):
            if name in keys and mode != "evidence":
                p.error(keys[name], f"{what}.{name}: only with recovery: evidence")
        if mode != "evidence":
            return None
        after = 1
        if "escalate_after" in keys:
            after = (
                r.integer(keys["escalate_after"], f"{what}.escalate_after", minimum=1, maximum=100)
                or 1
            )
        within = 7 * 86400.0
        if "escalate_within" in keys:
            within = p.window(keys["escalate_within"], f"{what}.escalate_within") or within
        return RecoveryPolicy(after, within)

    def schema(self) -> sp.Schema:
        out = sp.body(
            {
                "codes": {
                    "type": "array",
                    "items": {"type": "integer", "minimum": 0},
                    "minItems": 1,
                },
                "buckets": sp.enum_list(sorted(catalog_buckets())),
                "severities": sp.enum_list(CATALOG_SEVERITIES),
                "unclassified": {
                    "type": "boolean",
                    "description": "true: codes the catalog gives no resolution bucket, and "
                    "codes it does not list at all (unless xid.overrides names them).",
                },
                "fatal": {
                    "type": "boolean",
                    "description": "true: the fatal set (catalog buckets that take the GPU "
                    "out of service, with xid.overrides' fatal applied); false: codes outside "
                    "it. Next to codes, buckets or severities it narrows them.",
                },
                "count": {"type": "integer", "minimum": 1, "default": 1},
                "window": sp.duration("10m"),
                "quiet": sp.duration("1h"),
                "by_code": {"type": "boolean", "default": False},
                "episode_gap": {
                    **sp.duration(),
                    "description": "Count episodes, not lines: one process's lines on one GPU "
                    "less than this apart are one episode; another process is another.",
                },
                "recovery": {
                    "enum": list(RECOVERY_MODES),
                    "default": "quiet",
                    "description": "quiet: resolve after quiet without the XID. evidence: "
                    "also only after evidence of the action (a new boot id for a node reboot, "
                    "a GPU reset seen through NVML); the same XID back after a recovery climbs "
                    "reset -> reboot -> hardware inspection.",
                },
                "escalate_after": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 100,
                    "default": 1,
                    "description": "recovery: evidence: returns of the same XID after a "
                    "recovery before the next rung of the ladder.",
                },
                "escalate_within": {
                    **sp.duration("7d"),
                    "description": "recovery: evidence: how long after a recovery a return "
                    "of the XID counts.",
                },
                "skip_node_wide": {
                    "type": "boolean",
                    "default": False,
                    "description": "Leave out node events: a code on 3 or more GPUs within "
                    "a minute. XIDs are judged a minute after they came (periodic).",
                },
            },
            "XID events matched by code, the catalog's immediate resolution bucket, catalog "
            "severity or the fatal set; count in window; resolves after quiet.",
        )
        out["anyOf"] = [
            {"required": ["codes"]},
            {"required": ["buckets"]},
            {"required": ["severities"]},
            {"required": ["unclassified"]},
            {"required": ["fatal"]},
        ]
        return out

    def evaluator(self, rule: Rule, snap: Snapshot) -> Evaluator:
        return _Evaluator(rule, snap)

    def needs(self, c: Condition) -> Needs:
        assert isinstance(c, XidMatch)
        return Needs(xid_window=c.window)

    def trigger(self, c: Condition) -> Trigger:
        assert isinstance(c, XidMatch)
        return "periodic" if c.skip_node_wide else "xid"

    def values(self, c: Condition) -> dict[str, Any]:
        assert isinstance(c, XidMatch)
        return {"window": format_duration(c.window)}


KIND = XidKind()
