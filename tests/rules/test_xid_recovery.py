"""Recovery on evidence (issue 22 item 7): the shipped GpuXidFatal, and the drain that follows
it, resolves only after evidence that the XID's action was taken (a GPU reset seen through
NVML, a new boot id), never after a quiet hour alone; the same XID back after a recovery
climbs GPU reset -> node reboot -> hardware inspection and the page says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from rulekit import Node, rules

from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.records import GpuInfo, GpuStatus
from gpuwatchd.rules.loader import parse_rules
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.rules.store import RecoveryRecord, StateStore

ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED = RuleSet(
    tuple(
        r
        for r in parse_rules(
            (ROOT / "gpuwatchd" / "data" / "rules" / "xid.yaml").read_text(), "xid.yaml"
        )
        if r.name == "GpuXidFatal"
    )
)


def fatal(n: Node) -> dict[str, str] | None:
    found = [a for a in n.engine.alerts() if a.rule == "GpuXidFatal" and a.state.value == "firing"]
    return dict(found[0].annotations) if found else None


def test_a_quiet_hour_is_not_a_recovery_a_gpu_reset_seen_through_nvml_is() -> None:
    n = Node(SHIPPED)
    n.poll()
    n.set(2, remapped_rows_pending=1.0)
    n.xid(2, 48)
    out = n.step()
    assert [(t.state.value, t.drain) for t in out] == [("firing", True)]
    n.run(6 * 3600, step=60)  # six quiet hours: before, it resolved after one
    notes = fatal(n)
    assert notes is not None and n.events("resolved") == []
    assert notes["recovery"].startswith("waiting for a GPU reset")
    n.set(2, remapped_rows_pending=0.0)  # the reset applied the pending remap
    n.step(60)
    fixed = n.t
    n.run(3 * 3600, step=60)
    resolved = n.events("resolved")
    assert len(resolved) == 1 and fixed + 3600 - 60 <= resolved[0][0] <= fixed + 3600 + 60


@pytest.mark.parametrize("how", ["lost_and_back", "recovery_action", "ecc_restart"])
def test_each_nvml_sign_of_a_reset_is_evidence(how: str) -> None:
    n = Node(SHIPPED)
    n.set(1, ecc_corrected_volatile=40.0)
    n.poll()
    n.xid(1, 95)
    n.step()
    n.run(600)
    if how == "lost_and_back":
        n.status[1] = GpuStatus.LOST
        n.step()
        n.run(120)
        assert fatal(n) is not None
        n.status[1] = GpuStatus.OK
    elif how == "recovery_action":
        n.set(1, recovery_action=1.0)
        n.run(120)
        assert fatal(n) is not None
        n.set(1, recovery_action=0.0)
    else:
        n.set(1, ecc_corrected_volatile=0.0)
    n.step()
    n.run(3700, step=60)
    assert n.firing() == set()


def test_a_node_reboot_is_what_clears_an_xid_79(tmp_path: Path) -> None:
    db = str(tmp_path / "rules.sqlite3")
    n = Node(SHIPPED, store=StateStore(db, boot_id="boot-1"))
    n.poll()
    n.xid(3, 79)
    n.status[3] = GpuStatus.LOST
    n.step()
    n.run(1800)
    n.status[3] = GpuStatus.OK  # the GPU answering again is not the reboot 79 needs
    n.run(3 * 3600, step=60)
    notes = fatal(n)
    assert notes is not None and notes["recovery"].startswith("waiting for a node reboot")
    n.engine.close()
    # the same node after a reboot that took two hours: the alert and the fault come back
    # from the state file, and the hour without the XID counts from the evidence
    again = Node(SHIPPED, store=StateStore(db, boot_id="boot-2"), start=n.clock.now() + 7200)
    again.poll()
    notes = fatal(again)
    assert notes is not None
    assert notes["recovery"] == (
        "recovered (the node rebooted (a new boot id)); resolves after 1h without XID 79"
    )
    again.run(3500, step=60)
    assert again.events() == []
    again.run(200, step=60)
    assert [e[2] for e in again.events()] == ["resolved"]


def test_the_same_xid_after_a_recovery_climbs_the_ladder(tmp_path: Path) -> None:
    db = str(tmp_path / "rules.sqlite3")
    n = Node(SHIPPED, store=StateStore(db, boot_id="boot-1"))
    n.poll()

    def reset(node: Node, gpu: int) -> None:
        node.status[gpu] = GpuStatus.ERROR
        node.step()
        node.status[gpu] = GpuStatus.OK
        node.step()
        node.run(3700, step=60)

    n.xid(0, 48)
    first = n.step()
    assert "back after" not in first[0].annotations["summary"]
    reset(n, 0)
    assert n.firing() == set()
    n.run(86400, step=600)
    n.xid(0, 48)  # back a day after the reset: now it needs a reboot
    again = n.step()
    assert [t.state.value for t in again] == ["firing"]
    page = again[0].annotations
    assert page["summary"].endswith("(back after a GPU reset: now needs node reboot)")
    assert page["action"].startswith("Reboot the node")
    reset(n, 0)  # a GPU reset no longer clears it
    assert fatal(n) is not None
    n.engine.close()
    n = Node(SHIPPED, store=StateStore(db, boot_id="boot-2"), start=n.clock.now() + 600)
    n.poll()
    n.run(3700, step=60)
    assert n.firing() == set()
    n.xid(0, 48)  # and back after the reboot: hardware inspection
    page = n.step()[0].annotations
    assert page["summary"].endswith("(back after a node reboot: now needs hardware inspection)")
    assert "RMA" in page["action"]
    n.engine.close()
    n = Node(SHIPPED, store=StateStore(db, boot_id="boot-3"), start=n.clock.now() + 600)
    n.poll()
    n.run(3 * 3600, step=60)
    notes = fatal(n)
    assert notes is not None and notes["recovery"].startswith("waiting for hardware inspection")


def test_a_return_after_the_escalation_window_starts_again() -> None:
    n = Node(SHIPPED)
    n.poll()
    n.xid(0, 48)
    n.step()
    n.status[0] = GpuStatus.LOST
    n.step()
    n.status[0] = GpuStatus.OK
    n.run(3700, step=60)
    n.clock.advance(8 * 86400)
    n.xid(0, 48)
    page = n.step()[0].annotations
    assert "back after" not in page["summary"]


def test_unreadable_saved_recoveries_are_skipped() -> None:
    store = StateStore(":memory:", boot_id="b")
    good = RecoveryRecord("GPU-1", -1, (48,), 10.0, "b", 0, 0, None, "", 0, None)
    assert store.save_recoveries("GpuXidFatal", [good])
    store._db().execute(
        "INSERT INTO xid_recoveries VALUES ('GpuXidFatal','GPU-2',-1,'{\"a\":1}',1.0,'b',0,0,"
        "NULL,'',0,NULL)"
    )
    store._db().execute(
        "INSERT INTO xid_recoveries VALUES ('GpuXidFatal','GPU-3',-1,'[48]','x','b',7,0,"
        "NULL,'',0,NULL)"
    )
    assert store.load_recoveries("GpuXidFatal") == ([good], 2)


def test_escalation_keys_need_recovery_evidence() -> None:
    with pytest.raises(ConfigError) as err:
        rules(
            """
            rules:
            - name: X
              severity: page
              condition:
                xid: {codes: [48], escalate_after: 2}
            """
        )
    assert "escalate_after: only with recovery: evidence" in str(err.value)


def test_status_says_what_a_held_fault_waits_for(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuwatchd.cli.main import _print_status

    n = Node(SHIPPED)
    n.poll()
    n.xid(3, 79)
    n.run(7200, step=60)
    alerts = [
        {
            "rule": a.rule,
            "severity": a.severity.value,
            "labels": dict(a.labels),
            "summary": a.annotations.get("summary"),
            "annotations": dict(a.annotations),
        }
        for a in n.engine.alerts()
    ]
    status = {
        "node": "node-a",
        "version": "x",
        "backend": "scenario",
        "gpus": [
            {"index": i, "pci_bus_id": info.pci_bus_id, "status": "ok", "readings": {}}
            for i, info in enumerate(n.infos)
        ],
        "sources": {},
        "alerts": alerts,
    }
    assert _print_status(status, [], False) == 1
    out = capsys.readouterr().out
    assert "GpuXidFatal [page] gpu=3: XID 79 on GPU 3" in out
    assert "      recovery: waiting for a node reboot (a new boot id); then it resolves" in out


def test_a_replaced_gpu_ends_the_alerts_of_the_one_that_left(tmp_path: Path) -> None:
    """Hardware inspection holds through resets and reboots; a new board (another UUID at
    the same PCI address) ends it, and every other alert of the board that left."""
    db = str(tmp_path / "rules.sqlite3")
    n = Node(SHIPPED, store=StateStore(db, boot_id="boot-1"))
    n.poll()
    n.xid(2, 79)
    n.step()
    n.engine.close()
    again = Node(SHIPPED, store=StateStore(db, boot_id="boot-1"), start=n.clock.now() + 60)
    old = again.infos[2]
    again.infos[2] = GpuInfo(
        2, "GPU-11111111-2222-3333-4444-555555555555", old.name, old.pci_bus_id
    )
    again.state.set_gpus(again.infos, again.clock.now())
    out = again.poll()
    assert [(t.rule, t.state.value, t.labels["uuid"]) for t in out] == [
        ("GpuXidFatal", "resolved", old.uuid)
    ]
    assert out[0].annotations["resolved_reason"].startswith("the GPU was replaced")
    assert again.firing() == set()
    again.engine.close()
    # a week and more later the fault of the board that left is forgotten too
    later = Node(
        SHIPPED, store=StateStore(db, boot_id="boot-2"), start=again.clock.now() + 8 * 86400
    )
    later.infos[2] = again.infos[2]
    later.state.set_gpus(later.infos, later.clock.now())
    later.poll()
    later.engine.close()
    assert StateStore(db, boot_id="boot-2").load_recoveries("GpuXidFatal") == ([], 0)


def test_the_drivers_xid_154_back_to_none_is_evidence_of_a_reset() -> None:
    n = Node(SHIPPED)
    n.poll()
    n.xid(1, 119, message="Timeout after 6s of waiting for RPC response from GPU1 GSP!")
    n.step()
    n.run(7200, step=60)
    assert fatal(n) is not None  # nothing NVML could show
    n.xid(1, 154, message="GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)")
    n.step()
    n.run(3700, step=60)
    assert n.firing() == set()
