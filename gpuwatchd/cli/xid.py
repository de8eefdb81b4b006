"""``gpuwatchd xid parse`` and ``gpuwatchd xid explain``.

``add_parser(subparsers)`` registers the ``xid`` command on the main CLI's sub-parsers.
Every handler takes the parsed arguments and returns an exit status.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import textwrap
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, TextIO

from gpuwatchd.core.records import XidEvent
from gpuwatchd.xid import (
    FALLEN_OFF_BUS_XID,
    Catalog,
    CatalogEntry,
    ParsedXid,
    XidStream,
    catalog_data,
    recovery_actions,
)

PROG = "gpuwatchd xid"


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    xid = subparsers.add_parser(
        "xid",
        help="find NVIDIA XIDs in kernel logs and explain them",
        description="Find NVIDIA XID, SXid and fallen-off-the-bus reports in kernel-log "
        "text, and explain XID codes from NVIDIA's catalog.",
    )
    sub = xid.add_subparsers(dest="xid_command", metavar="XID_COMMAND", required=True)

    p = sub.add_parser(
        "parse",
        help="print one JSON object per XID line of kernel-log text",
        description="Read kernel-log lines (bare, dmesg, dmesg -T/--decode, with or without "
        "the printk caller id, syslog and RFC 5424 syslog, journalctl short, -iso, -precise, "
        "-monotonic, -unix and -full, or raw /dev/kmsg records) and print one JSON object "
        "per XID, SXid or fallen-off-the-bus report; other lines print nothing.",
    )
    p.add_argument(
        "file", nargs="?", default="-", metavar="FILE", help="log file to read (default: stdin)"
    )
    p.add_argument("-c", "--config", metavar="FILE", help="apply this config's xid.overrides")
    p.set_defaults(func=cmd_parse)

    p = sub.add_parser(
        "explain",
        help="show the catalog entry for an XID code",
        description="Show NVIDIA's catalog entry for XID N with gpuwatchd's severity and action.",
    )
    p.add_argument("code", type=int, metavar="N", help="XID number")
    p.add_argument("--json", action="store_true", help="print the entry as a JSON object")
    p.add_argument("-c", "--config", metavar="FILE", help="apply this config's xid.overrides")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "scan",
        help="post-mortem: XIDs in journal files or a /dev/kmsg dump, with the daemon's trust",
        description="Read journal files copied from a node (a directory of .journal files or "
        "one file) or a saved /dev/kmsg dump, apply exactly the daemon's trust rules (journal: "
        "_TRANSPORT=kernel and SYSLOG_FACILITY=0; kmsg: facility 0), and print one JSON "
        "object per trusted XID report. Forged lines are counted on stderr, never printed.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--journal", metavar="DIR", help="journal directory or .journal file")
    where.add_argument("--kmsg", metavar="FILE", help="file of /dev/kmsg records")
    p.add_argument("-c", "--config", metavar="FILE", help="apply this config's xid.overrides")
    p.set_defaults(func=cmd_scan)
    return xid


def _catalog(args: argparse.Namespace) -> Catalog:
    """The catalog the commands use: NVIDIA's, with the config's ``xid.overrides``."""
    catalog = getattr(args, "catalog", None)
    if isinstance(catalog, Catalog):
        return catalog
    path = getattr(args, "config", None)
    if path:
        from gpuwatchd.configfile.loader import load_config

        config_catalog = load_config(path, must_exist=True).xid.catalog()
        assert isinstance(config_catalog, Catalog)
        return config_catalog
    return Catalog.default()


def answering_rules(code: int, args: argparse.Namespace, catalog: Catalog) -> list[str]:
    """The loaded rules a report of XID ``code`` reaches, in words: ``GpuXidFatal (page,
    drains)``. The shipped rules, or those of ``--config``; every code reaches at least one
    of the shipped rules (GpuXidUnclassified takes what no bucket answers)."""
    from gpuwatchd.configfile.loader import default_config, load_config
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules import rules_from_settings
    from gpuwatchd.rules.node_wide import MEMORY_XIDS

    path = getattr(args, "config", None)
    config = load_config(path, must_exist=True) if path else default_config()
    out: list[str] = []
    for rule in rules_from_settings(for_rules(config), []).rules:
        cond = rule.condition
        drains = ", drains" if rule.drain else ""
        if rule.kind == "recovery_action":
            if code == 154 and getattr(cond, "kernel_log", False):
                how = ", when its recovery-action code is not 0x0 (None)"
                out.append(f"{rule.name} ({rule.severity.value}{drains}{how})")
            continue
        if rule.kind == "memory_trend" and getattr(cond, "signal", None) == "node":
            if code in MEMORY_XIDS:  # rules/node_wide.py: XIDs count as the node's activity
                how = ", on 3 or more GPUs within minutes"
                out.append(f"{rule.name} ({rule.severity.value}{drains}{how})")
            continue
        codes = getattr(cond, "codes", None)
        if codes is None or rule.kind not in ("xid", "xid_recurrence"):
            continue
        if code in codes:
            how = ""
            if code in getattr(cond, "judged", ()):
                verdict = "fatal (or undecodable)" if getattr(cond, "fatal", None) else "non-fatal"
                how = f", when its registers decode as {verdict}"
        elif getattr(cond, "unknown", False) and not catalog.knows(code):
            how = ", a code the catalog does not list"
        else:
            continue
        out.append(f"{rule.name} ({rule.severity.value}{drains}{how})")
    return out


def report(found: ParsedXid, catalog: Catalog) -> dict[str, Any]:
    """The JSON object ``xid parse`` (and later ``xid scan``) prints for one report."""
    verdict = catalog.classify(found.xid, found.message, found.kind)
    out = found.as_dict()
    out["severity"] = verdict.severity.value
    out["action"] = verdict.action.value
    return out


def write_reports(lines: Iterable[str], catalog: Catalog, out: TextIO) -> int:
    """Parse ``lines`` and print a JSON line per report; returns how many were printed."""
    stream = XidStream()
    count = 0
    for line in lines:
        found = stream.feed(line)
        if found is not None:
            out.write(json.dumps(report(found, catalog)) + "\n")
            out.flush()
            count += 1
    return count


def _catalog_or_exit(args: argparse.Namespace) -> Catalog | None:
    from gpuwatchd.core.errors import ConfigError

    try:
        return _catalog(args)
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return None


def cmd_parse(args: argparse.Namespace) -> int:
    catalog = _catalog_or_exit(args)
    if catalog is None:
        return 1
    if args.file == "-":
        buffer = getattr(sys.stdin, "buffer", None)
        source: TextIO = (
            io.TextIOWrapper(buffer, encoding="utf-8", errors="replace")
            if buffer is not None
            else sys.stdin
        )
        write_reports(source, catalog, sys.stdout)
        return 0
    try:
        with open(args.file, encoding="utf-8", errors="replace") as f:
            write_reports(f, catalog, sys.stdout)
    except OSError as exc:
        print(f"{PROG} parse: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


def _event_report(event: XidEvent, catalog: Catalog, kmsg: bool) -> dict[str, Any]:
    verdict = catalog.classify(event.xid, event.message, event.kind)
    out: dict[str, Any] = {
        "kind": event.kind,
        "pci": event.pci_bus_id,
        "xid": event.xid,
        "pid": event.pid,
        "process": event.process,
        "message": event.message,
        "severity": verdict.severity.value,
        "action": verdict.action.value,
    }
    if event.gpu_instance is not None:
        out["gpu_instance"] = event.gpu_instance
    if event.compute_instance is not None:
        out["compute_instance"] = event.compute_instance
    if event.uuid:
        out["uuid"] = event.uuid
    if kmsg:
        out["seconds_since_boot"] = round(event.timestamp, 6)
    else:
        out["time"] = datetime.fromtimestamp(event.timestamp, UTC).isoformat()
    return out


def cmd_scan(args: argparse.Namespace) -> int:
    """``xid scan``: the daemon's own sources, replayed once over copied files."""
    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler

    found = _catalog_or_exit(args)
    if found is None:
        return 1
    catalog: Catalog = found
    kmsg = args.kmsg is not None

    class Printer:
        def append(self, event: XidEvent) -> None:
            sys.stdout.write(json.dumps(_event_report(event, catalog, kmsg)) + "\n")

    handler = KernelLineHandler("kmsg" if kmsg else "journald", GpuResolver(), Printer())
    path = args.kmsg if kmsg else args.journal
    if not os.path.exists(path):
        print(f"{PROG} scan: {path}: no such file or directory", file=sys.stderr)
        return 1
    try:
        if kmsg:
            from gpuwatchd.sources.kernel.kmsg import KmsgSource

            source = KmsgSource(handler, SystemClock(), path=path, boot_id="scan")
            source.scan()
        else:
            from gpuwatchd.sources.kernel.journald import JournaldSource

            JournaldSource(handler, SystemClock(), directory=path).scan()
    except (OSError, ImportError) as exc:
        print(f"{PROG} scan: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    c = handler.counters
    print(
        f"{PROG} scan: {c.lines} kernel-log entries, {c.xids} trusted XID reports, "
        f"{c.forged} forged XID lines ignored",
        file=sys.stderr,
    )
    return 0


def explain_dict(
    entry: CatalogEntry, catalog: Catalog, answered_by: list[str] | None = None
) -> dict[str, Any]:
    """``xid explain --json``: the entry, plus the decode tables that belong to its code."""
    out = entry.as_dict()
    if answered_by is not None:
        out["answered_by"] = answered_by
    if entry.xid == 154:
        out["recovery_actions"] = [
            {
                "code": row.code,
                "nvml_name": row.nvml_name,
                "workbook_text": row.workbook_text,
                **catalog.recovery_verdict(row.code).as_dict(),
            }
            for row in recovery_actions()
        ]
    rules = [r for r in catalog_data.NVLINK5_DECODE if r.xid == entry.xid]
    if rules:
        out["decode_rules"] = [r._asdict() for r in rules]
    return out


def _wrap(text: str, indent: str = "  ") -> list[str]:
    out: list[str] = []
    for para in text.split("\n"):
        if not para.strip():
            out.append("")
            continue
        out.extend(textwrap.wrap(para, width=92, initial_indent=indent, subsequent_indent=indent))
    return out


def _field(label: str, value: str, detail: str = "") -> list[str]:
    pad = " " * 20
    out = textwrap.wrap(
        value, width=92, initial_indent=f"  {label + ':':<18}", subsequent_indent=pad
    ) or [f"  {label}:"]
    if detail:
        out += _wrap(detail, pad)
    return out


def explain_text(
    entry: CatalogEntry, catalog: Catalog, answered_by: list[str] | None = None
) -> str:
    """``xid explain``: the entry in words."""
    applies = [p for p, yes in entry.applies_to if yes]
    products = ", ".join(applies) if applies else "none of the products the catalog lists"
    severity = entry.severity.value + (" (overridden)" if entry.overridden else "")
    lines = [f"XID {entry.xid}: {entry.mnemonic}", f"  {entry.description}", ""]
    lines += _field("Applies to", products)
    lines += _field("Severity", severity)
    lines += _field("Action", f"{entry.action.value}: {entry.action_text}")
    fatal = "yes: GpuXidFatal pages and drains" if entry.fatal else "no"
    if entry.fatal and entry.xid in catalog.verdict_codes():
        fatal = "by the decoded registers: GpuXidFatal pages and drains when they are fatal"
    lines += _field("Fatal set", fatal)
    if answered_by is not None:
        nothing = "no loaded rule"
        if entry.immediate in ("IGNORE", "WORKFLOW_XID_45"):
            nothing += f" (NVIDIA's bucket {entry.immediate}: no action of its own)"
        lines += _field("Answered by", "; ".join(answered_by) or nothing)
    lines += _field("Immediate", entry.immediate or "(none given)", entry.immediate_text)
    if entry.investigatory and entry.investigatory == entry.immediate:
        lines += _field("Investigatory", f"{entry.investigatory} (as above)")
    else:
        inv = entry.investigatory or "(none given)"
        lines += _field("Investigatory", inv, entry.investigatory_text)
    if entry.xid154_linkage:
        lines += _field("XID 154 linkage", entry.xid154_linkage)
    if entry.xid == FALLEN_OFF_BUS_XID:
        lines += [
            "",
            "  Reports of a GPU that has fallen off the bus without an Xid line are parsed as",
            "  kind 'fallen_off_bus' and rated as this XID.",
        ]
    if entry.trigger:
        lines += ["", "Trigger conditions (NVIDIA):", *_wrap(entry.trigger)]
    if entry.xid == 154:
        lines += ["", "Recovery-action codes (read by number; drivers have changed the words):"]
        for row in recovery_actions():
            v = catalog.recovery_verdict(row.code)
            words = f'"{row.workbook_text}"' if row.workbook_text else "(not in the workbook)"
            rated = f"{v.severity.value}, {v.action.value}"
            lines.append(f"  0x{row.code:x}  {row.nvml_name:<20} {words:<24} {rated}")
    rules = [r for r in catalog_data.NVLINK5_DECODE if r.xid == entry.xid]
    if rules:
        lines += [
            "",
            f"Decode rules ({len(rules)} in NVIDIA's XID 144-150 sheet), applied to the message's",
            "IntrInfo and ErrorStatus registers:",
        ]
        for r in rules:
            status = r.error_status or "any"
            then = f"{r.immediate} ({r.severity}); investigate: {r.investigatory or '-'}"
            lines.append(f"  {r.subcode}, ErrorStatus {status}: {then}")
            lines.append(f"      IntrInfo V1 {r.intrinfo_v1}  V2 {r.intrinfo_v2}")
            if r.action2:
                alt = f"V1 {r.action2_intrinfo_v1}  V2 {r.action2_intrinfo_v2}"
                lines.append(f"      {r.action2} instead when IntrInfo matches {alt}")
    return "\n".join(lines) + "\n"


def cmd_explain(args: argparse.Namespace) -> int:
    catalog = _catalog_or_exit(args)
    if catalog is None:
        return 1
    entry = catalog.lookup(args.code)
    answered_by = answering_rules(args.code, args, catalog)
    if entry is None:
        codes = catalog.codes()
        print(
            f"{PROG} explain: XID {args.code} is not in NVIDIA's XID catalog "
            f"({len(codes)} codes, {codes[0]}-{codes[-1]})",
            file=sys.stderr,
        )
        print(
            f"{PROG} explain: a report of it is answered by: "
            + ("; ".join(answered_by) or "no loaded rule"),
            file=sys.stderr,
        )
        return 1
    if args.json:
        out = explain_dict(entry, catalog, answered_by)
        sys.stdout.write(json.dumps(out, indent=2) + "\n")
    else:
        sys.stdout.write(explain_text(entry, catalog, answered_by))
    return 0
