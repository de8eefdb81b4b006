"""Find NVIDIA XID, NVSwitch SXid and "fallen off the bus" reports in kernel-log text.

The parser is pure (no I/O, no clock) and cheap on lines that are not ours: a line without
``Xid`` or ``fallen off the bus`` in it costs two substring scans. It looks for the
driver's header anywhere in the line, so any prefix a tool puts in front works: dmesg's
``[  219.470000]`` and ``-T`` dates, ``dmesg --decode`` facility/level columns, ISO
timestamps, syslog and ``journalctl`` short prefixes, a bare ``kernel:`` tag, the console's
``<4>`` priority, and raw ``/dev/kmsg`` records (``4,360,24122037,c;NVRM: ...``).

One thing it does refuse: text whose own prefix says that user space wrote it. A syslog
tag other than ``kernel`` before the header (``myapp[42]: NVRM: Xid ...``), a
``dmesg --decode`` facility other than ``kern`` (``user  :warn  : ...``), a console
priority or a /dev/kmsg record whose facility is not 0: the kernel writes its own lines
with facility 0 and any local user can write the rest. The sources still apply their own,
stronger trust rules (journald ``_TRANSPORT=kernel``); this only keeps ``xid parse`` and
``xid scan`` from believing a forged line that carries its origin on its face.

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

_HEX = "[0-9a-fA-F]"
# domain:bus:device[.function]; the Xid header has no function, SXid and the
# "fallen off the bus" lines do.
_BDF = rf"(?P<dom>{_HEX}{{1,8}}):(?P<bus>{_HEX}{{1,2}}):(?P<dev>{_HEX}{{1,2}})(?:\.(?P<fn>[0-7]))?"
# Some drivers print the bus address without its domain in the fallen-off-the-bus line.
_BDF_OPT_DOMAIN = (
    rf"(?:(?P<dom>{_HEX}{{1,8}}):)?(?P<bus>{_HEX}{{1,2}}):(?P<dev>{_HEX}{{1,2}})"
    r"(?:\.(?P<fn>[0-7]))?"
)

_XID_HEADER = "NVRM: Xid ("
# Headers only: what follows is sliced off, so a line full of repeated headers stays linear.
_XID_RE = re.compile(rf"NVRM: Xid \((?:PCI:)?{_BDF}\): (?P<code>\d+)")
_SXID_RE = re.compile(rf"(?:nvidia-nvswitch\d+: )?SXid \((?:PCI:)?{_BDF}\): (?P<code>\d+)")
# "pid=1234, name=python3, <message>", "pid='<unknown>', name=<unknown>, <message>",
# "pid=1122, <message>". A name runs to the first ", ": process names may hold colons
# and brackets (ray::Wkr[0]) but the kernel's 15-character names rarely hold ", ".
_PID_RE = re.compile(
    r"pid=(?:(?P<pid>\d+)|'?<unknown>'?)(?:, name=(?P<name>.*?))?(?:, (?P<msg>.*)|\s*$)", re.S
)
_FELL_RE = re.compile(
    rf"NVRM: GPU (?:PCI:)?{_BDF_OPT_DOMAIN}: (?P<msg>GPU has fallen off the bus.*)"
)
_THE_GPU_RE = re.compile(rf"NVRM: The NVIDIA GPU (?:PCI:)?{_BDF}(?![0-9a-fA-F:.])")
_GPU_AT_RE = re.compile(rf"NVRM: GPU at (?:PCI:)?{_BDF}: (?P<uuid>GPU-[0-9a-fA-F-]+)")
_FALLEN = "fallen off the bus"

_KMSG_RE = re.compile(r"(\d+),(\d+),(\d+),([^;\n]*);(.*)", re.S)
_KMSG_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")
_CONSOLE_PRIO_RE = re.compile(r"\s*<(\d+)>")
_DECODE_RE = re.compile(r"\s*([a-z0-9]+)\s*:\s*([a-z]+)\s*:")
_SYSLOG_FACILITIES = frozenset(
    (
        *("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron"),
        *("authpriv", "ftp", *(f"local{i}" for i in range(8))),
    )
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "pci": self.pci,
            "xid": self.xid,
            "pid": self.pid,
            "process": self.process,
            "message": self.message,
        }

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


def _written_by_user_space(prefix: str) -> bool:
    """True if the text before the driver's header says a user-space program wrote it."""
    if not prefix or prefix.isspace():
        return False
    m = _CONSOLE_PRIO_RE.match(prefix)
    if m is not None and int(m.group(1)) >> 3 != 0:
        return True
    m = _DECODE_RE.match(prefix)
    if m is not None and m.group(1) in _SYSLOG_FACILITIES and m.group(1) != "kern":
        return True
    for token in prefix.split():
        if len(token) > 1 and token.endswith(":"):
            tag = token[:-1].split("[", 1)[0]
            if tag and tag != "kernel":
                return True
    return False


def _unwrap(line: str) -> str | None:
    """The kernel message inside ``line``: a kmsg record is opened; a forged one is None."""
    text = line.rstrip("\r\n")
    if text[:1].isdigit():
        record = parse_kmsg_record(text)
        if record is not None:
            return record.message if record.facility == 0 else None
    return text


def _parse_xid(text: str, raw: str) -> ParsedXid | None:
    start = text.find(_XID_HEADER)
    while start >= 0:
        m = _XID_RE.match(text, start)
        if m is not None and text[m.end() : m.end() + 1] in ("", ","):
            if _written_by_user_space(text[:start]):
                return None
            return _build("xid", _pci_of(m), int(m.group("code")), text[m.end() :], raw)
        start = text.find(_XID_HEADER, start + 1)
    return None


def _build(kind: XidKind, pci: str, code: int, rest: str, raw: str) -> ParsedXid:
    body = rest[1:].strip() if rest else ""
    pid: int | None = None
    process: str | None = None
    if body.startswith("pid="):
        pm = _PID_RE.match(body)
        if pm is not None:
            if pm.group("pid") is not None:
                pid = int(pm.group("pid"))
            name = pm.group("name")
            if name and name != "<unknown>":
                process = name
            body = (pm.group("msg") or "").strip()
    return ParsedXid(kind, pci, code, pid, process, body, raw)


def _parse_sxid(text: str, raw: str) -> ParsedXid | None:
    m = _SXID_RE.search(text)
    if m is None or text[m.end() : m.end() + 1] not in ("", ","):
        return None
    if _written_by_user_space(text[: m.start()]):
        return None
    return _build("sxid", _pci_of(m), int(m.group("code")), text[m.end() :], raw)


def _join_continuations(text: str) -> str:
    """A printk split over lines (each starting ``NVRM:``) as one line of words."""
    parts = []
    for piece in text.splitlines():
        piece = piece.strip()
        if piece.startswith("NVRM:"):
            piece = piece[5:].strip()
        if piece:
            parts.append(piece)
    return " ".join(" ".join(parts).split())


def _parse_fallen(text: str, raw: str) -> ParsedXid | None:
    m = _FELL_RE.search(text)
    if m is not None:
        if _written_by_user_space(text[: m.start()]):
            return None
        msg = m.group("msg").strip()
        return ParsedXid("fallen_off_bus", _pci_of(m), FALLEN_OFF_BUS_XID, None, None, msg, raw)
    m = _THE_GPU_RE.search(text)
    if m is not None and _FALLEN in text[m.end() :]:
        if _written_by_user_space(text[: m.start()]):
            return None
        msg = _join_continuations(text[m.start() :])
        return ParsedXid("fallen_off_bus", _pci_of(m), FALLEN_OFF_BUS_XID, None, None, msg, raw)
    return None


def parse_line(line: str) -> ParsedXid | None:
    """The XID, SXid or fallen-off-the-bus report in one kernel-log line, or None.

    ``line`` may be a whole journald MESSAGE or kmsg record spanning several lines (the
    multi-line "The NVIDIA GPU ... has fallen off the bus" printk); dmesg output that
    splits such a printk over several lines needs ``XidStream``.
    """
    if "Xid" not in line and _FALLEN not in line:
        return None
    text = _unwrap(line)
    if text is None:
        return None
    raw = line.rstrip("\r\n")
    if "Xid" in text:
        found = _parse_xid(text, raw) if _XID_HEADER in text else None
        if found is None and "SXid (" in text:
            found = _parse_sxid(text, raw)
        if found is not None:
            return found
    if _FALLEN in text:
        return _parse_fallen(text, raw)
    return None


def parse_gpu_identity(line: str) -> GpuIdentity | None:
    """``NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`` (or the old form without ``PCI:``)."""
    if "NVRM: GPU at " not in line:
        return None
    text = _unwrap(line)
    if text is None:
        return None
    m = _GPU_AT_RE.search(text)
    if m is None or _written_by_user_space(text[: m.start()]):
        return None
    return GpuIdentity(_pci_of(m), m.group("uuid"), line.rstrip("\r\n"))


class XidStream:
    """Parse a sequence of kernel-log lines, keeping what single lines cannot show.

    - ``NVRM: GPU at PCI:...: GPU-<uuid>`` lines are remembered, and later reports for that
      PCI address carry the UUID.
    - dmesg prints the multi-line "The NVIDIA GPU 0000:b3:00.0 / (PCI ID: ...) installed
      in this system has / fallen off the bus ..." printk as separate lines; the stream
      joins them (within a few lines) into one ``fallen_off_bus`` report.

    Not thread-safe; one stream per source.
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

    def feed(self, line: str) -> ParsedXid | None:
        if "NVRM: GPU at " in line:
            ident = parse_gpu_identity(line)
            if ident is not None:
                self._uuids[ident.pci] = ident.uuid
                return None
        found = parse_line(line)
        if found is None:
            found = self._continue_fallen(line)
        if found is not None and self._uuids:
            uuid = self._uuids.get(found.pci)
            if uuid is not None:
                found = replace(found, uuid=uuid)
        return found

    def _continue_fallen(self, line: str) -> ParsedXid | None:
        raw = line.rstrip("\r\n")
        if "NVRM: The NVIDIA GPU " in line:
            text = _unwrap(line)
            m = _THE_GPU_RE.search(text) if text is not None else None
            if text is not None and m is not None and not _written_by_user_space(text[: m.start()]):
                self._pending_text = [text[m.start() :]]
                self._pending_raw = [raw]
                self._pending_pci = _pci_of(m)
                return None
        if not self._pending_raw:
            return None
        self._pending_raw.append(raw)
        at = raw.find("NVRM:")
        if at >= 0:
            self._pending_text.append(raw[at:])
            if _FALLEN in raw:
                msg = _join_continuations("\n".join(self._pending_text))
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
        if len(self._pending_raw) >= self._LOOKAHEAD:
            self._pending_text, self._pending_raw = [], []
        return None
