"""Drain drivers: what "drain the node" and "resume it" mean for each scheduler.

A driver answers ``drain(incident, reason, dry_run)`` and ``resume(incident, dry_run)`` with a
``DrainResult`` or raises ``DrainError`` (retried by the controller). Commands run from
argv lists, never through a shell, with a timeout that kills the whole process group.

``exec``   runs a site command with a documented environment.
``slurm``  ``scontrol update NodeName=N State=DRAIN Reason="gpuwatchd: ..."`` after reading the
           node with ``sinfo``; an admin's drain or down is never overwritten; resume only
           clears a drain whose reason carries the ``gpuwatchd:`` prefix.
``kubernetes`` lives in ``kube.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuwatchd.actions.model import REASON_PREFIX, xid_of
from gpuwatchd.core.errors import GpuwatchdError


class DrainError(GpuwatchdError):
    """A drain or resume attempt failed; it may succeed if tried again."""


@dataclass(frozen=True)
class DrainResult:
    result: str  # drained | already | kept_admin | dry_run | resumed | not_ours | not_drained
    detail: str = ""

    @property
    def counts(self) -> bool:
        """Whether this counts against drain.max_drains (a drain happened, or would have)."""
        return self.result in ("drained", "dry_run")

    @property
    def owns(self) -> bool:
        """Whether gpuwatchd now owns the node's drain (and may resume it)."""
        return self.result in ("drained", "already")


class Driver(Protocol):
    mode: str
    # True: it reads the scheduler's view of the node before acting (slurm, kubernetes);
    # False: it cannot (exec), so gpuwatchd's own record of its drain decides.
    reads_state: bool

    def drain(self, incident: Mapping[str, Any], reason: str, dry_run: bool) -> DrainResult: ...

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


def run_argv(
    argv: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
) -> RunResult:
    """Run ``argv`` (no shell) in its own process group; kill the group on timeout."""
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            text=True,
            errors="replace",
        )
    except OSError as exc:
        raise DrainError(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise DrainError(f"{argv[0]} did not finish within {timeout:g}s (killed)") from None
    return RunResult(proc.returncode, out, err)


def _tail(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else "..." + text[-n:]


def incident_env(
    action: str, node: str, incident: Mapping[str, Any] | None, reason: str
) -> dict[str, str]:
    """The documented GPUWATCHD_* environment of exec hooks and the notify command."""
    env = {"GPUWATCHD_ACTION": action, "GPUWATCHD_NODE": node, "GPUWATCHD_REASON": reason}
    if incident is not None:
        rec = incident["record"]
        labels = rec.get("labels") or {}
        env.update(
            {
                "GPUWATCHD_GPU": str(labels.get("gpu", "")),
                "GPUWATCHD_UUID": str(labels.get("uuid", "")),
                "GPUWATCHD_PCI_BUS_ID": str(labels.get("pci_bus_id", "")),
                "GPUWATCHD_XID": xid_of(rec) or "",
                "GPUWATCHD_RULE": str(rec.get("rule", "")),
                "GPUWATCHD_SEVERITY": str(rec.get("severity", "")),
                "GPUWATCHD_INCIDENT": str(incident.get("key", "")),
            }
        )
    return env


class ExecDriver:
    mode = "exec"
    reads_state = False

    def __init__(self, command: Sequence[str], node: str, timeout: float) -> None:
        self.command = list(command)
        self.node = node
        self.timeout = timeout

    def _run(self, action: str, incident: Mapping[str, Any] | None, reason: str) -> None:
        env = {**os.environ, **incident_env(action, self.node, incident, reason)}
        res = run_argv(self.command, timeout=self.timeout, env=env)
        if res.returncode != 0:
            raise DrainError(
                f"{self.command[0]} exited with status {res.returncode}: {_tail(res.stderr)}"
            )

    def drain(self, incident: Mapping[str, Any], reason: str, dry_run: bool) -> DrainResult:
        if dry_run:
            return DrainResult(
                "dry_run", f"would run {self.command[0]} with GPUWATCHD_ACTION=drain"
            )
        self._run("drain", incident, reason)
        return DrainResult("drained", f"{self.command[0]} exited 0")

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        reason = str(incident.get("reason", "")) if incident else ""
        if dry_run:
            return DrainResult(
                "dry_run", f"would run {self.command[0]} with GPUWATCHD_ACTION=resume"
            )
        self._run("resume", incident, reason)
        return DrainResult("resumed", f"{self.command[0]} exited 0")

    def close(self) -> None:
        pass


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
            raise DrainError(f"sinfo failed (status {res.returncode}): {_tail(res.stderr)}")
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
                f"scontrol update failed (status {res.returncode}): {_tail(res.stderr)}"
            )

    def drain(self, incident: Mapping[str, Any], reason: str, dry_run: bool) -> DrainResult:
        node = self.read()
        if node.offline and node.ours:
            return DrainResult("already", f"node is {node.state} by gpuwatchd: {node.reason}")
        if node.offline:
            why = node.reason or "no reason given"
            return DrainResult(
                "kept_admin", f"node is {node.state} for another reason ({why}); left as is"
            )
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
            return DrainResult(
                "not_ours",
                f"node is {node.state} for another reason ({node.reason or 'none'}); left as is",
            )
        if dry_run:
            return DrainResult(
                "dry_run", f"would run scontrol update NodeName={self.node} State=RESUME"
            )
        self._update("State=RESUME")
        return DrainResult("resumed", f"cleared drain {node.reason!r}")

    def close(self) -> None:
        pass


class RecordDriver:
    """``simulate``: never touches the scheduler; says what it would have done."""

    reads_state = False

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def drain(self, incident: Mapping[str, Any], reason: str, dry_run: bool) -> DrainResult:
        return DrainResult("dry_run", f"recorded ({self.mode}): drain, reason {reason!r}")

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        return DrainResult("dry_run", f"recorded ({self.mode}): resume")

    def close(self) -> None:
        pass
