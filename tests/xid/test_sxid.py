"""NVSwitch SXids: judged by what their line says, counted apart from XIDs (issue 22)."""

from __future__ import annotations

from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.exposition.metrics import build_families
from gpuwatchd.xid import Catalog
from gpuwatchd.xid.catalog import sxid_verdict


def test_the_line_says_whether_an_sxid_is_fatal() -> None:
    # real lines: tests/data/xid_lines.tsv and NVIDIA's Fabric Manager guide's form
    assert sxid_verdict("Fatal, Link 30 LTSSM Fault Up") == "fatal"
    assert sxid_verdict("Non-fatal, Link 44 Minion Link DLREQ interrupt") == "nonfatal"
    assert sxid_verdict("Data {0x0000002b, 0x0000002b}") == "detail"
    assert sxid_verdict("Severity 0 Engine instance 44 Sub-engine instance 00") == "detail"
    verdict = Catalog.default().classify(20034, "Fatal, Link 30 LTSSM Fault Up", "sxid")
    assert verdict.severity.value == "critical"


def test_sxids_are_counted_by_switch_and_verdict_not_as_xids() -> None:
    state = NodeState("n1", 0.0)
    state.count_sxid("00000000:04:00.0", "fatal")
    state.count_sxid("00000000:04:00.0", "detail", 2)
    out: list[str] = []
    for fam in build_families(state.view()):
        if fam.name in ("gpuwatchd_sxid_errors_total", "gpuwatchd_xid_errors_total"):
            fam.render(out)
    samples = sorted(line for line in "".join(out).splitlines() if line[0] != "#")
    assert samples == [
        'gpuwatchd_sxid_errors_total{pci_bus_id="00000000:04:00.0",verdict="detail"} 2.0',
        'gpuwatchd_sxid_errors_total{pci_bus_id="00000000:04:00.0",verdict="fatal"} 1.0',
    ]
