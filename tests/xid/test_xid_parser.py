"""The XID line parser, on real kernel-log lines (tests/data/xid_lines.tsv cites each one)."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.core.records import XidEvent
from gpuwatchd.xid import (
    FALLEN_OFF_BUS_XID,
    ParsedXid,
    XidStream,
    normalize_pci,
    parse_gpu_identity,
    parse_kmsg_record,
    parse_line,
)

DATA = Path(__file__).parent.parent / "data"
CAPTURE_UUID = "GPU-5bd74941-55a1-07ff-7fbd-ea8a94f1b1c9"  # the lent H200 of the captures


def load_rows() -> list[dict[str, Any]]:
    with (DATA / "xid_lines.tsv").open(encoding="utf-8", newline="") as f:
        lines = [line for line in f if not line.startswith("#")]
    rows = list(csv.DictReader(lines, delimiter="\t", quoting=csv.QUOTE_NONE))
    for row in rows:
        row["expected"] = json.loads(row["expected"])
    return rows


ROWS = load_rows()


def test_data_file_cites_a_source_for_every_line() -> None:
    assert len(ROWS) >= 70
    for row in ROWS:
        assert row["source_url"].startswith(("https://", "local:tests/data/xid_capture_h200_"))
        if row["source_url"].startswith("local:"):
            assert (DATA / row["source_url"].split("/")[-1]).is_file()


@pytest.mark.parametrize("row", ROWS, ids=[f"line{i + 1}" for i in range(len(ROWS))])
def test_real_line(row: dict[str, Any]) -> None:
    found = parse_line(row["line"])
    if row["expected"] is None:
        assert found is None
        return
    assert found is not None
    assert found.as_dict() == row["expected"]
    assert found.raw == row["line"]
    assert found.uuid is None


# Every line form the parser promises to read must appear among the real lines.
FORMS: dict[str, Callable[[str, dict[str, Any]], bool]] = {
    "bare": lambda line, e: line.startswith("NVRM: Xid"),
    "dmesg [seconds]": lambda line, e: line.startswith("[") and line[1:2] in " 0123456789",
    "dmesg -T": lambda line, e: line.startswith("[") and line[1:4].isalpha(),
    "dmesg --decode": lambda line, e: line.startswith("kern  :") and "[" in line,
    "dmesg --decode ISO": lambda line, e: line.startswith("kern  :") and "T" in line[15:30],
    "syslog with host": lambda line, e: " Gipfeli kernel: " in line,
    "syslog single-digit day": lambda line, e: line[3:5] == "  ",
    "syslog without host": lambda line, e: line[:3].isalpha() and line[15:24] == " kernel: ",
    "kernel: tag": lambda line, e: line.startswith("kernel: "),
    "dmesg -r priority": lambda line, e: line.startswith("<4>"),
    "/dev/kmsg record": lambda line, e: line[:2] == "4,",
    "old driver, no PCI:": lambda line, e: "Xid (0000:" in line,
    "PCI domain other than 0": lambda line, e: not e["pci"].startswith("00000000:"),
    "device number other than 0": lambda line, e: e["pci"][12:14] not in ("00",),
    "pid='<unknown>'": lambda line, e: "pid='<unknown>'" in line,
    "pid without a name": lambda line, e: e["pid"] is not None and e["process"] is None,
    "name with colons": lambda line, e: ":" in (e["process"] or ""),
    "name with brackets": lambda line, e: "[" in (e["process"] or ""),
    "runs of spaces (NVLink5)": lambda line, e: e["xid"] in range(144, 151) and "  " in line,
    "Ch 0000... wording": lambda line, e: e["message"].startswith("Ch 0000"),
    "channel 0x... wording": lambda line, e: e["message"].startswith("channel 0x"),
    "SXid": lambda line, e: e["kind"] == "sxid",
    "fallen off the bus, no Xid": lambda line, e: e["kind"] == "fallen_off_bus",
    "XID 154": lambda line, e: e["xid"] == 154,
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_promised_form_has_a_real_line(form: str) -> None:
    matches = [r for r in ROWS if r["expected"] and FORMS[form](r["line"], r["expected"])]
    assert matches, f"no real line in xid_lines.tsv shows the form {form!r}"


def test_user_space_lines_are_refused() -> None:
    refused = [r for r in ROWS if r["expected"] is None and "refused" in r["note"]]
    assert len(refused) >= 4
    forged = next(r for r in ROWS if r["line"].startswith("syslog:err"))
    assert parse_line(forged["line"]) is None  # gpud's inject-fault line: facility syslog


def test_pci_normalisation() -> None:
    assert normalize_pci("0000", "3b", "00") == "00000000:3B:00.0"
    assert normalize_pci("0019", "1", "0", "0") == "00000019:01:00.0"
    assert normalize_pci("c3b5", "ff", "1f", "7") == "0000C3B5:FF:1F.7"


def test_gpu_identity_lines() -> None:
    cases = {
        "[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00: "
        "GPU-509665ad-b600-ac93-3616-d754b23d636d": (
            "00000000:9B:00.0",
            "GPU-509665ad-b600-ac93-3616-d754b23d636d",
        ),
        "[…] NVRM: GPU at 0000:03:00: GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7": (
            "00000000:03:00.0",
            "GPU-b850f46d-d5ea-c752-ddf3-c4453e44d3f7",
        ),
        "4,358,24122025,c;NVRM: GPU at PCI:0000:00:06: " + CAPTURE_UUID: (
            "00000000:00:06.0",
            CAPTURE_UUID,
        ),
    }
    for line, (pci, uuid) in cases.items():
        assert line in {r["line"] for r in ROWS}
        ident = parse_gpu_identity(line)
        assert ident is not None
        assert (ident.pci, ident.uuid) == (pci, uuid)
    assert parse_gpu_identity("NVRM: GPU Board Serial Number: 1650124014249") is None
    assert parse_gpu_identity("12,358,1,c;NVRM: GPU at PCI:0000:00:06: " + CAPTURE_UUID) is None


# -- /dev/kmsg ---------------------------------------------------------------------------
def test_kmsg_record_fields() -> None:
    rec = parse_kmsg_record(
        "4,360,24122037,c;NVRM: Xid (PCI:0000:00:06): 31, pid=415, name=xidprobe\n"
    )
    assert rec is not None
    assert (rec.facility, rec.level, rec.seq, rec.usec) == (0, 4, 360, 24122037)
    assert rec.message == "NVRM: Xid (PCI:0000:00:06): 31, pid=415, name=xidprobe"
    user = parse_kmsg_record("12,360,24122037,c;NVRM: Xid (PCI:0000:00:06): 31")
    assert user is not None and (user.facility, user.level) == (1, 4)
    extra = parse_kmsg_record("4,1227,437812449,c,1,-;NVRM: Xid (PCI:0000:01:00): 43")
    assert extra is not None and extra.message == "NVRM: Xid (PCI:0000:01:00): 43"
    assert parse_kmsg_record(" SUBSYSTEM=pci") is None
    assert parse_kmsg_record("[   24.122037] NVRM: Xid (PCI:0000:00:06): 31") is None


def test_kmsg_capture_reads_whole() -> None:
    """Every record of a real /dev/kmsg dump parses; its XIDs are exactly the three faults."""
    records = []
    found = []
    for line in (DATA / "xid_capture_h200_kmsg.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith(" "):  # dictionary line (SUBSYSTEM=, DEVICE=) of the record above
            assert parse_kmsg_record(line) is None
            continue
        rec = parse_kmsg_record(line)
        assert rec is not None, line
        records.append(rec)
        if rec.facility == 0 and (hit := parse_line(rec.message)) is not None:
            found.append(hit)
    seqs = [r.seq for r in records]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {r.facility for r in records} == {0}
    tabbed = [r for r in records if r.message.startswith("\t")]
    assert tabbed, "the kernel's \\x09 escape comes back as a tab"
    assert [(f.xid, f.pid, f.process) for f in found] == [
        (31, 415, "xidprobe"),
        (31, 422, "ray::Wkr[0]"),
        (31, 432, "py:gpu[main]"),
    ]


def test_kmsg_escaped_newlines_join_a_multiline_printk() -> None:
    # NVSentinel#155's three-line "fallen off the bus" printk, as /dev/kmsg escapes it
    # (one record; the kernel writes control characters as \xNN, see the \x09 records in
    # xid_capture_h200_kmsg.txt).
    raw = (
        "3,1843,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0a"
        "NVRM: (PCI ID: 10de:26b5) installed in this system has\\x0a"
        "NVRM: fallen off the bus and is not responding to commands."
    )
    rec = parse_kmsg_record(raw)
    assert rec is not None and rec.message.count("\n") == 2
    found = parse_line(raw)
    assert found is not None
    assert (found.kind, found.pci, found.xid) == ("fallen_off_bus", "00000000:B3:00.0", 79)
    assert found.message == (
        "The NVIDIA GPU 0000:b3:00.0 (PCI ID: 10de:26b5) installed in this system has fallen"
        " off the bus and is not responding to commands."
    )


# -- multi-line and stateful -------------------------------------------------------------
# https://github.com/NVIDIA/NVSentinel/issues/155 (dmesg)
NVSENTINEL_155 = """\
[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0
               NVRM: (PCI ID: 10de:26b5) installed in this system has
               NVRM: fallen off the bus and is not responding to commands.
[ 1843.439662] NVRM: The NVIDIA probe routine failed for 1 device(s).
[ 1843.439669] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  (dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025
"""  # noqa: E501


def test_stream_joins_dmesg_multiline_fallen_off_bus() -> None:
    stream = XidStream()
    found = [f for line in NVSENTINEL_155.splitlines() if (f := stream.feed(line))]
    assert len(found) == 1
    (hit,) = found
    assert (hit.kind, hit.pci, hit.xid) == ("fallen_off_bus", "00000000:B3:00.0", 79)
    assert hit.xid == FALLEN_OFF_BUS_XID
    assert hit.raw == "\n".join(NVSENTINEL_155.splitlines()[:3])
    assert "installed in this system has fallen off the bus" in hit.message
    # each line alone is not enough
    assert all(parse_line(line) is None for line in NVSENTINEL_155.splitlines())


def test_stream_forgets_an_unfinished_multiline_printk() -> None:
    stream = XidStream()
    lines = NVSENTINEL_155.splitlines()
    assert stream.feed(lines[0]) is None
    for _ in range(5):
        assert stream.feed("[ 1843.400000] eth0: link up") is None
    assert stream.feed(lines[2]) is None


def test_journald_message_with_newlines_is_one_report() -> None:
    # The same printk as one journald MESSAGE (the first line's dmesg time removed).
    message = "\n".join(line.strip() for line in NVSENTINEL_155.splitlines()[:3])[15:]
    found = parse_line(message)
    assert found is not None and found.kind == "fallen_off_bus"
    assert found.pci == "00000000:B3:00.0"


@pytest.mark.parametrize(
    "name", ["dmesg", "dmesg_T", "dmesg_x", "dmesg_x_iso", "dmesg_r", "kmsg"], ids=str
)
def test_captured_logs_end_to_end(name: str) -> None:
    """A whole real log in each format: the three XIDs, with the driver-announced UUID."""
    path = DATA / f"xid_capture_h200_{name}.txt"
    stream = XidStream()
    found = [
        f for line in path.read_text(encoding="utf-8").splitlines() if (f := stream.feed(line))
    ]
    assert [(f.kind, f.pci, f.xid, f.pid, f.process, f.uuid) for f in found] == [
        ("xid", "00000000:00:06.0", 31, 415, "xidprobe", CAPTURE_UUID),
        ("xid", "00000000:00:06.0", 31, 422, "ray::Wkr[0]", CAPTURE_UUID),
        ("xid", "00000000:00:06.0", 31, 432, "py:gpu[main]", CAPTURE_UUID),
    ]
    assert dict(stream.uuids) == {"00000000:00:06.0": CAPTURE_UUID}
    assert all(f.message.startswith("channel 0x0000000a, intr 00000000. MMU Fault") for f in found)


def test_to_event() -> None:
    found = parse_line(next(r["line"] for r in ROWS if "name=VLLM::Worker" in r["line"]))
    assert found is not None
    event = found.to_event(1700000000.5, "kmsg")
    assert event == XidEvent(
        timestamp=1700000000.5,
        source="kmsg",
        xid=45,
        kind="xid",
        pci_bus_id="00000000:01:00.0",
        uuid=None,
        pid=12542,
        process="VLLM::Worker",
        message="channel 0x00000002",
        trusted=True,
    )


def test_line_endings_and_trailing_space() -> None:
    line = "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus."
    for ending in ("\n", "\r\n"):
        found = parse_line(line + ending)
        assert found is not None and found.raw == line and found.message.endswith("bus.")


# -- robustness --------------------------------------------------------------------------
def _check(text: str) -> None:
    found = parse_line(text)
    assert found is None or isinstance(found, ParsedXid)
    parse_gpu_identity(text)
    parse_kmsg_record(text)


def test_every_truncation_of_every_real_line_is_safe() -> None:
    for row in ROWS:
        line = row["line"]
        for i in range(len(line) + 1):
            _check(line[:i])
            _check(line[i:])


def test_random_text_never_raises() -> None:
    rng = random.Random(20261126)
    pieces = [
        "NVRM: ",
        "Xid ",
        "SXid ",
        "(PCI:",
        "0000:",
        "3b:00",
        ".0",
        "): ",
        "79",
        ", ",
        "pid=",
        "'<unknown>'",
        "name=",
        "<unknown>",
        "kernel: ",
        "x: ",
        "4,1,2,c;",
        "12,1,2,-;",
        "\\x0a",
        "\n",
        "<4>",
        "kern  :warn  : ",
        "The NVIDIA GPU ",
        "GPU has fallen off the bus",
        "fallen off the bus",
        "GPU at PCI:",
        "GPU-",
        "nvidia-nvswitch0: ",
        "\x00",
        "\ufffd",
        "é",
        " ",
    ]
    stream = XidStream()
    for _ in range(20000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        _check(text)
        stream.feed(text)


def test_public_api_is_curated() -> None:
    import types

    import gpuwatchd.xid as xid

    public = {
        name
        for name, value in vars(xid).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    } - {"annotations"}
    assert set(xid.__all__) == public
    assert all(hasattr(xid, name) for name in xid.__all__)


def test_long_lines_of_repeated_headers_stay_linear() -> None:
    import time

    for piece in (
        "NVRM: Xid (PCI:0000:01:00): 79x",
        "NVRM: Xid (",
        "NVRM: The NVIDIA GPU 0000:01:00.0 ",
    ):
        line = piece * 50000
        # CPU time of this thread, not wall time: the bound tells linear from quadratic
        # whatever else the machine runs (a loaded 2-core CI box stretches wall time 5x)
        start = time.thread_time()
        assert parse_line(line) is None
        XidStream().feed(line)
        assert time.thread_time() - start < 2.0


# -- only a genuine record (issue 15 item 1) ----------------------------------------------
TMPFS_ECHO = "tmpfs: Unknown parameter 'x\nNVRM: Xid (PCI:0000:18:00): 79\ny'"
ECHOES = [
    TMPFS_ECHO,
    'EXT4-fs (loop0): Unrecognized mount option "NVRM: Xid (PCI:0000:18:00): 48" or missing',
    "usb 1-1: Product: NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",
    'audit: name="/tmp/\nNVRM: GPU 0000:18:00.0: GPU has fallen off the bus."',
    "loop0: x\nnvidia-nvswitch0: SXid (PCI:0000:18:00.0): 12028, Data",
    "x\nNVRM: The NVIDIA GPU 0000:18:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has"
    "\nNVRM: fallen off the bus and is not responding to commands.",
    " NVRM: Xid (PCI:0000:18:00): 79",
    "\nNVRM: Xid (PCI:0000:18:00): 79",
]


@pytest.mark.parametrize("message", ECHOES, ids=[f"echo{i}" for i in range(len(ECHOES))])
def test_kernel_messages_that_echo_user_text_are_no_report(message: str) -> None:
    """The same record through every entry point: journald/kmsg handler, kmsg text, dmesg."""
    assert XidStream().feed_record(message) is None
    kmsg_line = "4,17,1000,-;" + message.replace("\n", "\\x0a")
    assert parse_line(kmsg_line) is None
    assert XidStream().feed(kmsg_line) is None
    stream = XidStream()
    dmesg = [f"[   12.345678] {piece}" for piece in message.split("\n")[:1]]
    dmesg += [f"               {piece}" for piece in message.split("\n")[1:]]
    assert [f for line in dmesg if (f := stream.feed(line))] == []


def test_the_record_starts_with_the_header() -> None:
    genuine = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=a, GPU has fallen off the bus."
    found = XidStream().feed_record(genuine)
    assert found is not None and (found.xid, found.pid, found.process) == (79, 1, "a")
    # only the first line of a record is read: a process name holding a newline cannot
    # turn the rest of the record into a second report
    found = XidStream().feed_record(
        "NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=x\nNVRM: Xid (PCI:0000:2a:00): 79"
    )
    assert found is not None and (found.pci, found.xid) == ("00000000:18:00.0", 13)
    assert XidStream().feed_record("kernel: " + genuine) is None  # a record has no tag
    # a dmesg line's text after its time is a record of its own: same rule
    assert parse_line("[   12.3] x " + genuine) is None
    assert parse_line("[   12.3] " + genuine) is not None
    assert parse_line("Feb  5 17:37:45 host kernel: tmpfs: " + genuine) is None
    # the header's fields are strict
    for bad in (
        "NVRM: Xid (PCI:0000:18:00): 79x, text",
        "NVRM: Xid (PCI:0000:18:00): -79",
        "NVRM: Xid (PCI:0000:18:00) 79",
        "NVRM: Xid (PCI:00000000018:00): 79",
        "NVRM: Xid (PCI:0000:18:00): 1234567",
    ):
        assert XidStream().feed_record(bad) is None, bad


def test_gpu_identity_of_a_record_is_anchored_too() -> None:
    stream = XidStream()
    stream.feed_record("tmpfs: x\nNVRM: GPU at PCI:0000:18:00: " + CAPTURE_UUID)
    stream.feed_record("NVRM: GPU at PCI:0000:2a:00: " + CAPTURE_UUID)
    assert dict(stream.uuids) == {"00000000:2A:00.0": CAPTURE_UUID}


# -- ASCII, bounded, linear, real whitespace (issue 15 item 11) ----------------------------
@pytest.mark.parametrize(
    "digits", ["\uff17\uff19", "\u0667\u0669", "7\u0669", "\U0001d7f3\U0001d7ff"]
)
def test_unicode_digits_are_not_a_code(digits: str) -> None:
    """Failed on main: fullwidth and Arabic-Indic digits seven-nine were read as XID 79."""
    assert parse_line(f"NVRM: Xid (PCI:0000:18:00): {digits}, text") is None
    found = parse_line(f"NVRM: Xid (PCI:0000:18:00): 13, pid={digits}, name=a, text")
    assert found is not None and found.pid is None
    assert parse_line("NVRM: Xid (PCI:0000:\uff11\uff18:00): 79") is None


def test_huge_numbers_are_refused_not_raised() -> None:
    """Failed on main: a 5000-digit pid (or code) raised ValueError out of the parser."""
    big = "9" * 5000
    found = parse_line(f"NVRM: Xid (PCI:0000:18:00): 13, pid={big}, name=a, text")
    assert found is not None and found.pid is None and found.xid == 13
    assert parse_line(f"NVRM: Xid (PCI:0000:18:00): {big}, text") is None
    assert XidStream().feed_record(f"NVRM: Xid (PCI:0000:18:00): {big}") is None
    assert parse_kmsg_record(f"{big},1,1,-;NVRM: Xid (PCI:0000:18:00): 79") is None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=" + " " * 40000 + "x",
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1," + " " * 40000 + "x",
        "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a" + "," * 40000,
        "NVRM: Xid (PCI:0000:18:00): 13, " + "pid=1, " * 6000,
        "[" * 40000 + "NVRM: Xid (PCI:0000:18:00): 79",
        "Feb  5 17:37:45 " + "h" * 40000 + " kernel: NVRM: Xid (PCI:0000:18:00): 79",
        "4," * 20000 + ";NVRM: Xid (PCI:0000:18:00): 79",
    ],
    ids=["spaces-name", "spaces-msg", "commas", "pids", "brackets", "host", "kmsg"],
)
def test_long_lines_cost_linear_time(line: str) -> None:
    """Failed on main: ``name=`` then 40,000 spaces then ``x`` took 8.2 s (quadratic)."""
    import time

    start = time.thread_time()  # CPU time: holds on a loaded machine (quadratic was 8.2 s)
    for text in (line, line[:8000]):
        parse_line(text)
        XidStream().feed(text)
        XidStream().feed_record(text)
    assert time.thread_time() - start < 0.5


def test_runs_of_white_space_between_fields_keep_the_process() -> None:
    """Failed on main: ``pid=1234,  name=python3`` lost its process name."""
    for line in (
        "NVRM: Xid (PCI:0000:18:00): 13,  pid=1234,  name=python3,  Graphics Exception",
        "NVRM: Xid (PCI:0000:18:00):  13, pid=1234,\tname=python3, Graphics Exception",
        "[ 1.2] NVRM: Xid (PCI:0000:18:00): 13, pid=1234, name=python3,   Graphics Exception",
    ):
        found = parse_line(line)
        assert found is not None, line
        assert (found.xid, found.pid, found.process) == (13, 1234, "python3"), line
        assert found.message == "Graphics Exception"


def test_control_characters_in_a_process_name_are_escaped() -> None:
    found = XidStream().feed_record("NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=a\x1b[2Jb, t")
    assert found is not None and found.process == "a\\x1b[2Jb"


def test_legacy_fallen_off_wording_is_for_text_logs_only() -> None:
    """``xid parse`` reads old logs' "NVRM: GPU at 0000:01:00.0 has fallen off the bus.";
    the daemon's trusted sources (whole records) keep to current drivers' wordings."""
    legacy = "NVRM: GPU at 0000:01:00.0 has fallen off the bus."
    found = parse_line(legacy)
    assert found is not None and (found.kind, found.xid) == ("fallen_off_bus", 79)
    assert XidStream().feed(legacy) is not None
    assert XidStream().feed_record(legacy) is None
    # other "GPU at" lines of the same drivers are not reports
    assert parse_line("NVRM: GPU at 0000:01:00.0 has software scheduler DISABLED") is None
