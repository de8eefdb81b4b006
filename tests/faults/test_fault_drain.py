"""Drain safety under a burst, against a real single-node Slurm: waves of firing alerts on
every GPU never drain the node more often than ``drain.max_drains`` per ``drain.window``,
and a node an admin drained keeps its state and their reason, whatever fires and resolves
(gpuwatchd only adds its own reason next to theirs while the fault is active). Every
``scontrol`` call goes through a wrapper that records it."""

from __future__ import annotations

import re
import stat
import time
from pathlib import Path

from actions_support import HttpReceiver, actions, make_config, sink_for, transition
from conftest import free_port, need_binary
from fault_support import report
from slurm_support import Slurm, slurm  # noqa: F401 - the fixture

from gpuwatchd.actions import ActionsSink
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

WRAPPER = """#!/bin/sh
echo "$@" >> {log}
exec {scontrol} "$@"
"""
GPUS = range(8)


def setup(tmp_path: Path, node: str, url: str) -> tuple[object, Path]:
    log = tmp_path / "scontrol.log"
    wrapper = tmp_path / "scontrol"
    wrapper.write_text(WRAPPER.format(log=log, scontrol=need_binary("scontrol")))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    config = make_config(
        tmp_path,
        f"""receivers:
  - {{name: ops, type: webhook, url: "{url}/hook"}}
routing: {{group_wait: 0s, group_by: [node, gpu, alertname]}}
drain:
  mode: slurm
  node: {node}
  resume: true
  resume_hold: 1m
  max_drains: 2
  window: 1h
  state_file: {tmp_path / "health.json"}
  slurm: {{scontrol: {wrapper}}}
""",
        name="drain.yaml",
    )
    return config, log


def writes(log: Path) -> list[str]:
    """The scontrol calls that change the node (``update``), in order."""
    if not log.exists():
        return []
    return [line for line in log.read_text().splitlines() if line.startswith("update")]


def wave(sink: ActionsSink, clock: VirtualClock, seq: int) -> None:
    """Every GPU fails at once; later every alert resolves; later still the hold is over."""
    sink.deliver(
        [transition(gpu=g, seq=seq, at=clock.now(), drain=True, xid=79) for g in GPUS],
        clock.now(),
    )
    sink.run_pending()
    clock.advance(120)
    sink.deliver(
        [
            transition(gpu=g, state=AlertState.RESOLVED, seq=seq + 1, at=clock.now(), xid=79)
            for g in GPUS
        ],
        clock.now(),
    )
    sink.run_pending()
    clock.advance(61)
    sink.run_pending()


def test_bursts_never_exceed_drains_per_window(slurm: Slurm, tmp_path: Path) -> None:  # noqa: F811
    rx = HttpReceiver(free_port()).start()
    config, log = setup(tmp_path, slurm.node, rx.url)
    clock = VirtualClock(time.time())
    sink = sink_for(config, clock)  # type: ignore[arg-type]
    try:
        for i in range(6):  # six waves of 8 GPUs within 20 minutes: 48 drain requests
            wave(sink, clock, seq=2 * i + 1)
        drains = [w for w in writes(log) if "State=DRAIN" in w]
        resumes = [w for w in writes(log) if "State=RESUME" in w]
        assert len(drains) == 2 and len(resumes) == 2, writes(log)
        assert all("Reason=gpuwatchd: " in w for w in drains)
        got = actions(sink)
        assert got['action="drain",result="rate_limited"'] >= 1
        assert sink.status().as_json()["drain"]["drains_in_window"] == 2
        limit = [
            (a["labels"]["alertname"], a["status"])
            for r in rx.requests
            for a in r.json()["alerts"]
            if a["labels"]["alertname"] == "GpuwatchdDrainLimitReached"
        ]
        assert limit[:1] == [("GpuwatchdDrainLimitReached", "firing")], limit
        assert slurm.state()[0] == "idle"  # resumed what it drained, and only that

        clock.advance(3600)  # the window has room again: the next wave drains once more
        wave(sink, clock, seq=100)
        assert len([w for w in writes(log) if "State=DRAIN" in w]) == 3
        report("drain_burst", requests=7 * len(GPUS), drains=3, max_per_window=2)
    finally:
        sink.close()
        rx.stop()


def test_an_admins_drain_keeps_its_state_and_reason_through_a_burst(
    slurm: Slurm,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    slurm.admin("State=DRAIN", "Reason=admin: replacing PSU 2")
    before = slurm.state()
    rx = HttpReceiver(free_port()).start()
    config, log = setup(tmp_path, slurm.node, rx.url)
    clock = VirtualClock(time.time())
    sink = sink_for(config, clock)  # type: ignore[arg-type]
    try:
        for i in range(3):
            wave(sink, clock, seq=2 * i + 1)
        # the admin's drain stays: no state change, never resumed; gpuwatchd only added
        # its reason next to theirs while the fault was active and took it off after
        updates = writes(log)
        assert updates and not [w for w in updates if "State=" in w], updates
        notes = [w.split("Reason=", 1)[1] for w in updates]
        assert len(notes) == 6 and notes[1::2] == ["admin: replacing PSU 2"] * 3, notes
        note = re.compile(r"admin: replacing PSU 2; gpuwatchd: XID 79 GPU \d 0000.*")
        assert all(note.fullmatch(n) for n in notes[::2]), notes
        assert slurm.state()[:2] == before[:2]  # state and reason as the admin left them
        got = actions(sink)
        assert got['action="drain",result="noted"'] == 3
        assert got['action="resume",result="unnoted"'] == 3
        assert got['action="resume",result="resumed"'] == 0
        report("drain_admin", waves=3, state_writes=0, note_writes=len(updates))
    finally:
        sink.close()
        rx.stop()
