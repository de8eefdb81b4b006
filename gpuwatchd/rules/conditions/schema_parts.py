"""Building blocks for the condition kinds' pieces of the JSON Schema (rules/schema.json)."""

from __future__ import annotations

from typing import Any

from gpuwatchd.core.fields import GPU_FIELDS, LINK_FIELDS
from gpuwatchd.rules.model import OPS

Schema = dict[str, Any]

DURATION: Schema = {"$ref": "#/$defs/duration"}
VALUE: Schema = {
    "oneOf": [
        {"type": "number"},
        {
            "type": "string",
            "pattern": r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[A-Za-z%]*\s*$",
        },
    ],
    "description": "A number in base units, or a number with a unit (85, 1980MHz, 97%).",
}


def fields(*, links: bool = True) -> Schema:
    """Any sampled field name (GPU fields, then per-link fields when ``links``), or the
    name of an extra NVML field from the config's ``fields`` section."""
    names = sorted(GPU_FIELDS) + (sorted(LINK_FIELDS) if links else [])
    return {
        "anyOf": [
            {"enum": names},
            {
                "type": "string",
                "pattern": "^[a-z][a-z0-9_]{0,63}$",
                "description": "An extra NVML field named in the config's `fields` section.",
            },
        ]
    }


def op(default: str | None = None) -> Schema:
    out: Schema = {"enum": list(OPS)}
    if default is not None:
        out["default"] = default
    return out


def duration(default: str | None = None) -> Schema:
    out = dict(DURATION)
    if default is not None:
        out["default"] = default
    return out


def enum_list(names: list[str] | tuple[str, ...]) -> Schema:
    return {"type": "array", "items": {"enum": list(names)}, "minItems": 1}


def body(
    properties: Schema,
    description: str,
    *,
    required: tuple[str, ...] = (),
    optional_body: bool = False,
) -> Schema:
    """A condition's body: an object of ``properties``; with ``optional_body`` it may also
    be left empty (``gpu_count:`` alone)."""
    out: Schema = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = list(required)
    out["description"] = description
    if optional_body:
        return {"oneOf": [out, {"type": "null"}]}
    return out
