"""``drain.mode: slurm``: ``scontrol update NodeName=N State=DRAIN Reason="gpuwatchd: ..."``
after reading the node with ``sinfo``; another owner's drain or down is never overwritten:
following NHC, gpuwatchd appends its reason to a drain's (``NHC: ...; gpuwatchd: ...``) and
drains again if the other owner resumes while the incident is active (``hold``); resume only
clears a drain whose reason carries the ``gpuwatchd:`` prefix, or takes gpuwatchd's note off
another owner's reason. The fleet budget's Slurm census (``SlurmFleetView``) and the claim
and mark writers live here too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuwatchd.actions.drain.drivers.base import (
    DrainError,
    DrainResult,
    Driver,
    Gate,
    run_argv,
    tail_text,
)
from gpuwatchd.actions.fleet import CLAIM_PREFIX, MARK_PREFIX, Census, Claim, FleetDrain, Mark
from gpuwatchd.actions.model import REASON_PREFIX
from gpuwatchd.config.actions import (
    DrainConfig,
    DriverSection,
    DriverSectionReader,
    FleetDrainConfig,
    read_driver_section,
    read_program,
)
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.clock import Clock

# -- Slurm ---------------------------------------------------------------------------------
_OFFLINE_WORDS = ("drain", "down", "fail", "maint", "reboot", "power_down", "powered_down")


@dataclass(frozen=True)
class SlurmNode:
    state: str  # sinfo %T, lower case, flags stripped: idle, drained, draining, down, ...
    reason: str  # "" when Slurm says none

    @property
    def offline(self) -> bool:
        return any(w in self.state for w in _OFFLINE_WORDS)

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)

    @property
    def down(self) -> bool:
        return any(w in self.state for w in ("down", "fail"))

    def without_our_note(self) -> str | None:
        """Another owner's reason with gpuwatchd's note taken off (None: no note there)."""
        at = self.reason.find(NOTE_SEPARATOR + REASON_PREFIX)
        return self.reason[:at] if at > 0 else None


NOTE_SEPARATOR = "; "
REASON_MAX = 250
COMMENT_MAX = 250
COMMENT_FRESH = 5.0  # seconds a census's Comment of a node is used for a write


def _slurm_time(text: str) -> float | None:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def put_claim(
    scontrol: str,
    sinfo: str,
    timeout: float,
    node: str,
    claim: Claim | None,
    known: str | None = None,
) -> None:
    """Write ``node``'s claim into its Comment (None: take ours off), keeping any text
    another owner put before it. ``known``: the Comment as just read (None: read it)."""
    if known is None:
        known = _comment(sinfo, timeout, node)
    at = known.rfind(CLAIM_PREFIX)
    if claim is None and at < 0:
        return  # nothing of ours there
    theirs = (known[:at] if at >= 0 else known).rstrip().removesuffix(";").rstrip()
    text = claim.text if claim is not None else ""
    if theirs:
        keep = COMMENT_MAX - len(text) - len(NOTE_SEPARATOR)
        text = theirs[:keep] + (NOTE_SEPARATOR + text if text else "")
    res = run_argv([scontrol, "update", f"NodeName={node}", f"Comment={text}"], timeout=timeout)
    if res.returncode != 0:
        raise DrainError(
            f"scontrol update Comment failed (status {res.returncode}): {tail_text(res.stderr)}"
        )


def _comment(sinfo: str, timeout: float, node: str) -> str:
    res = run_argv(
        [sinfo, "--noheader", "--Node", "--nodes", node, "--Format", "Comment:0"],
        timeout=timeout,
    )
    if res.returncode != 0:
        raise DrainError(f"sinfo failed (status {res.returncode}): {tail_text(res.stderr)}")
    return "" if res.stdout.strip() == "(null)" else res.stdout.strip()


def put_mark(
    scontrol: str,
    sinfo: str,
    timeout: float,
    node: str,
    mark: Mark | None,
    known: str | None = None,
) -> None:
    """Put a fleet-wide stop into ``node``'s Comment (None: take ours off), before any
    claim and after any text of another owner."""
    text = _comment(sinfo, timeout, node) if known is None else known
    at_claim = text.rfind(CLAIM_PREFIX)
    claim = text[at_claim:] if at_claim >= 0 else ""
    rest = text[:at_claim] if at_claim >= 0 else text
    at_mark = rest.find(MARK_PREFIX)
    if mark is None and at_mark < 0:
        return
    theirs = (rest[:at_mark] if at_mark >= 0 else rest).rstrip().removesuffix(";").rstrip()
    parts = [p for p in (theirs, mark.text if mark else "", claim) if p]
    new = NOTE_SEPARATOR.join(parts)[-COMMENT_MAX:]
    res = run_argv([scontrol, "update", f"NodeName={node}", f"Comment={new}"], timeout=timeout)
    if res.returncode != 0:
        raise DrainError(
            f"scontrol update Comment failed (status {res.returncode}): {tail_text(res.stderr)}"
        )


class SlurmFleetView:
    """The fleet as Slurm's controller sees it. Claims live in each node's ``Comment``
    (kept by slurmctld, ignored by scheduling), after any text another owner put there.

    A cheap census (``full=False``: drains only) asks ``sinfo --list-reasons``, which lists
    only the nodes that are down or drained, plus a count of node names; a full census
    (every node's claim) reads every node once. ``put`` writes a node's claim, given the
    Comment the last census read if still fresh: scontrol in ``slurm`` mode
    (``put_claim``), the root drain helper in ``exec`` mode."""

    exclusive = False

    def __init__(
        self,
        sinfo: str,
        timeout: float,
        partition: str | None,
        put: Callable[[str, Claim | None, str | None], None] | None = None,
        mark: Callable[[str, Mark | None, str | None], None] | None = None,
    ) -> None:
        self.sinfo = sinfo
        self.timeout = timeout
        self.partition = partition
        self.put = put
        self.mark = mark
        # the Comment per node as the last census read it, and when (monotonic): a write
        # keeps another owner's text, read again when older than COMMENT_FRESH
        self._comments: dict[str, str] = {}
        self._read_at = -math.inf

    def reserve(
        self, node: str, limit: int, census: Census, reason: str
    ) -> tuple[bool, tuple[FleetDrain, ...]]:
        raise NotImplementedError("Slurm's budget is kept by claims")

    def release(self, node: str) -> None:
        self.write_claim(node, None)

    def write_claim(self, node: str, claim: Claim | None) -> None:
        if self.put is None:
            raise DrainError("drain.fleet: this drain mode cannot write a claim")
        fresh = time.monotonic() - self._read_at <= COMMENT_FRESH
        known = self._comments.get(node) if fresh else None
        self.put(node, claim, known)
        self._comments.pop(node, None)

    def write_mark(self, node: str, mark: Mark | None) -> None:
        if self.mark is None:
            raise DrainError("drain.fleet: this drain mode cannot stop the fleet")
        fresh = time.monotonic() - self._read_at <= COMMENT_FRESH
        self.mark(node, mark, self._comments.get(node) if fresh else None)
        self._comments.pop(node, None)

    def _sinfo(self, *args: str) -> str:
        argv = [self.sinfo, "--noheader", *args]
        if self.partition:
            argv[1:1] = ["--partition", self.partition]
        res = run_argv(argv, timeout=self.timeout)
        if res.returncode != 0:
            raise DrainError(f"sinfo failed (status {res.returncode}): {tail_text(res.stderr)}")
        return res.stdout

    def census(self, full: bool = True) -> Census:
        """Every node's (or, not full, every down or drained node's) state, reason time,
        Comment and reason. A reason or a Comment is free text and may hold newlines (and
        anything that looks like a line of ``sinfo`` output): records and fields are
        therefore split on tokens drawn at random for this census, which no text can
        carry, never on lines."""
        rec = f"@gw{os.urandom(12).hex()}@"
        sep = f"@gf{os.urandom(12).hex()}@"
        fields = ",".join(
            f"{name}:0{sep}" for name in ("NodeList", "StateLong", "Timestamp", "Comment")
        )
        out = self._sinfo(*(() if full else ("--list-reasons",)), "--Node", "--Format",
                          f"{fields},Reason:0{rec}")  # fmt: skip
        nodes: dict[str, SlurmNode] = {}
        stamps: dict[str, str] = {}
        claims: list[Claim] = []
        marks: list[Mark] = []
        self._comments = {}
        self._read_at = time.monotonic()
        for record in out.split(rec)[:-1]:
            parts = record.lstrip("\n").split(sep, 4)
            if len(parts) != 5 or not parts[0].strip():
                continue
            name, state, stamp, comment, reason = (p.strip() for p in parts)
            nodes[name] = SlurmNode(
                state.lower().rstrip("*~#!%$@^-+"), "" if reason.lower() == "none" else reason
            )
            stamps[name] = stamp  # parsed only for gpuwatchd's drains (strptime is slow)
            comment = "" if comment == "(null)" else comment
            self._comments[name] = comment
            claim = Claim.parse(name, comment)
            if claim is not None:
                claims.append(claim)
            mark = Mark.parse(name, comment)
            if mark is not None:
                marks.append(mark)
        drains = tuple(
            FleetDrain(name, _slurm_time(stamps[name]), n.reason)
            for name, n in sorted(nodes.items())
            if n.offline and n.ours
        )
        if full:
            return Census(len(nodes), drains, tuple(claims), marks=tuple(marks))
        names = {ln.strip() for ln in self._sinfo("--Node", "--Format", "NodeList:0").split()}
        return Census(len(names), drains, tuple(claims), full=False, marks=tuple(marks))


class SlurmDriver:
    """Drains through ``scontrol``; reads with ``sinfo``. Both inherit ``SLURM_CONF``."""

    mode = "slurm"
    reads_state = True

    def __init__(self, node: str, timeout: float, scontrol: str = "scontrol", sinfo: str = "sinfo"):
        self.node = node
        self.timeout = timeout
        self.scontrol = scontrol
        self.sinfo = sinfo

    def read(self) -> SlurmNode:
        res = run_argv(
            [self.sinfo, "--noheader", "--Node", "--nodes", self.node, "--format", "%T|%E"],
            timeout=self.timeout,
        )
        if res.returncode != 0:
            raise DrainError(f"sinfo failed (status {res.returncode}): {tail_text(res.stderr)}")
        lines = [ln for ln in res.stdout.splitlines() if "|" in ln]
        if not lines:
            raise DrainError(f"sinfo does not know node {self.node!r}")
        state, _, reason = lines[0].partition("|")
        state = state.strip().lower().rstrip("*~#!%$@^-+")
        reason = reason.strip()
        return SlurmNode(state, "" if reason.lower() == "none" else reason)

    def _update(self, *fields: str) -> None:
        res = run_argv(
            [self.scontrol, "update", f"NodeName={self.node}", *fields], timeout=self.timeout
        )
        if res.returncode != 0:
            raise DrainError(
                f"scontrol update failed (status {res.returncode}): {tail_text(res.stderr)}"
            )

    def fleet_view(self, cfg: FleetDrainConfig) -> SlurmFleetView:
        def put(node: str, claim: Claim | None, known: str | None) -> None:
            put_claim(self.scontrol, self.sinfo, self.timeout, node, claim, known)

        def mark(node: str, what: Mark | None, known: str | None) -> None:
            put_mark(self.scontrol, self.sinfo, self.timeout, node, what, known)

        return SlurmFleetView(self.sinfo, self.timeout, cfg.partition, put, mark)

    def _note(self, node: SlurmNode, reason: str, dry_run: bool) -> DrainResult:
        """The node is out of service for another owner: keep their reason, add ours (NHC's
        convention: never clobber another note; a down node and one with no note are left
        alone)."""
        why = node.reason or "no reason given"
        if node.down or not node.reason:
            return DrainResult(
                "kept_admin", f"node is {node.state} for another reason ({why}); left as is"
            )
        if REASON_PREFIX in node.reason:
            return DrainResult(
                "already", f"node is {node.state}; gpuwatchd's note is there already"
            )
        if dry_run:
            return DrainResult(
                "kept_admin",
                f"node is {node.state} for another reason ({why}); would add gpuwatchd's reason",
            )
        text = (node.reason + NOTE_SEPARATOR + reason)[:REASON_MAX]
        self._update(f"Reason={text}")
        return DrainResult(
            "noted", f"node is {node.state} for another reason ({why}); gpuwatchd's reason added"
        )

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        node = self.read()
        if node.offline:
            if node.ours or REASON_PREFIX in node.reason:
                return None
            res = self._note(node, reason, False)
            return res if res.result == "noted" else None
        # Someone put the node back in service while the fault is still active.
        refusal = gate() if gate is not None else None
        if refusal:
            return DrainResult("over_budget", refusal)
        self._update("State=DRAIN", f"Reason={reason}")
        return DrainResult(
            "reasserted",
            f"node was put back in service ({node.state}) while the fault is active; drained again",
        )

    def drain(
        self, incident: Mapping[str, Any], reason: str, dry_run: bool, *, gate: Gate | None = None
    ) -> DrainResult:
        node = self.read()
        if node.offline and node.ours:
            return DrainResult("already", f"node is {node.state} by gpuwatchd: {node.reason}")
        if node.offline:
            return self._note(node, reason, dry_run)
        refusal = gate() if gate is not None else None
        if refusal:
            return DrainResult("over_budget", refusal)
        if dry_run:
            return DrainResult(
                "dry_run",
                f"would run scontrol update NodeName={self.node} State=DRAIN Reason={reason!r}",
            )
        self._update("State=DRAIN", f"Reason={reason}")
        after = self.read()
        if not after.ours:
            return DrainResult(
                "kept_admin",
                f"after our drain the reason is {after.reason!r} (changed by someone else)",
            )
        return DrainResult("drained", f"scontrol: {after.state}, Reason={after.reason}")

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        node = self.read()
        if not node.offline:
            return DrainResult("not_drained", f"node is {node.state}; nothing to resume")
        if not node.ours:
            theirs = node.without_our_note()
            if theirs is None:
                return DrainResult(
                    "not_ours",
                    f"node is {node.state} for another reason ({node.reason or 'none'}); "
                    "left as is",
                )
            if dry_run:
                return DrainResult("dry_run", f"would take gpuwatchd's note off {node.reason!r}")
            self._update(f"Reason={theirs}")
            return DrainResult(
                "unnoted", f"gpuwatchd's note taken off; node stays {node.state} ({theirs})"
            )
        if dry_run:
            return DrainResult(
                "dry_run", f"would run scontrol update NodeName={self.node} State=RESUME"
            )
        self._update("State=RESUME")
        return DrainResult("resumed", f"cleared drain {node.reason!r}")

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SlurmDrainConfig(DriverSection):
    """``drain.slurm``: the Slurm programs (names on ``PATH`` or absolute paths)."""

    scontrol: str = "scontrol"
    sinfo: str = "sinfo"


def _read_section(r: Reader, node: Node, what: str) -> SlurmDrainConfig:
    def value(r: Reader, key: str, node: Node, where: str) -> Any:
        return read_program(r, node, where)  # scontrol, sinfo

    return read_driver_section(r, node, SlurmDrainConfig, what, value)


class SlurmKind:
    mode = "slurm"
    reader = DriverSectionReader(SlurmDrainConfig, _read_section)

    def build(self, cfg: DrainConfig, node: str, clock: Clock) -> Driver:
        section = cfg.section("slurm", SlurmDrainConfig)
        return SlurmDriver(node, cfg.timeout, section.scontrol, section.sinfo)


KIND = SlurmKind()
