"""Issue 22 item 3, the rest: SXids named with the GPUs behind the switch (NVML's NVLink
remote PCI info), SXid lines without a severity word answered with a ticket, and the NVLink
fabric registration (``nvmlDeviceGetGpuFabricInfo*``) read on the slow cadence, once where
NOT_SUPPORTED, a GPU outside the fabric or in error paging."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import GPUWATCHD
from journal_util import append, kernel_entry, now
from rulekit import Node, uuid_of

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.records import GpuInfo, XidEvent
from gpuwatchd.rules.loader import parse_rules
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.sources.gpu.nvml import NvmlBackend
from gpuwatchd.sources.gpu.workerwire import WireError, info_from_wire, info_to_wire
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100
from gpuwatchd.xid.catalog import sxid_verdict

ROOT = Path(__file__).resolve().parent.parent.parent
SWITCH_A = "00000000:04:00.0"
SWITCH_B = "00000000:05:00.0"
FATAL = "Fatal, Link 30 LTSSM Fault Up"


def shipped(*names: str) -> RuleSet:
    found = []
    for f in ("xid.yaml", "nvlink.yaml"):
        text = (ROOT / "rules" / f).read_text()
        found += [r for r in parse_rules(text, f) if r.name in names]
    return RuleSet(tuple(found))


# -- NVML: fabric state and the NVLink topology ------------------------------------------------
def test_fabric_state_is_read_on_the_slow_cadence_and_once_where_not_supported() -> None:
    gpus = [h100(0), h100(1), h100(2), h100(3)]
    gpus[0].fabric = (3, 0)  # completed, success
    gpus[1].fabric = (2, 0)  # in progress
    gpus[2].fabric = (3, 23)  # completed with an error
    fake = FakeNvml(gpus)  # GPU 3: NOT_SUPPORTED (no NVSwitch fabric)
    clock = VirtualClock(1000.0)
    backend = NvmlBackend(clock, nvml=fake, slow_interval_s=60.0)
    backend.open()
    first = [backend.sample(i).fields for i in range(4)]
    assert [(f.get("fabric_state"), f.get("fabric_status")) for f in first] == [
        (3.0, 0.0),
        (2.0, None),  # NVML: the status means something only once completed
        (3.0, 23.0),
        (None, None),
    ]
    asked = fake.calls["nvmlDeviceGetGpuFabricInfoV"]
    assert asked == 4
    for _ in range(3):  # within the slow interval: carried, not asked again
        clock.advance(10.0)
        again = [backend.sample(i).fields for i in range(4)]
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == asked
    assert again[1]["fabric_state"] == 2.0
    gpus[1].fabric = (3, 0)
    clock.advance(60.0)
    later = [backend.sample(i).fields for i in range(4)]
    assert later[1]["fabric_state"] == 3.0 and later[1]["fabric_status"] == 0.0
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == asked + 3  # never GPU 3 again


def test_a_driver_without_the_versioned_getter_is_asked_the_plain_one() -> None:
    gpu = h100(0)
    gpu.fabric = (1, 0)
    fake = FakeNvml([gpu], missing_functions={"nvmlDeviceGetGpuFabricInfoV"})
    clock = VirtualClock(1000.0)
    backend = NvmlBackend(clock, nvml=fake, slow_interval_s=0.0)
    backend.open()
    for _ in range(3):
        assert backend.sample(0).fields["fabric_state"] == 1.0
        clock.advance(5.0)
    assert fake.calls["nvmlDeviceGetGpuFabricInfoV"] == 1
    assert fake.calls["nvmlDeviceGetGpuFabricInfo"] == 3


def test_the_switches_behind_each_gpu_are_read_once_at_open_and_cross_the_worker_wire() -> None:
    gpus = [h100(i, nvlink=True) for i in range(3)]
    for link in range(18):
        gpus[0].nvlink_remote[link] = SWITCH_A if link < 9 else SWITCH_B
        gpus[1].nvlink_remote[link] = SWITCH_B
    fake = FakeNvml(gpus)  # GPU 2: NVML does not say
    infos = NvmlBackend(VirtualClock(0.0), nvml=fake).open()
    assert [i.nvlink_peers for i in infos] == [(SWITCH_A, SWITCH_B), (SWITCH_B,), ()]
    back = info_from_wire(json.loads(json.dumps(info_to_wire(infos[0]))))
    assert back == infos[0] and isinstance(back.nvlink_peers, tuple)
    with pytest.raises(WireError):
        info_from_wire({**info_to_wire(infos[0]), "nvlink_peers": [1, 2]})


# -- rules ---------------------------------------------------------------------------------------
def test_a_gpu_outside_the_fabric_or_in_error_pages_one_without_fabric_never() -> None:
    n = Node(shipped("GpuFabricIncomplete", "GpuFabricError"))
    for g in range(4):
        n.fields[g].pop("fabric_state", None)
    n.set(0, fabric_state=3.0, fabric_status=0.0)
    n.set(1, fabric_state=2.0)  # still registering
    n.set(2, fabric_state=3.0, fabric_status=23.0)  # completed with an error
    n.poll()
    assert n.firing() == {("GpuFabricError", "2")}
    n.run(600)
    assert n.firing() == {("GpuFabricError", "2"), ("GpuFabricIncomplete", "1")}
    assert {t.severity.value for _, t in n.transitions} == {"page"}


def sxid(n: Node, message: str, switch: str = SWITCH_A, code: int = 20034) -> None:
    n.engine.observe(
        XidEvent(n.clock.now(), "journald", code, kind="sxid", pci_bus_id=switch, message=message)
    )


def test_a_fatal_sxid_names_the_gpus_behind_its_switch() -> None:
    n = Node(shipped("NvswitchSxidFatal"))
    peers = [(SWITCH_A,), (SWITCH_A, SWITCH_B), (SWITCH_B,), ()]
    n.infos = [GpuInfo(i.index, i.uuid, i.name, i.pci_bus_id, nvlink_peers=peers[i.index])
               for i in n.infos]  # fmt: skip
    n.state.set_gpus(n.infos, n.clock.now())
    n.poll()
    sxid(n, FATAL)
    out = n.step()
    assert [t.annotations["summary"] for t in out] == [
        f"Fatal SXid 20034 on NVSwitch {SWITCH_A} (GPUs 0, 1 behind it) of node-a: {FATAL}"
    ]
    assert out[0].drain
    n.run(7200, step=60)
    sxid(n, FATAL, switch="00000000:0A:00.0")  # a switch no GPU names: the node alone
    out = n.step()
    assert (
        out[0].annotations["summary"].startswith("Fatal SXid 20034 on NVSwitch 00000000:0A:00.0 of")
    )
    assert uuid_of(0) not in out[0].labels.values()  # still the node's alert


def test_an_sxid_line_without_a_severity_word_is_a_ticket() -> None:
    assert sxid_verdict("SOE HALTED") == "unrated"
    assert sxid_verdict("Data {0x0000002b, 0x0000002b}") == "detail"
    assert sxid_verdict("Severity 0 Engine instance 44 Sub-engine instance 00") == "detail"
    n = Node(shipped("NvswitchSxidFatal", "NvswitchSxidRepeated", "NvswitchSxidUnrated"))
    n.poll()
    sxid(n, "SOE HALTED", code=26006)
    sxid(n, "Data {0x0000002b, 0x0000002b}", code=26006)
    out = n.step()
    assert [(t.rule, t.severity.value, t.drain) for t in out] == [
        ("NvswitchSxidUnrated", "ticket", False)
    ]
    assert (
        out[0].annotations["summary"] == f"SXid 26006 on NVSwitch {SWITCH_A} of node-a: SOE HALTED"
    )


def test_xid_scan_rates_sxid_lines_from_journal_files(tmp_path: Path) -> None:
    t = now() - 600
    head = "nvidia-nvswitch1: SXid (PCI:0000:04:00.0): "
    append(
        tmp_path / "j",
        [
            kernel_entry(head + "26006, SOE HALTED", t),
            kernel_entry(head + "20034, " + FATAL, t + 1),
            kernel_entry(
                head + "20034, Severity 1 Engine instance 30 Sub-engine instance 00", t + 2
            ),
        ],
    )
    result = subprocess.run(
        [*GPUWATCHD, "xid", "scan", "--journal", str(tmp_path / "j")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["kind"], r["xid"], r["severity"]) for r in reports] == [
        ("sxid", 26006, "warning"),
        ("sxid", 20034, "critical"),
        ("sxid", 20034, "unknown"),
    ]


def test_an_sxid_page_carries_no_terminal_escape() -> None:
    n = Node(shipped("NvswitchSxidUnrated"))
    n.poll()
    sxid(n, "SOE \x1b[2J\x07HALTED", code=26006)
    out = n.step()
    assert out[0].annotations["summary"].endswith(": SOE \\x1b[2J\\x07HALTED")
