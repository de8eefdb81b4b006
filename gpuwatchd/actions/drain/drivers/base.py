"""What every drain driver is: the ``Driver`` protocol, its ``DrainResult`` and
``DrainError``, the pre-write ``Gate``, and the command runner the drivers share.

A driver answers ``drain(incident, reason, dry_run)`` and ``resume(incident, dry_run)`` with a
``DrainResult`` or raises ``DrainError`` (retried by the controller). Commands run from
argv lists, never through a shell, with a timeout that kills the whole process group.
``gate`` is asked right before the write (exec: before the command runs): a refusal text
(the fleet budget is spent) means no drain, ``over_budget``.

A driver kind is a module of this package with a ``KIND`` (``DriverKind``: its
``drain.mode`` and how it is built from the drain config) listed in ``registry.py``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuwatchd.actions.model import xid_of
from gpuwatchd.config.actions import DrainConfig, DriverSectionReader
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import GpuwatchdError

# Asked right before a drain is written: None to go ahead, or why not (fleet budget spent).
Gate = Callable[[], str | None]


class DrainError(GpuwatchdError):
    """A drain or resume attempt failed; it may succeed if tried again."""


@dataclass(frozen=True)
class DrainResult:
    # drained | already | kept_admin | noted | over_budget | dry_run | reasserted
    # | resumed | unnoted | not_ours | not_drained
    result: str
    detail: str = ""

    @property
    def counts(self) -> bool:
        """Whether this counts against drain.max_drains (a drain happened, or would have)."""
        return self.result in ("drained", "dry_run")

    @property
    def owns(self) -> bool:
        """Whether gpuwatchd now has a claim on the node's drain (and may undo it)."""
        return self.result in ("drained", "already", "noted", "reasserted")


class Driver(Protocol):
    mode: str
    # True: it reads the scheduler's view of the node before acting (slurm, kubernetes);
    # False: it cannot (exec), so gpuwatchd's own record of its drain decides.
    reads_state: bool

    def drain(
        self, incident: Mapping[str, Any], reason: str, dry_run: bool, *, gate: Gate | None = None
    ) -> DrainResult: ...

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        """While a drain incident is active: keep the node out of service (None: it is)."""
        ...

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


def tail_text(text: str, n: int = 300) -> str:
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


class DriverKind(Protocol):
    """One ``drain.mode``: its name, how its own section ``drain.<mode>`` is read, and how
    its driver is built from the drain section."""

    mode: str
    reader: DriverSectionReader

    def build(self, cfg: DrainConfig, node: str, clock: Clock) -> Driver:
        """The driver for ``node`` (``DrainError`` when it cannot be made)."""
        ...
