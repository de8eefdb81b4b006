"""``gpuwatchd xid parse`` and ``xid explain``, driven through an argparse parser."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuwatchd.cli import xid as cli_xid

DATA = Path(__file__).parent.parent / "data"
KEYS = ["kind", "pci", "xid", "pid", "process", "message", "severity", "action"]


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gpuwatchd")
    sub = parser.add_subparsers(dest="command", required=True)
    cli_xid.add_parser(sub)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def json_lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def test_parse_a_real_log(capsys: pytest.CaptureFixture[str]) -> None:
    """A whole captured `dmesg --decode` log: one object per XID line, nothing else."""
    assert run(["xid", "parse", str(DATA / "xid_capture_h200_dmesg_x.txt")]) == 0
    out = json_lines(capsys.readouterr().out)
    assert [list(o) for o in out] == [KEYS] * 3
    assert out[1] == {
        "kind": "xid",
        "pci": "00000000:00:06.0",
        "xid": 31,
        "pid": 422,
        "process": "ray::Wkr[0]",
        "message": "channel 0x0000000a, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC1 "
        "GPCCLIENT_T1_8 faulted @ 0x0_00000000. Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
        "severity": "info",
        "action": "restart_app",
    }


def test_parse_mixed_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Lines from tests/data/xid_lines.tsv (sources there) and NVSentinel#155.
    log = tmp_path / "kern.log"
    log.write_text(
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: "
        "GPU-509665ad-b600-ac93-3616-d754b23d636d\n"
        "Mar 29 15:38:59 kernel: NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed "
        "from 0x0 (None) to 0x1 (GPU Reset Required)\n"
        "syslog:err   : 2025-05-27T04:18:56,089671+00:00 NVRM: Xid (PCI:0000:04:00): 79, "
        "GPU has fallen off the bus\n"
        "[   38.178720] nvidia-nvswitch3: SXid (PCI:0000:04:00.0): 22013, Non-fatal, Link 44 "
        "Minion Link DLREQ interrupt\n"
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n"
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
        "               NVRM: fallen off the bus and is not responding to commands.\n"
        "4,1227,437812449,c;NVRM: Xid (PCI:0000:01:00): 43, pid=1814139, name=cuda_assert_64b, "
        "Ch 00000018\n",
        encoding="utf-8",
    )
    assert run(["xid", "parse", str(log)]) == 0
    out = json_lines(capsys.readouterr().out)
    summary = [(o["kind"], o["xid"], o["pci"], o["severity"], o["action"]) for o in out]
    assert summary == [
        ("xid", 154, "00000000:01:00.0", "critical", "reset_gpu"),
        ("sxid", 22013, "00000000:04:00.0", "warning", "investigate"),
        ("fallen_off_bus", 79, "00000000:B3:00.0", "critical", "reboot_node"),
        ("xid", 43, "00000000:01:00.0", "info", "none"),
    ]


def test_parse_survives_bad_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "binary.log"
    log.write_bytes(
        b"\xff\xfe garbage \x00\n"
        b"NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
        b"\x80\x81\n"
    )
    assert run(["xid", "parse", str(log)]) == 0
    (only,) = json_lines(capsys.readouterr().out)
    assert only["xid"] == 79 and only["action"] == "reboot_node"


def test_parse_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["xid", "parse", str(tmp_path / "nope.log")]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "gpuwatchd xid parse: cannot read" in captured.err and "nope.log" in captured.err


def test_parse_reads_stdin() -> None:
    """Through the real entry point: kernel-log lines on stdin, JSON lines on stdout."""
    lines = (DATA / "xid_capture_h200_kmsg.txt").read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "xid", "parse"],
        input=lines,
        capture_output=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
    out = json_lines(result.stdout.decode())
    assert [(o["pid"], o["process"]) for o in out] == [
        (415, "xidprobe"),
        (422, "ray::Wkr[0]"),
        (432, "py:gpu[main]"),
    ]


def test_explain_text(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["xid", "explain", "79"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("XID 79: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS\n")
    assert "GPU has fallen off the bus" in out
    assert "Severity:         critical" in out
    assert "Action:           reboot_node: Reboot the node." in out
    assert "RESTART_BM" in out and "Restart bare metal" in out
    assert "fallen_off_bus" in out
    assert "Trigger conditions (NVIDIA):" in out


def test_explain_154_lists_recovery_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["xid", "explain", "154"]) == 0
    out = capsys.readouterr().out
    assert "0x2  NODE_REBOOT" in out and "critical, reboot_node" in out
    assert "0x0  NONE" in out and "info, none" in out


def test_explain_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["xid", "explain", "48", "--json"]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["xid"] == 48
    assert entry["mnemonic"] == "ROBUST_CHANNEL_GPU_ECC_DBE"
    assert (entry["severity"], entry["action"]) == ("critical", "reset_gpu")
    assert entry["applies_to"] == {"A100": True, "H100": True, "B100": True, "GB200": True}
    assert entry["immediate"] == "WORKFLOW_XID_48" and entry["immediate_text"]

    assert run(["xid", "explain", "154", "--json"]) == 0
    e154 = json.loads(capsys.readouterr().out)
    codes = [(a["code"], a["nvml_name"], a["action"]) for a in e154["recovery_actions"]]
    assert codes[:3] == [
        (0, "NONE", "none"),
        (1, "GPU_RESET", "reset_gpu"),
        (2, "NODE_REBOOT", "reboot_node"),
    ]

    assert run(["xid", "explain", "149", "--json"]) == 0
    e149 = json.loads(capsys.readouterr().out)
    assert len(e149["decode_rules"]) == 31
    assert e149["decode_rules"][0]["subcode"] == "NETIR/NETIR_INT"


def test_explain_unknown_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["xid", "explain", "173"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "gpuwatchd xid explain: XID 173 is not in NVIDIA's XID catalog (172 codes, 1-172)\n"
        "gpuwatchd xid explain: a report of it is answered by: GpuXidUnclassified (ticket, "
        "a code the catalog does not list)\n"
    )


def test_every_code_has_an_answer() -> None:
    """Issue 22: no XID code goes unanswered by the shipped rules; the codes the catalog
    gives no bucket (162-172) and unknown codes open a ticket and are named by explain."""
    import argparse

    from gpuwatchd.cli.xid import answering_rules
    from gpuwatchd.xid import Catalog

    catalog = Catalog.default()
    args = argparse.Namespace(config=None)
    silent = [c for c in (*catalog.codes(), 173, 185, 999) if not answering_rules(c, args, catalog)]
    # NVIDIA's own answer for these is "no action" (IGNORE; 45 follows the XID it cleans up
    # after)
    no_action = {"IGNORE", "WORKFLOW_XID_45"}
    assert [
        c for c in silent if (e := catalog.lookup(c)) is None or e.immediate not in no_action
    ] == []
    for code in (162, 167, 169, 171, 172, 185):
        assert answering_rules(code, args, catalog)[0].startswith("GpuXidUnclassified (ticket")
    assert answering_rules(154, args, catalog)[0].startswith(
        "GpuRecoveryActionRequired (page, drains"
    )


def test_explain_rejects_non_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run(["xid", "explain", "seventy-nine"])
    assert exc.value.code == 2
    assert "invalid int value" in capsys.readouterr().err


def test_xid_needs_a_subcommand() -> None:
    with pytest.raises(SystemExit) as exc:
        run(["xid"])
    assert exc.value.code == 2


def test_config_overrides_change_severity_and_action(tmp_path: Path) -> None:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text("xid:\n  overrides:\n    63: {severity: critical, action: reset_gpu}\n")
    line = "NVRM: Xid (PCI:0000:3b:00): 63, pid=1, name=x, Row Remapper: New row marked\n"
    out = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "xid", "parse", "-c", str(config)],
        input=line,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    report = json.loads(out)
    assert (report["severity"], report["action"]) == ("critical", "reset_gpu")
    bad = tmp_path / "bad.yaml"
    bad.write_text("xid:\n  overrides:\n    63: {severity: fatal}\n")
    result = subprocess.run(
        [sys.executable, "-m", "gpuwatchd", "xid", "parse", "-c", str(bad)],
        input=line,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1 and result.stderr.startswith(f"{bad}:3:20: ")


def test_docs_table_lists_every_code_answered_otherwise_than_its_bucket() -> None:
    """docs/xid.md's table of differences from NVIDIA's catalog is complete and exact."""
    import argparse
    import re
    from pathlib import Path

    from gpuwatchd.cli.xid import answering_rules
    from gpuwatchd.xid import Catalog

    catalog = Catalog.default()
    args = argparse.Namespace(config=None)
    # the plain answer of a bucket: what a reader of NVIDIA's bucket alone would expect
    plain = {
        "CONTACT_SUPPORT": {"GpuXidInvestigate"},
        "UPDATE_SWFW": {"GpuXidInvestigate"},
        "CHECK_UVM": {"GpuXidInvestigate"},
        "RESTART_APP": {"GpuXidApplication"},
        "IGNORE": set(),
        "WORKFLOW_XID_45": set(),
    }
    differ = set()
    for code in catalog.codes():
        entry = catalog.lookup(code)
        assert entry is not None
        rules = {r.split(" (")[0] for r in answering_rules(code, args, catalog)}
        if plain.get(entry.immediate) != rules:
            differ.add(code)
    doc = (Path(__file__).resolve().parent.parent.parent / "docs" / "xid.md").read_text()
    section = doc.split("## Where gpuwatchd's decision differs from NVIDIA's catalog")[1]
    section = section.split("\n## ")[0]
    listed: set[int] = set()
    for line in section.splitlines():
        if not line.startswith("| ") or "not in the catalog" in line or line.startswith("| codes"):
            continue
        first = line.split("|")[1]
        for a, b in re.findall(r"(\d+)-(\d+)", first):
            listed |= set(range(int(a), int(b) + 1))
        listed |= {int(n) for n in re.findall(r"(?<![-\d])(\d+)(?![-\d])", first)}
    assert listed == differ
