"""Drains that hold (issue 14 item 1), on a real single-node Slurm: while an incident that
gpuwatchd drains for is active, the node stays out of service whoever else drained or
resumed it. NHC is not packaged in Debian 12, so its documented drain and resume
(helpers/node-mark-offline and node-mark-online: reasons led by ``NHC:``, never clobber
another note, resume only its own reasons) are reproduced here by hand with scontrol."""

from __future__ import annotations

import time
from pathlib import Path

from actions_support import actions, make_config, sink_for, transition
from slurm_support import Slurm, slurm  # noqa: F401 - the fixture

from gpuwatchd.actions.silences import add_silence, path_in
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"
NHC = "NHC:"


def nhc_offline(cluster: Slurm, note: str) -> bool:
    """NHC's node-mark-offline: drain with ``NHC: note`` unless another note is there."""
    state, reason, _ = cluster.state()
    offline = any(state.startswith(s) for s in ("drain", "fail", "maint", "down"))
    if offline and (reason == "none" or not reason.startswith(NHC)):
        return False  # already offline for someone else: keep their note
    cluster.admin("State=DRAIN", f"Reason={NHC} {note}")
    return True


def nhc_online(cluster: Slurm) -> bool:
    """NHC's node-mark-online: resume only a node that is offline for an NHC reason."""
    state, reason, _ = cluster.state()
    if not any(state.startswith(s) for s in ("drain", "fail", "maint", "down")):
        return False
    if reason == "none" or not reason.startswith(NHC):
        return False  # "Down for non-NHC reason": left alone
    cluster.admin("State=RESUME")
    return True


def config(tmp_path: Path, node: str) -> object:
    return make_config(
        tmp_path,
        f"""drain:
  mode: slurm
  node: {node}
  resume: true
  resume_hold: 0s
  hold_interval: 30s
  state_file: null
""",
        name="drain.yaml",
    )


def test_nhc_drain_then_gpu_fault_then_nhc_resume_keeps_the_node_out(
    slurm: Slurm,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    clock = VirtualClock(time.time())
    sink = sink_for(config(tmp_path, slurm.node), clock)  # type: ignore[arg-type]
    try:
        assert nhc_offline(slurm, "check_fs_mount: /scratch not mounted")
        # GPU 3 falls off the bus while NHC holds the node: gpuwatchd adds its reason
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        nhc_note = "NHC: check_fs_mount: /scratch not mounted"
        assert slurm.state()[:2] == ("drained", f"{nhc_note}; {REASON}")
        assert actions(sink)['action="drain",result="noted"'] == 1
        # /scratch is back: NHC resumes the node, its reason leads
        assert nhc_online(slurm)
        slurm.wait_state("idle")
        # within drain.hold_interval gpuwatchd drains it again, under its own reason
        clock.advance(31)
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", REASON)
        assert actions(sink)['action="hold",result="reasserted"'] == 1
        assert sink.status().as_json()["drain"]["state"] == "drained"
        # NHC's next run leaves a node drained for a non-NHC reason alone
        assert not nhc_online(slurm)
        assert not nhc_offline(slurm, "check_fs_mount: /scratch not mounted")
        assert slurm.state()[:2] == ("drained", REASON)
        # nothing changes while the fault is active and nobody touches the node
        clock.advance(31)
        sink.run_pending()
        assert actions(sink)['action="hold",result="reasserted"'] == 1
        # the fault clears: gpuwatchd resumes its own drain
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        slurm.wait_state("idle")
        assert slurm.state()[1] == "none"
        assert actions(sink)['action="resume",result="resumed"'] == 1
    finally:
        sink.close()


def test_a_resume_by_hand_while_the_fault_is_active_is_undone(
    slurm: Slurm,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    clock = VirtualClock(time.time())
    sink = sink_for(config(tmp_path, slurm.node), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", REASON)
        slurm.admin("State=RESUME")  # someone puts the node back with GPU 3 still lost
        slurm.wait_state("idle")
        clock.advance(29)
        sink.run_pending()
        assert slurm.state()[0] == "idle"  # not before drain.hold_interval
        clock.advance(1)
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", REASON)
        # an admin who drains it for their own reason meanwhile keeps it; gpuwatchd notes
        slurm.admin("State=RESUME")
        slurm.admin("State=DRAIN", "Reason=admin: swapping GPU 3")
        clock.advance(30)
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", f"admin: swapping GPU 3; {REASON}")
        got = actions(sink)
        assert got['action="hold",result="reasserted"'] == 1
        assert got['action="hold",result="noted"'] == 1
        # the fault clears: only gpuwatchd's note goes; the admin's drain stays
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", "admin: swapping GPU 3")
        assert actions(sink)['action="resume",result="unnoted"'] == 1
    finally:
        sink.close()


def test_a_silence_lets_an_operator_keep_the_node_in_service(
    slurm: Slurm,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    clock = VirtualClock(time.time())
    cfg = config(tmp_path, slurm.node)
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert slurm.state()[:2] == ("drained", REASON)
        # the operator silences GPU 3 and resumes the node to run diagnostics on it
        add_silence(
            path_in(cfg.state_dir),  # type: ignore[attr-defined]
            node="node17",
            gpu="00000000:3E:00.0",
            rule=None,
            duration=3600,
            reason="diagnostics on GPU 3",
            author="ops",
            now=clock.now(),
        )
        slurm.admin("State=RESUME")
        slurm.wait_state("idle")
        clock.advance(31)
        sink.run_pending()
        assert slurm.state()[0] == "idle"  # not held while silenced
        assert actions(sink)['action="hold",result="reasserted"'] == 0
    finally:
        sink.close()
