"""``drain.mode: exec``: runs a site command (the root drain helper, or any script) with a
documented environment; the daemon itself reads the fleet census with ``sinfo``."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.drain.drivers.base import (
    DrainError,
    DrainResult,
    Driver,
    Gate,
    incident_env,
    run_argv,
    tail_text,
)
from gpuwatchd.actions.drain.drivers.slurm import SlurmDrainConfig, SlurmFleetView
from gpuwatchd.actions.fleet import Claim, Mark
from gpuwatchd.config.actions import (
    DrainConfig,
    DriverSection,
    DriverSectionReader,
    FleetDrainConfig,
    read_argv,
    read_driver_section,
)
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.clock import Clock


class ExecDriver:
    mode = "exec"
    reads_state = False

    def __init__(
        self, command: Sequence[str], node: str, timeout: float, *, sinfo: str = "sinfo"
    ) -> None:
        self.command = list(command)
        self.node = node
        self.timeout = timeout
        self.sinfo = sinfo  # the census of a fleet budget (drain.fleet.census: slurm)

    def fleet_view(self, cfg: FleetDrainConfig) -> SlurmFleetView:
        """The fleet as Slurm counts it, read by the daemon itself (``sinfo`` needs no
        privilege), while the exec command (the root drain helper) writes this node's claim
        (``GPUWATCHD_ACTION=claim``, the claim in ``GPUWATCHD_CLAIM``, empty to take it
        off), drains and resumes: the claims work as in ``slurm`` mode."""

        def put(node: str, claim: Claim | Mark | None, known: str | None) -> None:
            env = {
                **os.environ,
                **incident_env("claim", node, None, ""),
                "GPUWATCHD_CLAIM": claim.text if claim is not None else "",
            }
            res = run_argv(self.command, timeout=self.timeout, env=env)
            if res.returncode != 0:
                raise DrainError(
                    f"{self.command[0]} (claim) exited with status {res.returncode}: "
                    f"{tail_text(res.stderr)}"
                )

        def mark(node: str, what: Mark | None, known: str | None) -> None:
            if what is not None:  # the helper takes no mark off: that is an operator's reset
                put(node, what, known)

        return SlurmFleetView(self.sinfo, self.timeout, cfg.partition, put, mark)

    def _run(self, action: str, incident: Mapping[str, Any] | None, reason: str) -> None:
        env = {**os.environ, **incident_env(action, self.node, incident, reason)}
        res = run_argv(self.command, timeout=self.timeout, env=env)
        if res.returncode != 0:
            raise DrainError(
                f"{self.command[0]} exited with status {res.returncode}: {tail_text(res.stderr)}"
            )

    def drain(
        self, incident: Mapping[str, Any], reason: str, dry_run: bool, *, gate: Gate | None = None
    ) -> DrainResult:
        refusal = gate() if gate is not None else None
        if refusal:
            return DrainResult("over_budget", refusal)
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

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        return None  # a site command cannot tell whether someone resumed the node

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ExecDrainConfig(DriverSection):
    """``drain.exec``: the site command, as a list (program and arguments)."""

    command: tuple[str, ...] = ()


def _read_section(r: Reader, node: Node, what: str) -> ExecDrainConfig:
    def value(r: Reader, key: str, node: Node, where: str) -> Any:
        return read_argv(r, node, where)  # command

    return read_driver_section(r, node, ExecDrainConfig, what, value)


def _check(drain: DrainConfig) -> str | None:
    if drain.section("exec", ExecDrainConfig).command:
        return None
    return "'exec' needs drain.exec.command (a list: program and arguments)"


class ExecKind:
    mode = "exec"
    reader = DriverSectionReader(ExecDrainConfig, _read_section, _check)

    def build(self, cfg: DrainConfig, node: str, clock: Clock) -> Driver:
        return ExecDriver(
            cfg.section("exec", ExecDrainConfig).command,
            node,
            cfg.timeout,
            sinfo=cfg.section("slurm", SlurmDrainConfig).sinfo,
        )


KIND = ExecKind()
