"""The Slurm drain hook against a real single-node Slurm (slurmctld + slurmd, auth/none,
state in a temp dir, free ports): gpuwatchd drains with its prefixed reason, keeps an
admin's drain, resumes only its own, and does not drain twice for the same incident."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from actions_support import make_config, sink_for, transition
from conftest import Proc, free_port, need_binary

from gpuwatchd.actions import ActionsSink
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.families import Families

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
MpiDefault=none
MailProg=/bin/true
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class Slurm:
    node: str
    env: dict[str, str]

    def run(self, *args: str) -> str:
        res = subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=30)
        assert res.returncode == 0, f"{args}: {res.stderr}"
        return res.stdout

    def state(self) -> tuple[str, str, str]:
        """(state, reason, reason timestamp) as sinfo prints them."""
        out = self.run(
            "sinfo", "--noheader", "--Node", "--nodes", self.node, "--format", "%T|%E|%H"
        )
        state, reason, when = out.strip().split("|")
        return state.rstrip("*"), reason, when

    def admin(self, *fields: str) -> None:
        self.run("scontrol", "update", f"NodeName={self.node}", *fields)

    def wait_state(self, want: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while self.state()[0] != want:
            assert time.monotonic() < deadline, f"node stuck in {self.state()}, wanted {want}"
            time.sleep(0.1)


@pytest.fixture
def slurm(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Slurm]:
    ctld = need_binary("slurmctld")
    slurmd = need_binary("slurmd")
    need_binary("scontrol")
    need_binary("sinfo")
    work = tmp_path_factory.mktemp("slurm")
    (work / "state").mkdir()
    (work / "spool").mkdir()
    host = socket.gethostname().split(".")[0]
    conf = work / "slurm.conf"
    conf.write_text(
        SLURM_CONF.format(
            host=host, ctld_port=free_port(), d_port=free_port(), dir=work, cpus=os.cpu_count() or 1
        )
    )
    env = dict(os.environ, SLURM_CONF=str(conf))
    monkeypatch.setenv("SLURM_CONF", str(conf))  # the drain hook's scontrol/sinfo read it
    procs = [Proc([ctld, "-D", "-c"], work / "ctld.out", env)]
    time.sleep(0.2)
    procs.append(Proc([slurmd, "-D"], work / "slurmd.out", env))
    cluster = Slurm(host, env)
    deadline = time.monotonic() + 20
    try:
        while True:
            res = subprocess.run(
                ["sinfo", "-h", "-N", "-o", "%T"],
                env=env,
                capture_output=True,
                text=True,
                timeout=10,
            )
            if res.returncode == 0 and res.stdout.strip().rstrip("*") == "idle":
                break
            if time.monotonic() > deadline or any(p.popen.poll() is not None for p in procs):
                logs = "\n".join(p.output() for p in procs)
                for name in ("slurmctld.log", "slurmd.log"):
                    if (work / name).exists():
                        logs += (work / name).read_text()[-3000:]
                pytest.fail(
                    f"single-node Slurm did not come up (sinfo: {res.stdout!r} "
                    f"{res.stderr!r}):\n{logs}"
                )
            time.sleep(0.1)
        yield cluster
    finally:
        for p in reversed(procs):
            p.stop()


def drain_config(tmp_path: Path, node: str, resume: bool = False, extra: str = "") -> object:
    return make_config(
        tmp_path,
        f"""drain:
  mode: slurm
  node: {node}
  resume: {str(resume).lower()}
  resume_hold: 10m
  state_file: {tmp_path / "health.json"}
{extra}""",
        name="drain.yaml",
    )


def actions(sink: ActionsSink) -> dict[str, float]:
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    out = {}
    for line in fams.render().decode().splitlines():
        if line.startswith("gpuwatchd_drain_actions_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split("{", 1)[1].rstrip("}")] = float(value)
    return out


def test_page_and_drain_drains_then_resume_clears_only_ours(slurm: Slurm, tmp_path: Path) -> None:
    clock = VirtualClock(time.time())
    sink = sink_for(drain_config(tmp_path, slurm.node, resume=True), clock)  # type: ignore[arg-type]
    try:
        fire = transition(at=clock.now(), drain=True)
        sink.deliver([fire], clock.now())
        sink.run_pending()
        state, reason, _ = slurm.state()
        assert state == "drained"
        assert reason == "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"
        assert actions(sink)['action="drain",result="drained"'] == 1
        health = json.loads((tmp_path / "health.json").read_text())
        assert health["state"] == "drained" and health["node"] == slurm.node
        assert sink.status()["drain"]["state"] == "drained"
        # resolved: nothing happens before the hold time is over
        clock.advance(60)
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert slurm.state()[0] == "drained"
        clock.advance(601)
        sink.run_pending()
        slurm.wait_state("idle")
        assert slurm.state()[1] == "none"
        assert actions(sink)['action="resume",result="resumed"'] == 1
        assert json.loads((tmp_path / "health.json").read_text())["state"] == "ok"
    finally:
        sink.close()


def test_admin_drain_keeps_its_reason_and_is_never_resumed(slurm: Slurm, tmp_path: Path) -> None:
    slurm.admin("State=DRAIN", "Reason=admin: replacing fan 2")
    clock = VirtualClock(time.time())
    sink = sink_for(drain_config(tmp_path, slurm.node, resume=True), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", "admin: replacing fan 2")
        assert actions(sink)['action="drain",result="kept_admin"'] == 1
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        clock.advance(3600)
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", "admin: replacing fan 2")  # not ours: untouched
        # an admin DOWN is left alone too
        slurm.admin("State=DOWN", "Reason=admin: dead PSU")
        sink.deliver([transition(at=clock.now(), drain=True, seq=3)], clock.now())
        sink.run_pending()
        assert slurm.state()[1] == "admin: dead PSU"
    finally:
        sink.close()


def test_second_identical_incident_does_not_drain_twice(slurm: Slurm, tmp_path: Path) -> None:
    clock = VirtualClock(time.time())
    cfg = drain_config(tmp_path, slurm.node, resume=False)
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        fire = transition(at=clock.now(), drain=True)
        sink.deliver([fire, fire], clock.now())
        sink.run_pending()
        first = slurm.state()
        assert first[0] == "drained" and first[1].startswith("gpuwatchd: ")
        sink.close()
        time.sleep(1.1)  # so that a second scontrol update would change the reason's timestamp
        sink = sink_for(cfg, clock)  # type: ignore[arg-type]
        sink.deliver([fire], clock.now())  # the same transition again after a restart
        sink.run_pending()
        clock.advance(120)
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        clock.advance(120)
        sink.deliver(
            [transition(at=clock.now(), drain=True, seq=3)], clock.now()
        )  # it happens again
        sink.run_pending()
        assert slurm.state() == first  # same reason, same timestamp: no second drain
        got = actions(sink)
        assert got['action="drain",result="already"'] == 1
        assert got['action="drain",result="drained"'] == 0
        assert sink.status()["drain"]["drains_in_window"] == 1
    finally:
        sink.close()


def test_dry_run_reads_but_never_writes(slurm: Slurm, tmp_path: Path) -> None:
    clock = VirtualClock(time.time())
    cfg = drain_config(tmp_path, slurm.node, extra="  dry_run: true\n")
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("idle", "none")
        assert actions(sink)['action="drain",result="dry_run"'] == 1
        incident = sink.status()["drain"]["incidents"][0]
        assert "would run scontrol update" in incident["result"]
    finally:
        sink.close()
