"""MIG-attributed XIDs: ``NVRM: Xid (PCI:0000:3b:00 GPU-I:02 GPU-CI:00): 94, ...``.

The driver writes the instance inside the parentheses (open-gpu-kernel-modules,
src/nvidia/src/kernel/gpu/rc/kernel_rc.c, XID_PRINT_WITH_ATTR). Such a record is genuine on
every path (kmsg, journald, ``xid scan``), keeps its instance ids, counts under its own
metric labels and names the instance on the page; it is never counted as forged.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import GPUWATCHD, ROOT, need_binary
from journal_util import append, kernel_entry, now

from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import XidEvent
from gpuwatchd.exposition.metrics import build_families
from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler
from gpuwatchd.testing.fake_backend import make_infos

# make_infos(8) puts GPU 2 at bus 3A.
MIG_CI = (
    "NVRM: Xid (PCI:0000:3a:00 GPU-I:02 GPU-CI:00): 94, pid=4242, name=python3, "
    "Contained: SM (0x1). RST: No, D-RST: No"
)
MIG_GI = (
    "NVRM: Xid (PCI:0000:3a:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). "
    "RST: No, D-RST: No"
)


def test_trusted_mig_records_become_events_with_their_instance() -> None:
    events: list[XidEvent] = []
    handler = KernelLineHandler("kmsg", GpuResolver(make_infos(8)), events)
    handler.handle(MIG_CI, 10.0, True)
    handler.handle(MIG_GI, 11.0, True)
    assert [(e.xid, e.gpu, e.gpu_instance, e.compute_instance, e.pid) for e in events] == [
        (94, 2, 2, 0, 4242),
        (94, 2, 5, None, 7194),
    ]
    assert handler.counters.forged == 0
    assert handler.counters.xids == 2
    assert events[0].as_dict()["gpu_instance"] == 2
    assert events[0].as_dict()["compute_instance"] == 0


def test_mig_text_a_user_wrote_is_still_forged() -> None:
    events: list[XidEvent] = []
    handler = KernelLineHandler("journald", GpuResolver(make_infos(8)), events)
    handler.handle(MIG_CI, 10.0, False)  # user transport
    handler.handle("tmpfs: Unknown parameter '" + MIG_CI + "'", 11.0, True)  # echoed
    assert events == []
    assert handler.counters.forged == 2


def scan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, "xid", "scan", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
        timeout=60,
    )


def test_scan_kmsg_keeps_mig_records(tmp_path: Path) -> None:
    dump = tmp_path / "kmsg.txt"
    dump.write_text(f"4,10,5000000,-;{MIG_CI}\n SUBSYSTEM=pci\n4,11,5000100,-;{MIG_GI}\n")
    result = scan("--kmsg", str(dump))
    assert result.returncode == 0, result.stderr
    reports = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["xid"], r.get("gpu_instance"), r.get("compute_instance")) for r in reports] == [
        (94, 2, 0),
        (94, 5, None),
    ]
    assert "2 trusted XID reports, 0 forged XID lines ignored" in result.stderr


def test_scan_journal_keeps_mig_records(tmp_path: Path) -> None:
    append(tmp_path / "j", [kernel_entry(MIG_CI, now() - 60)])
    result = scan("--journal", str(tmp_path / "j"))
    assert result.returncode == 0, result.stderr
    (report,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (report["gpu_instance"], report["compute_instance"]) == (2, 0)
    assert "0 forged XID lines ignored" in result.stderr


def test_parse_cli_prints_the_instance() -> None:
    result = subprocess.run(
        [*GPUWATCHD, "xid", "parse"],
        input=f"[ 8812.104021] {MIG_CI}\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=60,
    )
    (report,) = [json.loads(line) for line in result.stdout.splitlines()]
    assert (report["xid"], report["gpu_instance"], report["compute_instance"]) == (94, 2, 0)


def test_metrics_count_mig_reports_per_instance() -> None:
    state = NodeState("n1", 0.0)
    state.set_gpus(make_infos(4), 0.0)
    state.count_xid(2, 94, gpu_instance=2, compute_instance=0)
    state.count_xid(2, 94, gpu_instance=2, compute_instance=0)
    state.count_xid(2, 94, gpu_instance=5)
    state.count_xid(2, 94)
    state.count_xid(1, 79)
    fams = build_families(state.view())
    out: list[str] = []
    for fam in fams:
        if fam.name == "gpuwatchd_xid_errors_total":
            fam.render(out)
    text = "".join(out)
    series = dict(line.rsplit(" ", 1) for line in text.splitlines() if line[0] != "#")
    mig = {k: v for k, v in series.items() if "gpu_instance" in k}
    assert sorted(mig.values()) == ["1.0", "2.0"]
    assert any('xid="94",gpu_instance="2",compute_instance="0"' in k for k in mig)
    assert any('xid="94",gpu_instance="5",compute_instance=""' in k for k in mig)
    whole = [v for k, v in series.items() if 'xid="94"' in k and "gpu_instance" not in k]
    assert whole == ["1.0"]  # the sum over the family is still the number of reports
    promtool = need_binary("promtool")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
