"""NVLink5 XIDs 144-150 judged by the verdict of their decoded registers, not by code.

NVIDIA's 144-150 decode rates each message by its IntrInfo/ErrorStatus registers: RESET_GPU
(fatal), IGNORE or XID_154_EVAL (not fatal on their own). The fatal rule pages and drains only
on a fatal (or undecodable) one; an NVML event, which has no registers, waits for its kernel
line; the exposition counts each report by verdict for the central twin rules.
"""

from __future__ import annotations

from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import XidEvent
from gpuwatchd.exposition.metrics import build_families
from gpuwatchd.sources.incidents import IncidentMerger
from gpuwatchd.testing.fake_backend import make_infos
from gpuwatchd.xid import Catalog
from gpuwatchd.xid.catalog import decoded_verdict, message_judged_codes

# Real lines (tests/data/xid_lines.tsv: gpud pull requests 1160, 1174 and kmsg_test.go).
NONFATAL_145 = (
    "RLW_RXPIPE Nonfatal XC0 i0 Link 13 "
    "(0x0409a0c2 0x00000008 0x00000001 0x00000000 0x00100000 0x00000004)"
)
FATAL_149 = (
    "NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 "
    "(0x021425c6 0x00000000 0x00000000 0x00000000 0x00000000 0x00000000)"
)
PCI = "00000000:3A:00.0"


def test_the_fatal_set_is_judged_by_the_decoded_verdict() -> None:
    catalog = Catalog.default()
    assert catalog.nvlink5_verdict(145, NONFATAL_145) == "nonfatal"
    assert catalog.nvlink5_verdict(149, FATAL_149) == "fatal"
    assert catalog.nvlink5_verdict(145, "") == "undecoded"
    assert not catalog.judged_fatal(145, NONFATAL_145)
    assert catalog.judged_fatal(149, FATAL_149)
    assert catalog.judged_fatal(145, "")  # cannot tell: stays in the fatal set
    assert catalog.judged_fatal(48, "") and not catalog.judged_fatal(31, "")
    assert not catalog.judged_fatal(24007, "Fatal, Link 01", kind="sxid")
    # an override pins the code whatever the registers say
    pinned = catalog.with_overrides({145: {"fatal": True}, 149: {"fatal": False}})
    assert pinned.judged_fatal(145, NONFATAL_145)
    assert not pinned.judged_fatal(149, FATAL_149)
    assert 145 not in pinned.verdict_codes() and 146 in pinned.verdict_codes()


def test_an_nvml_event_of_a_message_judged_code_waits_for_its_kernel_line() -> None:
    m = IncidentMerger(3.0, hold=message_judged_codes())
    up = {"kernel_up": True, "nvml_up": True}
    got = m.submit(XidEvent(10.0, "nvml", 145, pci_bus_id=PCI, gpu=2), 10.0, **up)
    assert got is None  # held: NVML cannot say whether it is fatal
    pair = m.submit(XidEvent(10.2, "kmsg", 145, pci_bus_id=PCI, message=NONFATAL_145), 10.2, **up)
    assert pair is not None
    assert (pair.source, pair.enriches, pair.message, pair.gpu) == (
        "kmsg+nvml",
        False,
        NONFATAL_145,
        2,
    )
    # no kernel line within the window: the NVML event goes out alone, then
    assert m.submit(XidEvent(20.0, "nvml", 149, pci_bus_id=PCI, gpu=2), 20.0, **up) is None
    late = m.expire(23.0)
    assert [(x.event.source, x.event.xid, x.emit, x.missing) for x in late] == [
        ("nvml", 149, True, "kernel")
    ]
    assert m.mismatch["kernel"] == 1
    # other codes keep first sight
    first = m.submit(XidEvent(30.0, "nvml", 48, pci_bus_id=PCI, gpu=2), 30.0, **up)
    assert first is not None and first.xid == 48


def test_decoded_reports_are_counted_by_verdict() -> None:
    assert decoded_verdict(145, NONFATAL_145) == "nonfatal"
    assert decoded_verdict(48, "") is None
    state = NodeState("n1", 0.0)
    state.set_gpus(make_infos(4), 0.0)
    state.count_xid(2, 145, verdict="nonfatal")
    state.count_xid(2, 145, verdict="nonfatal")
    state.count_xid(2, 149, verdict="fatal")
    out: list[str] = []
    for fam in build_families(state.view()):
        if fam.name == "gpuwatchd_xid_nvlink5_decoded_total":
            fam.render(out)
    samples = [line for line in "".join(out).splitlines() if line[0] != "#"]
    assert len(samples) == 2
    assert any('xid="145",verdict="nonfatal"} 2.0' in s for s in samples)
    assert any('xid="149",verdict="fatal"} 1.0' in s for s in samples)
