"""The drain's state machine stepped alone (issue 24 item 1): ``drain_step`` with a real
outbox database, a scripted driver and a virtual clock; no controller, no thread."""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Gate
from gpuwatchd.actions.drain.incidents import (
    Incident,
    due,
    ensure_node_drain,
    mark_resolved,
    open_incident,
    read_node_drain,
)
from gpuwatchd.actions.drain.machine import PENDING, Drive, Step, drain_step
from gpuwatchd.actions.drain.resume import resume
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.records import DrainOutcomeKind


class ScriptedDriver:
    """A driver that fails its first ``failures`` drains, then drains; resumes always."""

    mode = "scripted"
    reads_state = False

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.drains = 0
        self.resumes: list[Mapping[str, Any] | None] = []

    def drain(
        self, incident: Mapping[str, Any], reason: str, dry_run: bool, *, gate: Gate | None = None
    ) -> DrainResult:
        self.drains += 1
        if self.drains <= self.failures:
            raise DrainError(f"scheduler unreachable (try {self.drains})")
        return DrainResult("drained", f"drained for {reason}")

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        return None

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        self.resumes.append(incident)
        return DrainResult("resumed", "resumed")

    def close(self) -> None:
        pass


def record(rule: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "rule": rule,
        "idempotency_key": f"{rule}-1",
        "fingerprint": f"fp-{rule}",
        "labels": {"gpu": "3", **labels},
        "annotations": {},
    }


def setup(tmp_path: Path, rec: dict[str, Any], clock: VirtualClock) -> Store:
    store = Store(str(tmp_path / "outbox.db"))
    with store.tx() as conn:
        ensure_node_drain(conn)
        now = clock.now()
        open_incident(conn, rec, "gpuwatchd: test", PENDING, now, now, None, now)
    return store


def run_due(drive: Drive, clock: VirtualClock) -> list[tuple[Incident, Step]]:
    """Step every due incident once; the steps taken."""
    return [
        (inc, drain_step(drive, inc, clock.now())) for inc in due(drive.store, PENDING, clock.now())
    ]


def test_a_drain_that_fails_twice_then_succeeds(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = setup(tmp_path, record("GpuFallenOff", {}), clock)
    driver = ScriptedDriver(failures=2)
    cfg = DrainConfig(mode="exec", attempts=5, state_file=None)
    drive = Drive(cfg, "node-1", store, driver, None, random.Random(1), pretend=False)

    steps = run_due(drive, clock)
    assert [s.error for _, s in steps] == ["scheduler unreachable (try 1)"]
    assert steps[0][1].result == "" and not steps[0][1].done and not steps[0][1].outcomes
    assert run_due(drive, clock) == []  # backing off: nothing due at the same moment
    clock.advance(RETRY_WAIT)
    ((inc, step),) = run_due(drive, clock)
    assert inc.attempts == 1 and step.error == "scheduler unreachable (try 2)"
    clock.advance(RETRY_WAIT)
    ((inc, step),) = run_due(drive, clock)
    assert inc.attempts == 2
    assert (step.result, step.done, step.error) == ("drained", True, None)
    assert read_node_drain(store).owned
    assert run_due(drive, clock) == []  # drained: nothing more to do
    assert driver.drains == 3


RETRY_WAIT = 301.0  # above the longest backoff (RETRY_MAX)


def test_an_xid_drain_pages_after_its_attempts_keeps_trying_and_clears(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = setup(tmp_path, record("GpuXidFatal", {"xid": "79"}), clock)
    driver = ScriptedDriver(failures=3)
    cfg = DrainConfig(mode="exec", attempts=2, state_file=None)
    drive = Drive(cfg, "node-1", store, driver, None, random.Random(1), pretend=False)

    outcomes = []
    for _ in range(4):
        ((_, step),) = run_due(drive, clock)
        outcomes.append([(o.kind, o.holds) for o in step.outcomes])
        clock.advance(RETRY_WAIT)
    # the second failure pages once, the third does not page again, the fourth try drains
    # and ends the page
    assert outcomes == [
        [],
        [(DrainOutcomeKind.FAILED, True)],
        [],
        [(DrainOutcomeKind.FAILED, False)],
    ]
    assert step.result == "drained" and step.done


def test_a_drain_that_gives_up_pages_once(tmp_path: Path) -> None:
    clock = VirtualClock()
    store = setup(tmp_path, record("GpuFallenOff", {}), clock)
    cfg = DrainConfig(mode="exec", attempts=2, state_file=None)
    drive = Drive(cfg, "node-1", store, ScriptedDriver(9), None, random.Random(1), False)
    run_due(drive, clock)
    clock.advance(RETRY_WAIT)
    ((_, step),) = run_due(drive, clock)
    assert step.result == "failed" and step.detail.startswith("gave up after 2 attempts")
    assert [(o.kind, o.holds, o.gpu) for o in step.outcomes] == [(DrainOutcomeKind.FAILED, True, 3)]
    clock.advance(RETRY_WAIT)
    assert run_due(drive, clock) == []  # given up: never due again


def test_a_resume_after_the_drain_once_the_fault_has_resolved(tmp_path: Path) -> None:
    clock = VirtualClock()
    rec = record("GpuFallenOff", {})
    store = setup(tmp_path, rec, clock)
    driver = ScriptedDriver(failures=0)
    cfg = DrainConfig(mode="exec", resume=True, resume_hold=600.0, state_file=None)
    drive = Drive(cfg, "node-1", store, driver, None, random.Random(1), pretend=False)
    ((_, step),) = run_due(drive, clock)
    assert step.result == "drained"

    def resume_now() -> Any:
        return resume(store, driver, clock.now(), cfg, pretend_drained=False, backoff=lambda a: 5.0)

    assert resume_now() is None  # the fault still fires
    with store.tx() as conn:
        mark_resolved(conn, rec["fingerprint"], clock.now())
    clock.advance(599.0)
    assert resume_now() is None  # within resume_hold
    clock.advance(2.0)
    done = resume_now()
    assert done is not None and done.result is not None and done.result.result == "resumed"
    assert driver.resumes and driver.resumes[0] is not None
    assert not read_node_drain(store).owned
    assert resume_now() is None  # undone once
