"""Issue 24 item 6: "after a restart 7 of 12 saved XID episodes were found (the newest
missing)". Two ways the newest XIDs went missing at a stop, both fixed:

- the recurrence rules run on the periodic tick, so the XIDs that came after the last
  tick were in the engine but not grouped into episodes when the state was saved (see
  tests/rules/test_rules_xid_recurrence.py); a save now groups them first;
- the evaluator left its loop without taking what waited in the hand-off (records that
  came while it was busy judging, and the first sightings the XID merger held until
  ``xids.stop`` let them go), and the kernel-log position was already past their lines:
  neither a page nor the episodes survived. The daemon now takes one last look before
  it closes its state.

Failed on the old code: 1 of 12 episodes saved; with the first fix alone, 9 of 12."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.records import XidEvent
from gpuwatchd.rules.stage import RulesStage
from gpuwatchd.service.assembly import Wiring
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.testing.fake_backend import FakeBackend
from gpuwatchd.testing.faults import WedgeStage

RULE = "GpuXidMemoryRecurring"  # a shipped xid_recurrence rule (XID 92)


def wait_for(test: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not test():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def saved_episodes(state: Path) -> list[float]:
    conn = sqlite3.connect(state / "rules.sqlite3")
    try:
        rows = conn.execute(
            "SELECT start FROM xid_episodes WHERE rule=? ORDER BY start", (RULE,)
        ).fetchall()
    finally:
        conn.close()
    return [r[0] for r in rows]


def test_xids_waiting_at_the_stop_are_judged_and_their_episodes_survive(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"state_dir: {state}\nsources: {{kernel_log: none, nvml_events: false}}\n")
    config = load_config(str(cfg), must_exist=True, environ={})
    wedge = WedgeStage(10**9)  # a busy evaluation, when told (after = evaluations so far)
    daemon = Daemon(
        config,
        FakeBackend(count=12),
        SystemClock(),
        wiring=Wiring(extra_stages=(wedge,)),
        serve_http=False,
    )
    daemon.start()
    infos = daemon.node.infos
    base = time.time() - 12.0
    starts = [base + i for i in range(12)]  # one episode on each of 12 GPUs

    def xid(i: int) -> None:
        daemon.node.emit(
            XidEvent(starts[i], "kmsg", 92, gpu=i, pci_bus_id=infos[i].pci_bus_id, pid=100 + i)
        )

    stopper = threading.Thread(target=daemon.stop, name="stopper")
    try:
        for i in range(8):
            xid(i)
            done = daemon.pipeline.evaluations
            wait_for(lambda d=done: daemon.pipeline.evaluations > d)  # judged
        wedge.after = wedge.evaluations  # the next evaluation is a long one
        xid(8)
        assert wedge.wedged.wait(30)
        for i in range(9, 12):  # they come while the evaluator is busy
            xid(i)
        stopper.start()
        wait_for(daemon._stopped.is_set)
        wedge.close()  # the busy evaluation ends after the stop began
        stopper.join(30)
        assert not stopper.is_alive()
    finally:
        if not stopper.is_alive() and not daemon._stopped.is_set():
            daemon.stop()
    assert saved_episodes(state) == starts, "the newest XID episodes were not saved"

    again = Daemon(config, FakeBackend(count=12), SystemClock(), serve_http=False)
    try:
        again.open_backend()
        again.node.evaluate()  # the first evaluation takes the saved episodes back
        stage = again.node.rules
        assert isinstance(stage, RulesStage)
        evaluator = stage.engine._loaded[RULE].evaluator
        found = sorted(e.start for reps in evaluator.repeats.values() for e in reps)  # type: ignore[attr-defined]
        assert found == starts, f"{len(found)} of 12 saved episodes found after the restart"
    finally:
        again.stop()
