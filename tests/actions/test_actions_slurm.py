"""The Slurm drain hook against a real single-node Slurm (slurmctld + slurmd, auth/none,
state in a temp dir, free ports): gpuwatchd drains with its prefixed reason, keeps an
admin's drain, resumes only its own, and does not drain twice for the same incident."""

from __future__ import annotations

import json
import time
from pathlib import Path

from actions_support import actions, make_config, sink_for, transition
from slurm_support import Slurm, slurm  # noqa: F401 - the fixture

from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"


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


def test_page_and_drain_drains_then_resume_clears_only_ours(slurm: Slurm, tmp_path: Path) -> None:  # noqa: F811
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
        assert sink.status().as_json()["drain"]["state"] == "drained"
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


def test_admin_drain_keeps_its_reason_and_is_never_resumed(slurm: Slurm, tmp_path: Path) -> None:  # noqa: F811
    slurm.admin("State=DRAIN", "Reason=admin: replacing fan 2")
    clock = VirtualClock(time.time())
    sink = sink_for(drain_config(tmp_path, slurm.node, resume=True), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        # the admin's reason stays first; gpuwatchd's is added next to it
        assert slurm.state()[:2] == ("drained", f"admin: replacing fan 2; {REASON}")
        assert actions(sink)['action="drain",result="noted"'] == 1
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        clock.advance(3600)
        sink.run_pending()
        # not ours: still drained, only gpuwatchd's note is gone
        assert slurm.state()[:2] == ("drained", "admin: replacing fan 2")
        assert actions(sink)['action="resume",result="unnoted"'] == 1
        # an admin DOWN on a drained node: its state is never changed; gpuwatchd only adds
        # its reason (sinfo shows DOWN+DRAIN as drained, as it shows NHC)
        slurm.admin("State=DOWN", "Reason=admin: dead PSU")
        state = slurm.state()[0]
        sink.deliver([transition(at=clock.now(), drain=True, seq=3)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == (state, f"admin: dead PSU; {REASON}")
    finally:
        sink.close()


def test_second_identical_incident_does_not_drain_twice(slurm: Slurm, tmp_path: Path) -> None:  # noqa: F811
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
        assert sink.status().as_json()["drain"]["drains_in_window"] == 1
    finally:
        sink.close()


def test_dry_run_reads_but_never_writes(slurm: Slurm, tmp_path: Path) -> None:  # noqa: F811
    clock = VirtualClock(time.time())
    cfg = drain_config(tmp_path, slurm.node, extra="  dry_run: true\n")
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("idle", "none")
        assert actions(sink)['action="drain",result="dry_run"'] == 1
        incident = sink.status().as_json()["drain"]["incidents"][0]
        assert "would run scontrol update" in incident["result"]
    finally:
        sink.close()
