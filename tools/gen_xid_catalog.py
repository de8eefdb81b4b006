#!/usr/bin/env python3
"""Generate gpuwatchd/xid/catalog_data.py from NVIDIA's XID catalog workbook.

The workbook ("Analyzing Xid Errors with the Xid Catalog",
https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Xid-Catalog.xlsx)
is kept in the repository as one raw TSV per sheet under data/xid/:

    xid_catalog_nvidia_raw.tsv      sheet "Xids"
    resolution_buckets_raw.tsv      sheet "Resolution Buckets"
    xid_144_150_decode_raw.tsv      sheet "Xid 144-150 Decode"
    catalog_user_guide_raw.tsv      sheet "Customer User Guide"

A new workbook revision is one command: export the sheets over those files and run

    .venv/bin/python tools/gen_xid_catalog.py

The script cleans the text (the export writes in-cell line breaks as a literal backslash-n)
but does not interpret it; severities and actions are gpuwatchd's policy in catalog.py.
It stops with a message, instead of guessing, when a revision changes something the
policy depends on: a missing column, a duplicate code, an unknown XID 154 recovery-action
wording. ``--check`` exits 1 when the generated module is out of date (for CI).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO / "data" / "xid"
DEFAULT_OUTPUT = REPO / "gpuwatchd" / "xid" / "catalog_data.py"

XIDS_TSV = "xid_catalog_nvidia_raw.tsv"
BUCKETS_TSV = "resolution_buckets_raw.tsv"
DECODE_TSV = "xid_144_150_decode_raw.tsv"
GUIDE_TSV = "catalog_user_guide_raw.tsv"
INPUTS = (XIDS_TSV, BUCKETS_TSV, DECODE_TSV, GUIDE_TSV)

# NVML's nvmlDeviceGpuRecoveryAction_t (nvml.h; pynvml 13.615 adds 5-7). XID 154 prints
# these codes; the words after them are the driver's and have changed between releases.
NVML_RECOVERY_ACTIONS = (
    (0, "NONE"),
    (1, "GPU_RESET"),
    (2, "NODE_REBOOT"),
    (3, "DRAIN_P2P"),
    (4, "DRAIN_AND_RESET"),
    (5, "RECOVER_IMEX_DOMAIN"),
    (6, "BUS_RESET"),
    (7, "SYSTEM_REBOOT"),
)
# The workbook's wording for each NVML code, as listed in XID 154's trigger conditions.
WORKBOOK_RECOVERY_WORDS = {
    "None": "NONE",
    "GPU Reset Required": "GPU_RESET",
    "Node Reboot Required": "NODE_REBOOT",
    "Drain P2P": "DRAIN_P2P",
    "Drain and Reset": "DRAIN_AND_RESET",
}

MASK_RE = re.compile(r"[01-]{32}")


class CatalogError(Exception):
    """The workbook export is not what this generator understands."""


def read_tsv(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as f:
        return [row for row in csv.reader(f, delimiter="\t") if any(c.strip() for c in row)]


def unquote(cell: str) -> str:
    """Undo a second layer of CSV quoting that some cells carry from the xlsx export."""
    s = cell.strip()
    if len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        s = s[1:-1].replace('""', '"')
    return s


def one_line(cell: str, joiner: str = " ") -> str:
    """A cell that is a name or a label: its in-cell line breaks folded away."""
    pieces = [p.strip() for p in unquote(cell).split("\\n")]
    text = joiner.join(p for p in pieces if p)
    if joiner != " ":
        text = re.sub(r"/\s*/", "/", text)
    return " ".join(text.split())


def paragraphs(cell: str) -> str:
    """A cell of prose: line breaks kept, runs of blank lines reduced to one."""
    lines = [" ".join(p.split()) for p in unquote(cell).split("\\n")]
    text = "\n".join(lines)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def bucket(cell: str) -> str:
    return one_line(cell, " / ")


def header_index(header: list[str], sheet: str) -> dict[str, int]:
    return {one_line(h): i for i, h in enumerate(header)}


def column(index: dict[str, int], name: str, sheet: str, prefix: bool = False) -> int:
    for key, i in index.items():
        if key == name or (prefix and key.startswith(name)):
            return i
    raise CatalogError(f"{sheet}: no column {name!r} (columns: {sorted(index)})")


def cell(row: list[str], i: int) -> str:
    return row[i] if i < len(row) else ""


def yes_no(value: str, where: str) -> bool:
    v = value.strip().upper()
    if v in ("YES", "Y"):
        return True
    if v in ("NO", "N", ""):
        return False
    raise CatalogError(f"{where}: expected YES or NO, got {value!r}")


def load_xids(path: Path) -> list[dict[str, object]]:
    rows = read_tsv(path)
    sheet = f"{path.name} (sheet Xids)"
    idx = header_index(rows[0], sheet)
    c_type = column(idx, "Type (XID)", sheet)
    c_code = column(idx, "Code", sheet)
    c_mnem = column(idx, "Mnemonic", sheet)
    c_desc = column(idx, "Description", sheet)
    c_imm = column(idx, "Resolution Bucket (Immediate Action)", sheet)
    c_inv = column(idx, "Resolution Bucket (Investigatory Action)", sheet)
    c_link = column(idx, "Xid 154 linkage", sheet)
    c_trig = column(idx, "Trigger Conditions", sheet)
    products = [(k[len("Applies to ") :], i) for k, i in idx.items() if k.startswith("Applies to ")]
    if not products:
        raise CatalogError(f"{sheet}: no 'Applies to <product>' columns")
    out: list[dict[str, object]] = []
    seen: set[int] = set()
    for n, row in enumerate(rows[1:], start=2):
        where = f"{sheet} line {n}"
        if one_line(cell(row, c_type)) != "XID":
            raise CatalogError(f"{where}: unknown row type {cell(row, c_type)!r}")
        try:
            code = int(cell(row, c_code).strip())
        except ValueError:
            raise CatalogError(f"{where}: code {cell(row, c_code)!r} is not a number") from None
        if code in seen:
            raise CatalogError(f"{where}: XID {code} appears twice")
        seen.add(code)
        out.append(
            {
                "code": code,
                "mnemonic": one_line(cell(row, c_mnem)),
                "description": one_line(cell(row, c_desc)),
                "applies_to": tuple((p, yes_no(cell(row, i), where)) for p, i in products),
                "immediate": bucket(cell(row, c_imm)),
                "investigatory": bucket(cell(row, c_inv)),
                "xid154_linkage": one_line(cell(row, c_link)),
                "trigger": paragraphs(cell(row, c_trig)),
            }
        )
    return sorted(out, key=lambda r: int(str(r["code"])))


def load_buckets(path: Path) -> list[dict[str, object]]:
    rows = read_tsv(path)
    sheet = f"{path.name} (sheet Resolution Buckets)"
    idx = header_index(rows[0], sheet)
    c_name = column(idx, "Guidance Class", sheet)
    c_text = column(idx, "Resolution Action", sheet)
    out: dict[str, str] = {}
    for n, row in enumerate(rows[1:], start=2):
        name = bucket(cell(row, c_name))
        text = paragraphs(cell(row, c_text))
        if name in out and out[name] != text:
            raise CatalogError(f"{sheet} line {n}: bucket {name!r} defined twice, differently")
        out[name] = text
    return [{"name": k, "text": v} for k, v in out.items()]


def load_decode(path: Path) -> list[dict[str, object]]:
    rows = read_tsv(path)
    sheet = f"{path.name} (sheet Xid 144-150 Decode)"
    idx = header_index(rows[0], sheet)
    cols = {
        "xid": column(idx, "Xid", sheet),
        "subcode": column(idx, "Subcode", sheet, prefix=True),
        "intrinfo_v1": column(idx, "(V1(<R575)) IntrInfo decode", sheet, prefix=True),
        "intrinfo_v2": column(idx, "(V2(>=R575)) IntrInfo decode", sheet, prefix=True),
        "error_status": column(idx, "Error Status (hex)", sheet),
        "immediate": column(idx, "Resolution Bucket (Data Center Recovery Action)", sheet),
        "action2_intrinfo_v1": column(idx, "(V1(<R575)) Decode for action 2", sheet),
        "action2_intrinfo_v2": column(idx, "(V2(>=R575)) Decode for action 2", sheet),
        "action2": column(idx, "Action 2", sheet),
        "investigatory": column(idx, "Resolution Bucket (Investigatory Action)", sheet),
        "severity": column(idx, "Severity", sheet, prefix=True),
        "hw_sw": column(idx, "HW/SW", sheet),
        "local_remote": column(idx, "Local/Remote", sheet, prefix=True),
    }
    out: list[dict[str, object]] = []
    for n, row in enumerate(rows[1:], start=2):
        where = f"{sheet} line {n}"
        rec: dict[str, object] = {}
        for key, i in cols.items():
            value = cell(row, i)
            if key == "xid":
                rec[key] = int(value.strip())
            elif key == "local_remote":
                rec[key] = paragraphs(value)
            elif key in ("immediate", "action2", "investigatory"):
                rec[key] = bucket(value)
            else:
                rec[key] = one_line(value)
        for key in ("intrinfo_v1", "intrinfo_v2", "action2_intrinfo_v1", "action2_intrinfo_v2"):
            mask = str(rec[key])
            if mask and not MASK_RE.fullmatch(mask):
                raise CatalogError(f"{where}: {key} {mask!r} is not a 32-bit mask")
        out.append(rec)
    return out


def load_guide(path: Path) -> list[dict[str, object]]:
    rows = read_tsv(path)
    out: list[dict[str, object]] = []
    sheet = ""
    for row in rows[1:]:
        if one_line(cell(row, 0)):
            sheet = one_line(cell(row, 0))
        out.append(
            {"sheet": sheet, "column": one_line(cell(row, 1)), "text": paragraphs(cell(row, 2))}
        )
    return out


def recovery_actions(xids: list[dict[str, object]]) -> list[dict[str, object]]:
    """XID 154's codes, checked against the wording in its trigger conditions."""
    row = next((r for r in xids if r["code"] == 154), None)
    if row is None:
        raise CatalogError("XID 154 is missing from the catalog")
    text = str(row["trigger"])
    by_name = dict((name, code) for code, name in NVML_RECOVERY_ACTIONS)
    for hex_code, words in re.findall(r"0x([0-9a-fA-F]+) \(([^)]+)\)", text):
        name = WORKBOOK_RECOVERY_WORDS.get(words)
        if name is None or by_name[name] != int(hex_code, 16):
            raise CatalogError(f"XID 154: example '0x{hex_code} ({words})' disagrees with NVML")
    tail = text.split("expected values", 1)
    if len(tail) != 2:
        raise CatalogError("XID 154: trigger conditions no longer list the expected values")
    listed = re.findall(r'"([^"]+)"', tail[1])
    unknown = [w for w in listed if w not in WORKBOOK_RECOVERY_WORDS]
    if not listed or unknown:
        raise CatalogError(
            f"XID 154 lists recovery actions {unknown or listed!r} that this generator does not"
            " map to an NVML code; add them to WORKBOOK_RECOVERY_WORDS"
        )
    words_for = {WORKBOOK_RECOVERY_WORDS[w]: w for w in listed}
    return [
        {"code": code, "nvml_name": name, "workbook_text": words_for.get(name, "")}
        for code, name in NVML_RECOVERY_ACTIONS
    ]


def py_str(s: str) -> str:
    """A string literal the way ruff format writes it (double quotes unless costlier)."""
    quote = "'" if s.count('"') > s.count("'") else '"'
    out = []
    for ch in s:
        if ch == "\\":
            out.append("\\\\")
        elif ch == quote:
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return quote + "".join(out) + quote


def py_value(v: object) -> str:
    if isinstance(v, bool):
        return "True" if v else "False"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return py_str(v)
    if isinstance(v, tuple):
        inner = ", ".join(py_value(x) for x in v)
        return f"({inner},)" if len(v) == 1 else f"({inner})"
    raise TypeError(f"cannot render {v!r}")


def render_rows(name: str, type_name: str, rows: list[dict[str, object]]) -> list[str]:
    out = [f"{name}: Final[tuple[{type_name}, ...]] = ("]
    for rec in rows:
        out.append(f"    {type_name}(")
        out.extend(f"        {k}={py_value(v)}," for k, v in rec.items())
        out.append("    ),")
    out.append(")")
    return out


def render(data_dir: Path = DEFAULT_DATA) -> str:
    """The text of catalog_data.py for the TSVs in ``data_dir``."""
    missing = [n for n in INPUTS if not (data_dir / n).is_file()]
    if missing:
        raise CatalogError(f"{data_dir}: missing {', '.join(missing)}")
    xids = load_xids(data_dir / XIDS_TSV)
    buckets = load_buckets(data_dir / BUCKETS_TSV)
    decode = load_decode(data_dir / DECODE_TSV)
    guide = load_guide(data_dir / GUIDE_TSV)
    actions = recovery_actions(xids)
    sums = [(n, hashlib.sha256((data_dir / n).read_bytes()).hexdigest()) for n in INPUTS]

    lines = [
        "# Generated by tools/gen_xid_catalog.py from data/xid/*.tsv. Do not edit.",
        "# Regenerate: .venv/bin/python tools/gen_xid_catalog.py",
        "# ruff: noqa: E501, RUF001",
        '"""NVIDIA\'s XID catalog workbook as data (generated by tools/gen_xid_catalog.py).',
        "",
        "Source: NVIDIA, Analyzing Xid Errors with the Xid Catalog, Xid-Catalog.xlsx",
        "(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html). Text is",
        "NVIDIA's; gpuwatchd's interpretation (severity, action) lives in catalog.py.",
        '"""',
        "",
        "from __future__ import annotations",
        "",
        "from typing import Final",
        "",
        "from gpuwatchd.xid.rows import (",
        "    BucketRow,",
        "    ColumnNote,",
        "    NvlinkDecodeRow,",
        "    RecoveryActionRow,",
        "    XidRow,",
        ")",
        "",
        "# sha256 of each input TSV this module was generated from",
        "SOURCES: Final[tuple[tuple[str, str], ...]] = (",
        *(f"    (\n        {py_str(n)},\n        {py_str(h)},\n    )," for n, h in sums),
        ")",
        "",
        *render_rows("XIDS", "XidRow", xids),
        "",
        *render_rows("BUCKETS", "BucketRow", buckets),
        "",
        *render_rows("NVLINK5_DECODE", "NvlinkDecodeRow", decode),
        "",
        *render_rows("RECOVERY_ACTIONS", "RecoveryActionRow", actions),
        "",
        *render_rows("COLUMN_NOTES", "ColumnNote", guide),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help="directory of TSVs")
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="module to write")
    ap.add_argument("--check", action="store_true", help="exit 1 if --output is out of date")
    args = ap.parse_args(argv)
    try:
        text = render(args.data_dir)
    except CatalogError as e:
        print(f"gen_xid_catalog: {e}", file=sys.stderr)
        return 2
    current = args.output.read_text(encoding="utf-8") if args.output.exists() else None
    if args.check:
        if current != text:
            print(f"gen_xid_catalog: {args.output} is out of date; regenerate it", file=sys.stderr)
            return 1
        return 0
    if current != text:
        args.output.write_text(text, encoding="utf-8")
        print(f"gen_xid_catalog: wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
