"""The ``fields:`` section of the config file: extra NVML field ids polled by number.

    fields:
      - id: 32                          # an NVML_FI_DEV_* number of the installed driver
        name: nvlink_crc_flit_errors_l0
        kind: counter                   # or gauge (default)
        help: "NVLink flit CRC errors, lane 0."
        scale: 1                        # factor to base units (optional, default 1)
        slow: false                     # read every 10 s with the costly counters

Each entry becomes a sampled field under ``name``: rules use it as ``field: <name>``,
scenarios set it by name, /metrics shows it as ``gpuwatchd_field_<name>`` (a gauge) or
``gpuwatchd_field_<name>_total`` (a counter). The NVML backend asks for these ids in its one
``nvmlDeviceGetFieldValues`` call per GPU per poll; an id the driver does not know answers
INVALID_ARGUMENT or NOT_SUPPORTED and the field is absent from the samples, as a built-in one
would be; ``core.fieldcheck`` reports it (a log line, a metric, the status API).
"""

from __future__ import annotations

import re

from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.errors import Location
from gpuwatchd.core.fields import (
    EXTRA_FIELD_ID_MAX,
    GPU_FIELDS,
    LINK_FIELDS,
    MAX_EXTRA_FIELDS,
    ExtraField,
    MetricKind,
)

ENTRY_KEYS = ("id", "name", "kind", "help", "scale", "slow")
KINDS: tuple[MetricKind, ...] = ("gauge", "counter")
MAX_HELP = 200
_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
# suffixes the exposition formats give meaning to: a field named with one would break
# ``promtool check metrics`` or collide with a series another metric already has
RESERVED_SUFFIXES = {
    "_count": "a histogram's or summary's count",
    "_sum": "a histogram's or summary's sum",
    "_bucket": "a histogram's buckets",
    "_created": "the creation time OpenMetrics gives every counter",
}


def as_entry(field: ExtraField) -> dict[str, object]:
    """One entry in the section's own shape (``check-config --print`` reloads it)."""
    return {
        "id": field.field_id,
        "name": field.name,
        "kind": field.kind,
        "help": field.help,
        "scale": field.scale,
        "slow": field.slow,
    }


def read_fields(r: Reader, node: Node | None) -> tuple[ExtraField, ...]:
    """The section's entries; every problem goes into ``r`` with its location."""
    if node is None or node.value is None:
        return ()
    items = r.sequence(node, "fields")
    if items is None:
        return ()
    if len(items) > MAX_EXTRA_FIELDS:
        r.error(
            node.loc,
            f"fields: at most {MAX_EXTRA_FIELDS} extra fields, got {len(items)} "
            "(each one is read from every GPU on every poll)",
        )
        return ()
    out: list[ExtraField] = []
    ids: dict[int, int] = {}
    names: dict[str, int] = {}
    for i, item in enumerate(items):
        what = f"fields[{i}]"
        entry = _read_entry(r, item, what)
        if entry is None:
            continue
        bad = False
        if entry.field_id in ids:
            r.error(
                _at(item, "id"),
                f"{what}.id: field id {entry.field_id} is already fields[{ids[entry.field_id]}]",
            )
            bad = True
        if entry.name in names:
            r.error(
                _at(item, "name"),
                f"{what}.name: {entry.name!r} is already the name of fields[{names[entry.name]}]",
            )
            bad = True
        if bad:
            continue
        ids[entry.field_id] = i
        names[entry.name] = i
        out.append(entry)
    return tuple(out)


def _at(item: Node, key: str) -> Location:
    found = item.get(key) if item.is_mapping() else None
    return (found or item).loc


def _read_entry(r: Reader, item: Node, what: str) -> ExtraField | None:
    keys = r.mapping(item, list(ENTRY_KEYS), what, required=("id", "name"))
    if keys is None or "id" not in keys or "name" not in keys:
        return None
    ok = True
    field_id = r.integer(keys["id"], f"{what}.id")
    if field_id is not None and not 1 <= field_id <= EXTRA_FIELD_ID_MAX:
        r.error(
            keys["id"].loc,
            f"{what}.id: {field_id} is not an NVML field id (1 to {EXTRA_FIELD_ID_MAX})",
        )
        field_id = None
    name = _read_name(r, keys["name"], f"{what}.name")
    kind: MetricKind = "gauge"
    if (n := keys.get("kind")) is not None:
        got = r.string(n, f"{what}.kind", KINDS)
        if got is None:
            ok = False
        else:
            kind = "counter" if got == "counter" else "gauge"
    help_text = ""
    if (n := keys.get("help")) is not None:
        text = r.string(n, f"{what}.help")
        if text is None:
            ok = False
        elif len(text) > MAX_HELP or any(not c.isprintable() for c in text):
            r.error(
                n.loc, f"{what}.help: one line of printable text, at most {MAX_HELP} characters"
            )
            ok = False
        else:
            help_text = text.strip()
    scale = 1.0
    if (n := keys.get("scale")) is not None:
        got_scale = r.number(n, f"{what}.scale")
        if got_scale is None:
            ok = False
        elif got_scale == 0:
            r.error(n.loc, f"{what}.scale: must not be 0")
            ok = False
        else:
            scale = got_scale
    slow = False
    if (n := keys.get("slow")) is not None:
        got_slow = r.boolean(n, f"{what}.slow")
        ok = ok and got_slow is not None
        slow = bool(got_slow)
    if field_id is None or name is None or not ok:
        return None
    return ExtraField(field_id, name, kind, help_text, scale, slow)


def _read_name(r: Reader, node: Node, what: str) -> str | None:
    name = r.string(node, what)
    if name is None:
        return None
    if not _NAME_RE.fullmatch(name):
        r.error(
            node.loc,
            f"{what}: {name!r} is not a field name (a lowercase letter, then up to 63 "
            "lowercase letters, digits or underscores)",
        )
        return None
    if name in GPU_FIELDS or name in LINK_FIELDS:
        r.error(node.loc, f"{what}: {name!r} is a built-in field; choose another name")
        return None
    if name.endswith("_total"):
        r.error(
            node.loc,
            f"{what}: {name!r} ends in _total; leave it out (a counter's metric gets it)",
        )
        return None
    for suffix, meaning in RESERVED_SUFFIXES.items():
        if name.endswith(suffix):
            r.error(
                node.loc,
                f"{what}: {name!r} ends in {suffix}, which the exposition formats reserve "
                f"for {meaning}; choose another name",
            )
            return None
    return name
