"""A real Slurm for the drain tests: slurmctld + one slurmd (auth/none, state in a temp dir,
free loopback ports), optionally with many more nodes in slurm.conf that have no slurmd
(they still carry a state and a drain reason, which is all a drain budget reads).

Ports are picked free but may be taken by someone else before slurmctld binds them: a
start that fails with "Address already in use" is retried on new ports."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import Proc, free_port, need_binary

SLURM_CONF = """\
ClusterName=gwtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=3600
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
{extra_nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
START_TRIES = 5
IN_USE = "Address already in use"


@dataclass
class Slurm:
    node: str  # the node with a real slurmd
    env: dict[str, str]
    others: tuple[str, ...] = ()  # nodes in slurm.conf without a slurmd

    def run(self, *args: str) -> str:
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"{args}: {res.stderr}"
        return res.stdout

    def state(self, node: str | None = None) -> tuple[str, str, str]:
        """(state, reason, reason timestamp) as sinfo prints them."""
        out = self.run(
            "sinfo", "--noheader", "--Node", "--nodes", node or self.node, "--format", "%T|%E|%H"
        )
        state, reason, when = out.strip().split("|")
        return state.rstrip("*"), reason, when

    def reasons(self) -> dict[str, str]:
        """Every node's drain reason ("none" when it has none)."""
        out = self.run("sinfo", "--noheader", "--Node", "--format", "%N|%E")
        return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)

    def comment(self, node: str) -> str:
        """The node's Comment ("" when it has none)."""
        out = self.run("sinfo", "--noheader", "--Node", "--nodes", node, "--Format", "Comment:0")
        return "" if out.strip() == "(null)" else out.strip()

    def admin(self, *fields: str, node: str | None = None) -> None:
        self.run("scontrol", "update", f"NodeName={node or self.node}", *fields)

    def wait_state(self, want: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.state()[0] != want:
            assert time.monotonic() < deadline, f"node stuck in {self.state()}, wanted {want}"
            time.sleep(0.1)


def _start(work: Path, host: str, extra: int) -> tuple[list[Proc], dict[str, str], str]:
    """One attempt: (processes, env, "" if up or why not)."""
    ctld = need_binary("slurmctld")
    slurmd = need_binary("slurmd")
    for sub in ("state", "spool"):
        (work / sub).mkdir(exist_ok=True)
    for name in ("slurmctld.log", "slurmd.log"):
        (work / name).unlink(missing_ok=True)
    extra_nodes = ""
    if extra:
        extra_nodes = f"NodeName=gw[001-{extra:03d}] NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN\n"
    conf = work / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=host,
            ctld_port=free_port(),
            d_port=free_port(),
            dir=work,
            cpus=os.cpu_count() or 1,
            extra_nodes=extra_nodes,
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs = [Proc([ctld, "-D", "-c"], work / "ctld.out", env)]
    time.sleep(0.2)
    procs.append(Proc([slurmd, "-D"], work / "slurmd.out", env))
    deadline = time.monotonic() + 20
    res: subprocess.CompletedProcess[str] | None = None
    while True:
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-n", host, "-o", "%T"],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
        if res.returncode == 0 and res.stdout.strip().rstrip("*") == "idle":
            why = _wake(env, extra)
            if why:
                for p in reversed(procs):
                    p.stop()
            return procs if not why else [], env, why
        if time.monotonic() > deadline or any(p.popen.poll() is not None for p in procs):
            logs = "\n".join(p.output() for p in procs)
            for name in ("slurmctld.log", "slurmd.log"):
                if (work / name).exists():
                    logs += (work / name).read_text(errors="replace")[-3000:]
            for p in reversed(procs):
                p.stop()
            return [], env, f"sinfo: {res.stdout!r} {res.stderr!r}:\n{logs}"
        time.sleep(0.1)


def _wake(env: dict[str, str], extra: int) -> str:
    """Nodes without a slurmd start UNKNOWN, where Slurm refuses RESUME: take them down and
    back so that they are idle (not responding) like a node between jobs."""
    if not extra:
        return ""
    nodes = f"gw[001-{extra:03d}]"
    for fields in (["State=DOWN", "Reason=test setup"], ["State=RESUME"]):
        res = subprocess.run(
            ["scontrol", "update", f"NodeName={nodes}", *fields],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if res.returncode != 0:
            return f"scontrol update {nodes} {fields}: {res.stderr}"
    return ""


def start_slurm(work: Path, extra: int = 0) -> tuple[Slurm, list[Proc]]:
    need_binary("scontrol")
    need_binary("sinfo")
    host = socket.gethostname().split(".")[0]
    why = ""
    for _ in range(START_TRIES):
        procs, env, why = _start(work, host, extra)
        if not why:
            others = tuple(f"gw{i:03d}" for i in range(1, extra + 1))
            return Slurm(host, env, others), procs
        if IN_USE not in why:
            break
    pytest.fail(f"Slurm did not come up:\n{why}")


@pytest.fixture
def slurm(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Slurm]:
    """A single-node Slurm; ``SLURM_CONF`` is set for the drain hook's scontrol/sinfo."""
    cluster, procs = start_slurm(tmp_path_factory.mktemp("slurm"))
    monkeypatch.setenv("SLURM_CONF", cluster.env["SLURM_CONF"])
    try:
        yield cluster
    finally:
        for p in reversed(procs):
            p.stop()
