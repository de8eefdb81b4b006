"""Durable rule state: restart mid-firing, counter history across restarts, reboot-aware
escalation, and a corrupt or missing database."""

from __future__ import annotations

import logging
import os
import sqlite3
from pathlib import Path

import pytest
from rulekit import T0, Node, uuid_of

from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.records import GpuStatus
from gpuwatchd.rules.store import DB_NAME, StateStore, read_boot_id

HOT = """
rules:
- name: Hot
  severity: page
  for: 1m
  condition:
    threshold: {field: temperature_gpu, op: '>', value: 85}
  annotations: {summary: 'GPU {gpu} at {value:.0f} C'}
"""
REMAP = """
rules:
- name: RemapPending
  severity: ticket
  condition:
    threshold: {field: remapped_rows_pending, op: '>', value: 0}
  annotations: {action: reset the GPU}
  escalate:
    after: reboot
    within: 7d
    severity: page
    drain: true
    annotations: {action: 'still pending after a reboot: inspect the hardware'}
- name: RemapPlain
  severity: ticket
  condition:
    threshold: {field: remapped_rows_pending, op: '>', value: 0}
"""
ECC = """
rules:
- name: EccDay
  severity: ticket
  condition:
    increase: {field: ecc_corrected_volatile, window: 1d}
"""


def store(tmp_path: Path, boot: str = "boot-1") -> StateStore:
    return StateStore.in_state_dir(str(tmp_path / "state"), boot_id=boot)


def test_restart_mid_firing_does_not_page_again_and_still_resolves(tmp_path: Path) -> None:
    first = Node(HOT, store=store(tmp_path))
    first.set(2, temperature_gpu=95)
    first.run(120)
    assert [e[2] for e in first.events()] == ["pending", "firing"]
    fp = first.transitions[-1][1].fingerprint
    first.engine.close()

    # the daemon restarts 30 s later (same boot); the GPU is still hot
    second = Node(HOT, store=store(tmp_path), start=first.clock.now() + 30)
    second.set(2, temperature_gpu=95)
    second.run(600)
    assert second.transitions == []  # no second page
    assert second.firing() == {("Hot", "2")}
    second.set(2, temperature_gpu=60)
    second.step()
    (resolved,) = [tr for _, tr in second.transitions]
    assert (resolved.state.value, resolved.fingerprint, resolved.sequence) == ("resolved", fp, 3)
    assert resolved.annotations == {"summary": "GPU 2 at 95 C"}
    assert resolved.active_since == first.transitions[0][1].active_since
    second.engine.close()

    # and a restart after the resolve does not resolve again
    third = Node(HOT, store=store(tmp_path), start=second.clock.now() + 30)
    third.run(300)
    assert third.transitions == []


def test_restart_while_the_condition_cleared_sends_the_resolve(tmp_path: Path) -> None:
    first = Node(HOT, store=store(tmp_path))
    first.set(0, temperature_gpu=95)
    first.run(70)
    first.engine.close()
    second = Node(HOT, store=store(tmp_path), start=first.clock.now() + 600)
    second.poll()  # cooled down while the daemon was away
    assert [(e[1], e[2]) for e in second.events()] == [("Hot", "resolved")]


def test_an_alert_on_a_gpu_that_is_not_back_yet_is_held(tmp_path: Path) -> None:
    first = Node(HOT, store=store(tmp_path))
    first.set(3, temperature_gpu=95)
    first.run(70)
    first.engine.close()
    second = Node(HOT, gpus=3, store=store(tmp_path), start=first.clock.now() + 60)
    second.run(300)  # GPU 3 (by UUID) is not enumerated in this run: its alert stays
    assert second.transitions == []
    assert second.firing() == {("Hot", "3")}


def test_counter_history_survives_a_restart(tmp_path: Path) -> None:
    first = Node(ECC, store=store(tmp_path))
    first.set(1, ecc_corrected_volatile=100)
    first.run(3600, step=60)
    first.set(1, ecc_corrected_volatile=103)  # 3 errors
    first.run(3600, step=60)
    assert first.firing() == {("EccDay", "1")}
    first.engine.close()
    second = Node(ECC, store=store(tmp_path), start=first.clock.now() + 120)
    second.set(1, ecc_corrected_volatile=104)  # one more: 4 in the day, across the restart
    second.step(60)
    assert second.firing() == {("EccDay", "1")}
    assert second.engine.alerts()[0].value == 4.0
    second.set(1, ecc_corrected_volatile=0)  # driver reload after the restart
    second.run(600, step=60)
    assert second.engine.alerts()[0].value == 4.0
    second.engine.close()


def test_reboot_escalates_a_fault_that_survived_it(tmp_path: Path) -> None:
    first = Node(REMAP, store=store(tmp_path, "boot-A"))
    first.set(1, remapped_rows_pending=1)
    first.step()
    sev = {tr.rule: (tr.severity, tr.drain) for _, tr in first.transitions}
    assert sev == {
        "RemapPending": (AlertSeverity.TICKET, False),
        "RemapPlain": (AlertSeverity.TICKET, False),
    }
    first.engine.close()

    # the node reboots (new boot id); the remap is still pending
    second = Node(REMAP, store=store(tmp_path, "boot-B"), start=first.clock.now() + 900)
    second.set(1, remapped_rows_pending=1)
    second.step()
    (esc,) = [tr for _, tr in second.transitions]  # RemapPlain does not re-page
    assert (esc.rule, esc.state.value, esc.severity, esc.drain) == (
        "RemapPending",
        "firing",
        AlertSeverity.PAGE,
        True,
    )
    assert esc.annotations == {"action": "still pending after a reboot: inspect the hardware"}
    assert esc.sequence == 2
    second.run(600)
    assert len(second.transitions) == 1  # escalated once
    second.set(1, remapped_rows_pending=0)
    second.step()
    assert [(tr.rule, tr.state.value, tr.severity) for _, tr in second.transitions[1:]] == [
        ("RemapPending", "resolved", AlertSeverity.PAGE),
        ("RemapPlain", "resolved", AlertSeverity.TICKET),
    ]
    second.engine.close()


def test_a_fault_that_went_away_and_returns_after_a_reboot_escalates(tmp_path: Path) -> None:
    first = Node(REMAP, store=store(tmp_path, "boot-A"))
    first.set(0, remapped_rows_pending=1)
    first.step()
    first.set(0, remapped_rows_pending=0)
    first.step()
    first.engine.close()
    second = Node(REMAP, store=store(tmp_path, "boot-B"), start=first.clock.now() + 3600)
    second.step()
    second.set(0, remapped_rows_pending=1)  # back within 7 days, in another boot
    second.step()
    fired = {tr.rule: tr.severity for _, tr in second.transitions if tr.state.value == "firing"}
    assert fired == {"RemapPending": AlertSeverity.PAGE, "RemapPlain": AlertSeverity.TICKET}
    second.engine.close()
    later = Node(REMAP, store=store(tmp_path, "boot-C"), start=second.clock.now() + 8 * 86400)
    later.poll()  # resolved: the condition is gone
    later.set(0, remapped_rows_pending=1)  # the last fault is 8 days old: outside 'within'
    later.step()
    fired = {tr.rule: tr.severity for _, tr in later.transitions if tr.state.value == "firing"}
    assert fired == {"RemapPending": AlertSeverity.TICKET, "RemapPlain": AlertSeverity.TICKET}


def test_corrupt_database_is_rebuilt_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"this is not an SQLite database" * 100)
    with caplog.at_level(logging.WARNING, "gpuwatchd.rules.store"):
        n = Node(HOT, store=store(tmp_path))
    assert "is unusable" in caplog.text and "rebuilt" in caplog.text
    assert n.store.rebuilt
    assert any(name.startswith(DB_NAME + ".corrupt-") for name in os.listdir(state))
    n.set(0, temperature_gpu=99)
    n.run(70)
    assert n.firing() == {("Hot", "0")}
    n.engine.close()
    again = Node(HOT, store=store(tmp_path), start=n.clock.now() + 10)
    again.set(0, temperature_gpu=99)
    again.run(60)
    assert again.transitions == []  # the rebuilt database works


def test_a_database_from_another_schema_is_rebuilt(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    conn = sqlite3.connect(state / DB_NAME)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', '999')")
    conn.commit()
    conn.close()
    s = store(tmp_path)
    assert s.rebuilt
    assert s.load_alerts() == []


def test_missing_state_directory_is_created_and_an_unusable_one_falls_back_to_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    s = StateStore.in_state_dir(str(tmp_path / "a" / "b"), boot_id="x")
    assert os.path.exists(tmp_path / "a" / "b" / DB_NAME)
    s.close()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with caplog.at_level(logging.WARNING, "gpuwatchd.rules.store"):
        m = StateStore.in_state_dir(str(blocker / "state"), boot_id="x")
    assert m.memory and "kept in memory only" in caplog.text


def test_boot_id_is_read_from_the_kernel(tmp_path: Path) -> None:
    assert len(read_boot_id()) == 36  # a UUID on Linux
    assert read_boot_id(str(tmp_path / "nope")) == "unknown"


def test_lost_gpu_alert_state_persists_too(tmp_path: Path) -> None:
    rules = """
    rules:
    - name: Lost
      severity: page
      condition:
        gpu_status: {status: [lost]}
    """
    first = Node(rules, store=store(tmp_path))
    first.status[2] = GpuStatus.LOST
    first.step()
    first.engine.close()
    second = Node(rules, store=store(tmp_path), start=T0 + 100)
    second.status[2] = GpuStatus.LOST
    second.run(60)
    assert second.transitions == []
    assert second.firing() == {("Lost", "2")}


LEDGER_RULES = """
rules:
- name: GpuRowRemapPending
  severity: ticket
  condition:
    threshold: {field: remapped_rows_pending, op: '>', value: 0}
  escalate: {after: reboot, within: 7d, severity: page, drain: true}
- name: GpuEccUncorrectedRising
  severity: ticket
  condition:
    increase: {field: ecc_uncorrected_volatile, window: 1d}
- name: Hot
  severity: page
  condition:
    threshold: {field: temperature_gpu, op: '>', value: 85}
"""


def _ledger_rows(path: Path) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(
            "SELECT rule, gpu, uuid, kind, severity, drain FROM memory_ledger ORDER BY t, rowid"
        ).fetchall()
    finally:
        db.close()


def test_the_memory_ledger_keeps_every_memory_firing_across_restarts(tmp_path: Path) -> None:
    # Each firing of a memory rule or an uncorrectable error is one ledger row, with the
    # severity and drain it fired with (an escalation after a reboot is a page of its
    # own); a rule that is not about memory leaves none.
    first = Node(LEDGER_RULES, store=store(tmp_path, "boot-A"))
    first.set(1, remapped_rows_pending=1, temperature_gpu=95)
    first.step()
    first.set(2, ecc_uncorrected_volatile=1)
    first.step()
    first.engine.close()
    second = Node(LEDGER_RULES, store=store(tmp_path, "boot-B"), start=first.clock.now() + 900)
    second.set(1, remapped_rows_pending=1)
    second.step()
    second.set(1, remapped_rows_pending=0)
    second.run(600)
    second.set(1, remapped_rows_pending=2)  # the same series fires again: a second row
    second.run(600)
    second.engine.close()
    rows = _ledger_rows(tmp_path / "state" / DB_NAME)
    assert rows == [
        ("GpuRowRemapPending", "1", uuid_of(1), "memory", "ticket", 0),
        ("GpuEccUncorrectedRising", "2", uuid_of(2), "ue", "ticket", 0),
        ("GpuRowRemapPending", "1", uuid_of(1), "memory", "page", 1),  # escalated: rebooted
        ("GpuRowRemapPending", "1", uuid_of(1), "memory", "page", 1),  # fired again
    ]
    ledger = StateStore(str(tmp_path / "state" / DB_NAME), boot_id="r").load_ledger()
    assert ledger.since is not None and ledger.since <= T0 + 10 and ledger.cut is None
    assert len(ledger.entries) == 4 and not ledger.bad


def test_the_memory_ledger_is_pruned_by_age_and_by_count(tmp_path: Path) -> None:
    from gpuwatchd.rules.store import LEDGER_RETENTION, LedgerEntry

    s = StateStore(str(tmp_path / DB_NAME), boot_id="b", ledger_rows=3)
    day = 86400.0

    def entry(t: float, fp: str = "fp") -> LedgerEntry:
        return LedgerEntry(t, fp, "GpuRowRemapFailure", "0", "GPU-0", "memory", "page", True)

    assert s.save_alerts([], 0.0, [entry(0.0), entry(10 * day)])
    assert s.save_alerts([], 10 * day, [entry(10 * day)])  # a retried save: not twice
    assert [e.t for e in s.load_ledger().entries] == [0.0, 10 * day]
    s.trim(LEDGER_RETENTION + day)  # the first row is now too old
    got = s.load_ledger()
    assert [e.t for e in got.entries] == [10 * day] and got.cut == 0.0
    more = [entry(20 * day + i, f"fp{i}") for i in range(4)]
    assert s.save_alerts([], 21 * day, more)
    got = s.load_ledger()
    assert [e.t for e in got.entries] == [20 * day + i for i in (1, 2, 3)]
    assert got.cut == 20 * day  # the newest row dropped
    s.close()


def test_a_state_file_without_the_ledger_still_opens_and_gains_one(tmp_path: Path) -> None:
    # A rules.sqlite3 written before the ledger existed: same schema version, no table.
    first = Node(HOT, store=store(tmp_path))
    first.set(2, temperature_gpu=95)
    first.run(120)
    first.engine.close()
    path = tmp_path / "state" / DB_NAME
    db = sqlite3.connect(path)
    with db:
        db.execute("DROP TABLE memory_ledger")
        db.execute("DELETE FROM meta WHERE key LIKE 'ledger%'")
    db.close()
    old = StateStore(str(path), boot_id="boot-1")
    assert not old.rebuilt and old.load_ledger().since is None  # nothing recorded yet
    assert [a.rule for a in old.load_alerts()] == ["Hot"]  # the alert states are kept
    old.close()
    second = Node(HOT, store=store(tmp_path), start=first.clock.now() + 60)
    second.set(2, temperature_gpu=95)
    second.step()
    assert second.transitions == []  # still firing: no second page
    second.engine.close()
    ledger = StateStore(str(path), boot_id="r").load_ledger()
    assert ledger.since == second.clock.now() and ledger.entries == []
