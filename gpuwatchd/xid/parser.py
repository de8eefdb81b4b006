"""Find NVIDIA XID, NVSwitch SXid and "fallen off the bus" reports in kernel-log text.

The parser is pure (no I/O, no clock), ASCII-only in what it reads as numbers and
addresses, bounded in the length it looks at, and linear in time.

What a genuine report looks like
--------------------------------
Some kernel messages echo text a user chooses (a mount option, a file name, a device
label) and still arrive with the kernel's transport and facility 0; such text can hold a
newline and a complete fake ``NVRM: Xid`` line. So the parser does not look for the
driver's header *anywhere*: it accepts only a kernel record (one /dev/kmsg record, one
journald ``MESSAGE``) whose text **starts** with the driver's header, and reads only that
record's first line, field by field:

- ``NVRM: Xid (PCI:DDDD:BB:DD): CODE`` then the end of the line or ``,`` and the text;
  ``PCI:`` is optional (old drivers), CODE has 1 to 6 ASCII digits. On a GPU split into
  MIG instances the driver names the instance inside the parentheses, after one space:
  ``NVRM: Xid (PCI:DDDD:BB:DD GPU-I:NN): CODE`` or ``... GPU-I:NN GPU-CI:NN): CODE``
  (open-gpu-kernel-modules, ``src/nvidia/src/kernel/gpu/rc/kernel_rc.c``, macro
  ``XID_PRINT_WITH_ATTR``: the attribute ``"PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u"``,
  so each id has at least two decimal digits). Nothing else may stand there;
- ``nvidia-nvswitchN: SXid (PCI:DDDD:BB:DD.F): CODE`` likewise;
- ``NVRM: GPU [PCI:][DDDD:]BB:DD.F: GPU has fallen off the bus...``;
- ``NVRM: The NVIDIA GPU DDDD:BB:DD.F`` whose following lines (the driver's one
  multi-line printk) each start with ``NVRM:`` and say ``fallen off the bus``;
- ``NVRM: GPU at PCI:DDDD:BB:DD: GPU-<uuid>`` (identity, not a report).

A kernel message that echoes user text puts its own prefix first (``tmpfs: Unknown
parameter '...``, ``audit: ...``), so whatever it carries after a newline is never read.
Text a user controls inside a genuine record (the process name) cannot start a report
either: nothing after the first line of a record is parsed, except the continuation lines
of the fallen-off-the-bus printk, and those only complete a record the driver started.

Text logs (``xid parse``): a line may carry one recognised tool prefix before the kernel's
text: a raw /dev/kmsg record (``4,360,24122037,c;``, facility 0 only), the console's
``<4>`` (facility 0 only), ``dmesg --decode``'s ``kern  :warn  :`` (``kern`` only), a
syslog or ``journalctl`` header whose tag is ``kernel`` (``Feb  5 17:37:45 host kernel:``,
``2025-01-25T10:34:54+0000 host kernel:``, ``kernel:``, and journalctl's short-monotonic
``[   14.495505] host kernel:``, short-unix ``1732590121.123456 host kernel:`` and
short-full ``Thu 2026-11-26 03:02:01 UTC host kernel:``), an RFC 5424 syslog header
(``<4>1 TIME HOST kernel - - - ``, facility 0 only), and dmesg's time (``[  219.470000]``,
``[Thu Nov 26 03:02:01 2026]``, an ISO time) with the printk caller id of a kernel built
with CONFIG_PRINTK_CALLER (``[  T1234]``). The driver's header must follow the prefix
directly. Text logs also take the legacy ``NVRM: GPU at 0000:01:00.0 has fallen off the
bus.`` of drivers before about 2015; trusted records do not. Any other prefix
(``myapp[42]: NVRM: Xid ...``, ``user  :warn  : ...``) is refused. A line that starts
with white space is a continuation of the record above it (dmesg indents those) and never
starts a report. Text logs cannot show where a record ends; the daemon's trust comes from
its structured sources.

PCI addresses are returned in NVML's form, ``00000000:3B:00.0`` (8 upper-case hex digits
of domain, as ``nvmlDeviceGetPciInfo().busId`` prints them), so a parsed event can be
matched to a GPU handle without further work.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Literal

from gpuwatchd.core.records import XidEvent

XidKind = Literal["xid", "sxid", "fallen_off_bus"]

# XID 79 is "GPU has fallen off the bus". Drivers also print that condition without an
# Xid line; those reports are returned as kind "fallen_off_bus" carrying this code, so
# the catalog and the rules treat them as the XID they stand for.
FALLEN_OFF_BUS_XID = 79

# The kernel keeps a record to about 1 KiB of text; a syslog prefix and /dev/kmsg's \xNN
# escapes can make a line four times longer. Anything longer is not a driver record.
MAX_LINE_CHARS = 8192
# The kernel's task names are at most 15 bytes; journald or a tool may escape them.
MAX_PROCESS_CHARS = 64
# The driver prints ``pid=%s, name=%s, %s`` with the process's name as the kernel keeps it
# (``current->comm``: at most TASK_COMM_LEN - 1 = 15 bytes; open-gpu-kernel-modules,
# kernel_rc.c, krcReportXid). A name may itself hold ", " (a program can call itself
# anything), so the field is cut where a name of at most 15 bytes ends and the driver's
# message begins (``_MESSAGE_START``); longer names (none in real lines) keep the first cut.
COMM_BYTES = 15
# How the driver's message starts when it names a process (a channel's fault, mostly): the
# openings of the real lines in tests/data/xid_lines.tsv.
_MESSAGE_START = re.compile(
    r"(?:Ch [0-9A-Fa-f]{8}\b|channel 0x[0-9A-Fa-f]{8}\b|GPU has fallen off the bus"
    r"|Graphics (?:SM|Exception)|(?:Un)?[Cc]ontained: |Timeout after )"
)

_A = re.ASCII
_HEX = "[0-9a-fA-F]"
# domain:bus:device[.function]; the Xid header has no function, SXid and the
# "fallen off the bus" lines do.
_BDF = rf"(?P<dom>{_HEX}{{1,8}}):(?P<bus>{_HEX}{{1,2}}):(?P<dev>{_HEX}{{1,2}})(?:\.(?P<fn>[0-7]))?"
# Some drivers print the bus address without its domain in the fallen-off-the-bus line.
_BDF_OPT_DOMAIN = (
    rf"(?:(?P<dom>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{1,2}}):(?P<dev>{_HEX}{{1,2}})"
    r"(?:\.(?P<fn>[0-7]))?"
)
_CODE = r"[ \t]*(?P<code>[0-9]{1,6})(?=,|[ \t]*$)"

# Every pattern below is used with .match() on the start of a record's first line.
# The MIG attribution: GPU instance, then optionally compute instance (``%02u`` each).
_MIG = r"(?: GPU-I:(?P<gi>[0-9]{2,10})(?: GPU-CI:(?P<ci>[0-9]{2,10}))?)?"
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?{_BDF}{_MIG}\):{_CODE}", _A)
_SXID_RE = re.compile(rf"nvidia-nvswitch[0-9]{{1,4}}: SXid \((?:PCI:)?{_BDF}\):{_CODE}", _A)
_FELL_RE = re.compile(
    rf"NVRM: GPU (?:PCI:)?{_BDF_OPT_DOMAIN}: (?P<msg>GPU has fallen off the bus.*)", _A
)
_THE_GPU_RE = re.compile(rf"NVRM: The NVIDIA GPU (?:PCI:)?{_BDF}(?![0-9a-fA-F:.])", _A)
_GPU_AT_RE = re.compile(
    rf"NVRM: GPU at (?:PCI:)?{_BDF}: (?P<uuid>GPU-{_HEX}{{8}}(?:-{_HEX}{{4}}){{3}}-{_HEX}{{12}})"
    r"[ \t]*$",
    _A,
)
_PID_VALUE_RE = re.compile(r"pid=(?:(?P<pid>[0-9]{1,10})|'<unknown>'|<unknown>)", _A)
_FALLEN = "fallen off the bus"
# Where a kernel record's text may start: the driver's two prefixes.
_DRIVER_STARTS = ("NVRM: ", "nvidia-nvswitch")

_KMSG_RE = re.compile(r"([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),([^;\n]{0,256});(.*)", _A | re.S)
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")

# Tool prefixes, each tried once, in this order, each anchored where the last one ended.
_CONSOLE_PRIO_RE = re.compile(r"<([0-9]{1,4})>", _A)
_DECODE_RE = re.compile(r"([a-z0-9]{2,8}) *:([a-z]{3,6}) *: ", _A)
_CLOCK = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?"
_ISO_TIME = rf"[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}[T ]{_CLOCK}(?:Z|[+-][0-9]{{2}}:?[0-9]{{2}})?"
# journalctl's time forms: short and short-precise (``Feb  5 17:37:45[.123456]``), short-iso
# (``2025-01-25T10:34:54+0000``), short-monotonic (``[   14.495505]``), short-unix
# (``1732590121.123456``) and short-full (``Thu 2026-11-26 03:02:01 UTC``).
_JOURNAL_TIME = (
    rf"(?:[^\s0-9:\[\]]{{2,5}}\.? {{1,2}}[0-9]{{1,2}} {_CLOCK}|{_ISO_TIME}"
    r"|\[ {0,12}[0-9]{1,10}\.[0-9]{1,9}\]"
    r"|[0-9]{1,12}\.[0-9]{1,9}"
    rf"|[^\s0-9:\[\]]{{2,5}} [0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}} {_CLOCK}"
    r"(?: [A-Za-z0-9+:/_-]{1,32})?)"
)
_SYSLOG_RE = re.compile(rf"(?:{_JOURNAL_TIME}(?: [^\s:\[\]]{{1,255}})? )?kernel: ")
# RFC 5424: ``<PRI>1 TIMESTAMP HOST APP-NAME PROCID MSGID STRUCTURED-DATA MSG``; the
# facility (PRI >> 3) must be 0 and APP-NAME ``kernel``; MSG may start with a BOM.
_RFC5424_RE = re.compile(
    r"<([0-9]{1,3})>1 [!-~]{1,64} [!-~]{1,255} kernel [!-~]{1,128} [!-~]{1,32} "
    r"(?:-|(?:\[[^\]\n]{0,1024}\]){1,16}) \ufeff?",
)
# dmesg's time, then the printk caller id a kernel built with CONFIG_PRINTK_CALLER adds
# (``[   14.495505] [  T1234]``, on the console ``[   14.495505][ T1234]``).
_DMESG_TIME_RE = re.compile(
    rf"(?:\[[^\]\n]{{1,48}}\]|{_ISO_TIME})(?: ?\[ {{0,10}}[TC][0-9]{{1,10}}\])? ", _A
)
# The wording of drivers before about 2015 (``xid parse`` only, see parse_record).
_LEGACY_FELL_RE = re.compile(
    rf"NVRM: GPU at (?:PCI:)?{_BDF_OPT_DOMAIN} (?P<msg>has fallen off the bus\.?)[ \t]*$", _A
)


def normalize_pci(domain: str, bus: str, device: str, function: str | None = None) -> str:
    """Hex fields as printed by the kernel -> NVML's ``00000000:3B:00.0``."""
    fn = int(function, 16) if function else 0
    return f"{int(domain, 16):08X}:{int(bus, 16):02X}:{int(device, 16):02X}.{fn}"


def _pci_of(m: re.Match[str]) -> str:
    return normalize_pci(m.group("dom") or "0", m.group("bus"), m.group("dev"), m.group("fn"))


@dataclass(frozen=True, slots=True)
class ParsedXid:
    """One XID, SXid or fallen-off-the-bus report found in a kernel-log line.

    ``message`` is the driver's text after the header (and after ``pid=``/``name=``);
    ``raw`` is the line as given, without its line ending. ``uuid`` is filled only by
    ``XidStream``, from an earlier ``NVRM: GPU at PCI:...: GPU-...`` line.
    """

    kind: XidKind
    pci: str
    xid: int
    pid: int | None
    process: str | None
    message: str
    raw: str
    uuid: str | None = None
    # MIG attribution (``GPU-I:``/``GPU-CI:`` in the header); None on a whole GPU.
    gpu_instance: int | None = None
    compute_instance: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kind": self.kind,
            "pci": self.pci,
            "xid": self.xid,
            "pid": self.pid,
            "process": self.process,
            "message": self.message,
        }
        if self.gpu_instance is not None:
            out["gpu_instance"] = self.gpu_instance
        if self.compute_instance is not None:
            out["compute_instance"] = self.compute_instance
        return out

    def to_event(self, timestamp: float, source: str, *, trusted: bool = True) -> XidEvent:
        """The record a source emits for this report (GPU index is the merger's job)."""
        return XidEvent(
            timestamp=timestamp,
            source=source,
            xid=self.xid,
            kind=self.kind,
            pci_bus_id=self.pci,
            uuid=self.uuid,
            pid=self.pid,
            process=self.process,
            message=self.message,
            trusted=trusted,
            gpu_instance=self.gpu_instance,
            compute_instance=self.compute_instance,
        )


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """``NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>``: the driver names a GPU's UUID."""

    pci: str
    uuid: str
    raw: str


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One /dev/kmsg record: ``PRIO,SEQ,USEC,FLAGS[,...];MESSAGE``.

    ``facility`` is ``PRIO >> 3``: 0 is the kernel; user-space writes to /dev/kmsg land
    in facility 1 or above (the kernel refuses to let them claim 0). ``message`` has the
    kernel's ``\\xNN`` escapes undone, so a multi-line printk comes back with its newlines.
    """

    facility: int
    level: int
    seq: int
    usec: int
    message: str


def parse_kmsg_record(raw: str) -> KmsgRecord | None:
    """Parse a record as read from /dev/kmsg; None for anything else.

    Dictionary lines that follow a record (`` SUBSYSTEM=pci``) are ignored.
    """
    first = raw.split("\n", 1)[0]
    m = _KMSG_RE.match(first)
    if m is None:
        return None
    prio = int(m.group(1))
    message = m.group(5)
    if "\\x" in message:
        message = _KMSG_ESCAPE_RE.sub(lambda e: chr(int(e.group(1), 16)), message)
    return KmsgRecord(
        facility=prio >> 3,
        level=prio & 7,
        seq=int(m.group(2)),
        usec=int(m.group(3)),
        message=message,
    )


def kernel_text(line: str) -> str | None:
    """The kernel's own text in one log line, after its one recognised tool prefix.

    None when the line cannot hold a driver record: too long, a continuation line
    (starts with white space), a prefix that says user space wrote it, or text that does
    not start with one of the driver's prefixes right after the tool's prefix.
    """
    text = line.rstrip("\r\n")
    if not text or len(text) > MAX_LINE_CHARS or text[0] in " \t":
        return None
    if text[0] in "0123456789":
        record = parse_kmsg_record(text)
        if record is not None:
            return record.message if record.facility == 0 else None
    pos = 0
    m = _RFC5424_RE.match(text) if text.startswith("<") else None
    if m is not None:
        if int(m.group(1)) >> 3 != 0:
            return None
        pos = m.end()
    else:
        m = _CONSOLE_PRIO_RE.match(text, pos)
        if m is not None:
            if int(m.group(1)) >> 3 != 0:
                return None
            pos = m.end()
    m = _DECODE_RE.match(text, pos)
    if m is not None:
        if m.group(1) != "kern":
            return None
        pos = m.end()
    m = _SYSLOG_RE.match(text, pos)
    if m is not None:
        pos = m.end()
    m = _DMESG_TIME_RE.match(text, pos)
    if m is not None:
        pos = m.end()
    rest = text[pos:]
    return rest if rest.startswith(_DRIVER_STARTS) else None


def _split_pid(body: str) -> tuple[int | None, str | None, str]:
    """``pid=1234, name=python3, <message>`` -> (1234, "python3", "<message>").

    Also ``pid='<unknown>', name=<unknown>, ...`` and ``pid=1122, <message>``; runs of
    white space between the fields are tolerated. A name runs to a ``,`` that is followed by
    white space or ends the line (names may hold colons and brackets: ``ray::Wkr[0]``, and
    ", ": ``_take_name``), and is at most ``MAX_PROCESS_CHARS`` long.
    """
    m = _PID_VALUE_RE.match(body)
    if m is None:
        return None, None, body
    rest = body[m.end() :]
    if rest and rest[0] != ",":
        return None, None, body  # "pid=12ab": not the driver's field
    pid = int(m.group("pid")) if m.group("pid") is not None else None
    rest = rest[1:].lstrip(" \t")
    process: str | None = None
    if rest.startswith("name="):
        name, sep, after = _take_name(rest[5:])
        if name is not None:
            if name != "<unknown>":
                process = name
            rest = after if sep else ""
    return pid, process, rest.strip()


def _take_name(text: str) -> tuple[str | None, bool, str]:
    """(name, whether a separator followed, the text after it).

    The separators are the ``,`` followed by white space (or the end) within
    ``MAX_PROCESS_CHARS``. Of those that leave a name the kernel can hold (``COMM_BYTES``),
    the last one after which the driver's message starts wins (a name ``a, b`` stays
    whole); without such a message the first one does."""
    limit = min(len(text), MAX_PROCESS_CHARS + 1)
    cuts: list[int] = []
    i = text.find(",", 0, limit)
    while i >= 0:
        if i + 1 == len(text) or text[i + 1] in " \t":
            cuts.append(i)
        i = text.find(",", i + 1, limit)
    if cuts:
        fits = [c for c in cuts if len(text[:c].encode("utf-8", "replace")) <= COMM_BYTES]
        known = [c for c in fits if _MESSAGE_START.match(text[c + 1 :].lstrip(" \t"))]
        cut = known[-1] if known else cuts[0]
        return (text[:cut] or None), True, text[cut + 1 :]
    if len(text) <= MAX_PROCESS_CHARS:
        return (text.rstrip() or None), False, ""
    return None, False, text


def _printable(text: str) -> bool:
    return text.isprintable()


def _build(kind: XidKind, m: re.Match[str], line: str, raw: str) -> ParsedXid | None:
    rest = line[m.end() :]
    body = rest[1:].strip() if rest.startswith(",") else ""
    pid: int | None = None
    process: str | None = None
    if body.startswith("pid="):
        pid, process, body = _split_pid(body)
    if process is not None and not _printable(process):
        process = process.encode("unicode_escape").decode("ascii")
    groups = m.groupdict()
    gi, ci = groups.get("gi"), groups.get("ci")
    return ParsedXid(
        kind,
        _pci_of(m),
        int(m.group("code")),
        pid,
        process,
        body,
        raw,
        gpu_instance=int(gi) if gi is not None else None,
        compute_instance=int(ci) if ci is not None else None,
    )


def _join_continuations(lines: list[str]) -> str:
    """A printk split over lines (each starting ``NVRM:``) as one line of words."""
    parts = []
    for piece in lines:
        piece = piece.strip()
        if piece.startswith("NVRM:"):
            piece = piece[5:].strip()
        if piece:
            parts.append(piece)
    return " ".join(" ".join(parts).split())


# The multi-line "The NVIDIA GPU ... has fallen off the bus" printk: three lines today.
_FALLEN_MAX_LINES = 4


def _parse_the_gpu(lines: list[str], raw: str) -> ParsedXid | None:
    """``NVRM: The NVIDIA GPU <bdf>`` plus continuation lines that each start ``NVRM:``."""
    m = _THE_GPU_RE.match(lines[0])
    if m is None:
        return None
    taken = [lines[0][m.start() :]]
    if _FALLEN not in lines[0]:
        for extra in lines[1:_FALLEN_MAX_LINES]:
            piece = extra.strip()
            if not piece.startswith("NVRM: "):
                return None
            taken.append(piece)
            if _FALLEN in piece:
                break
        else:
            return None
    msg = _join_continuations(taken)
    return ParsedXid("fallen_off_bus", _pci_of(m), FALLEN_OFF_BUS_XID, None, None, msg, raw)


def parse_record(text: str, raw: str | None = None, *, legacy: bool = False) -> ParsedXid | None:
    """The report in one kernel record's text (a /dev/kmsg message, a journald MESSAGE).

    The caller has decided that the kernel wrote the record (facility 0, kernel
    transport). The driver's header must start at the first character and only the first
    line is read (see the module's description of a genuine record). ``legacy`` also takes
    old drivers' ``NVRM: GPU at 0000:01:00.0 has fallen off the bus.``: ``xid parse`` reads
    old logs with it; the daemon's sources keep to the wordings of current drivers.
    """
    if raw is None:
        raw = text.rstrip("\r\n")
    if not text.startswith(_DRIVER_STARTS) or len(text) > MAX_LINE_CHARS:
        return None
    first, nl, _ = text.partition("\n")
    first = first.rstrip("\r")
    if first.startswith("NVRM: Xid ("):
        m = _XID_RE.match(first)
        return _build("xid", m, first, raw) if m is not None else None
    if first.startswith("nvidia-nvswitch"):
        m = _SXID_RE.match(first)
        return _build("sxid", m, first, raw) if m is not None else None
    if legacy and first.startswith("NVRM: GPU at ") and _FALLEN in first:
        m = _LEGACY_FELL_RE.match(first)
        if m is None:
            return None
        msg = m.group("msg")
        return ParsedXid("fallen_off_bus", _pci_of(m), FALLEN_OFF_BUS_XID, None, None, msg, raw)
    if first.startswith("NVRM: GPU ") and _FALLEN in first:
        m = _FELL_RE.match(first)
        if m is None:
            return None
        msg = m.group("msg").strip()
        return ParsedXid("fallen_off_bus", _pci_of(m), FALLEN_OFF_BUS_XID, None, None, msg, raw)
    if first.startswith("NVRM: The NVIDIA GPU ") and _FALLEN in text:
        lines = text.split("\n", _FALLEN_MAX_LINES)[:_FALLEN_MAX_LINES] if nl else [first]
        return _parse_the_gpu(lines, raw)
    return None


def parse_line(line: str) -> ParsedXid | None:
    """The XID, SXid or fallen-off-the-bus report in one kernel-log line, or None.

    ``line`` is a line of a text log with at most one recognised tool prefix (see the
    module's description), or a raw /dev/kmsg record; a record spanning several lines
    (the multi-line "The NVIDIA GPU ... has fallen off the bus" printk) is read whole.
    dmesg output that splits such a printk over several lines needs ``XidStream``.
    """
    if "Xid" not in line and _FALLEN not in line:
        return None
    first, nl, more = line.partition("\n")
    text = kernel_text(first)
    if text is None:
        return None
    if nl and not first[:1].isdigit():
        text = text + nl + more  # a kmsg record already carries its own continuation
    return parse_record(text, line.rstrip("\r\n"), legacy=True)


def _identity(text: str, raw: str) -> GpuIdentity | None:
    first = text.split("\n", 1)[0].rstrip("\r")
    m = _GPU_AT_RE.match(first)
    if m is None:
        return None
    return GpuIdentity(_pci_of(m), m.group("uuid"), raw)


def parse_gpu_identity(line: str) -> GpuIdentity | None:
    """``NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`` (or the old form without ``PCI:``)."""
    if "NVRM: GPU at " not in line:
        return None
    text = kernel_text(line.split("\n", 1)[0])
    if text is None:
        return None
    return _identity(text, line.rstrip("\r\n"))


def parse_record_identity(text: str) -> GpuIdentity | None:
    """``parse_gpu_identity`` for one kernel record's text (header at the first character)."""
    if not text.startswith("NVRM: GPU at ") or len(text) > MAX_LINE_CHARS:
        return None
    return _identity(text, text.rstrip("\r\n"))


class XidStream:
    """Parse a sequence of kernel-log lines or records, keeping what one cannot show.

    - ``NVRM: GPU at PCI:...: GPU-<uuid>`` lines are remembered, and later reports for that
      PCI address carry the UUID.
    - dmesg prints the multi-line "The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed
      in this system has / fallen off the bus ..." printk as separate lines, the later ones
      indented; the stream joins them (within a few lines) into one ``fallen_off_bus``
      report.

    ``feed`` takes lines of a text log; ``feed_record`` takes whole kernel records (from
    /dev/kmsg or journald) that the caller trusts. Not thread-safe; one stream per source.
    """

    _LOOKAHEAD = 4

    def __init__(self) -> None:
        self._uuids: dict[str, str] = {}
        self._pending_text: list[str] = []
        self._pending_raw: list[str] = []
        self._pending_pci = ""

    @property
    def uuids(self) -> Mapping[str, str]:
        """PCI address (NVML form) -> GPU UUID, as announced by the driver so far."""
        return MappingProxyType(self._uuids)

    def _with_uuid(self, found: ParsedXid | None) -> ParsedXid | None:
        if found is not None and self._uuids:
            uuid = self._uuids.get(found.pci)
            if uuid is not None:
                found = replace(found, uuid=uuid)
        return found

    def feed_record(self, text: str) -> ParsedXid | None:
        """One whole kernel record's text, header at its first character."""
        ident = parse_record_identity(text)
        if ident is not None:
            self._uuids[ident.pci] = ident.uuid
            return None
        return self._with_uuid(parse_record(text))

    def feed(self, line: str) -> ParsedXid | None:
        """One line of a text log (dmesg, syslog, a /dev/kmsg dump)."""
        if "NVRM: GPU at " in line:
            ident = parse_gpu_identity(line)
            if ident is not None:
                self._uuids[ident.pci] = ident.uuid
                return None
        found = parse_line(line)
        if found is None:
            found = self._continue_fallen(line)
        return self._with_uuid(found)

    def _continue_fallen(self, line: str) -> ParsedXid | None:
        raw = line.rstrip("\r\n")
        if "NVRM: The NVIDIA GPU " in line:
            text = kernel_text(line.split("\n", 1)[0])
            m = _THE_GPU_RE.match(text) if text is not None else None
            if text is not None and m is not None:
                self._pending_text = [text]
                self._pending_raw = [raw]
                self._pending_pci = _pci_of(m)
                return None
        if not self._pending_raw:
            return None
        self._pending_raw.append(raw)
        piece = raw.strip()
        if raw[:1] in (" ", "\t") and piece.startswith("NVRM: ") and len(raw) <= MAX_LINE_CHARS:
            self._pending_text.append(piece)
            if _FALLEN in piece:
                msg = _join_continuations(self._pending_text)
                found = ParsedXid(
                    "fallen_off_bus",
                    self._pending_pci,
                    FALLEN_OFF_BUS_XID,
                    None,
                    None,
                    msg,
                    "\n".join(self._pending_raw),
                )
                self._pending_text, self._pending_raw = [], []
                return found
        else:
            # Anything but an indented NVRM: continuation ends the printk.
            self._pending_text, self._pending_raw = [], []
            return None
        if len(self._pending_raw) >= self._LOOKAHEAD:
            self._pending_text, self._pending_raw = [], []
        return None
