"""The rule language in JSON Schema, built from the rule keys and each condition kind's
piece (``ConditionKind.schema``).

The shipped copy is ``rules/schema.json`` (for editors and CI linters); a test holds it
equal to ``build()``. After changing a kind, regenerate it:

    python -m gpuwatchd.rules.schema > rules/schema.json
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.rules.conditions import schema_parts as sp
from gpuwatchd.rules.conditions.registry import KINDS
from gpuwatchd.rules.loader import RESERVED_LABELS_ORDER

SEVERITY: sp.Schema = {"enum": [s.value for s in AlertSeverity]}
NAME_PATTERN = "^[A-Za-z][A-Za-z0-9_]{0,99}$"
LABEL_PATTERN = "^[A-Za-z_][A-Za-z0-9_]*$"
TEMPLATE: sp.Schema = {
    "type": "string",
    "description": "Text with {placeholders}: {gpu}, {uuid}, {pci_bus_id}, {model}, {node}, "
    "{value}, ... (docs/rules.md).",
}


def _rule() -> sp.Schema:
    strings: sp.Schema = {"type": "array", "items": {"type": "string"}}
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN},
            "description": {"type": "string"},
            "severity": SEVERITY,
            "for": sp.duration(),
            "keep_firing_for": sp.duration(),
            "select": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"models": strings, "gpus": strings},
                "description": "Which GPUs (by model, UUID or PCI bus id); default all.",
            },
            "when": sp.body(
                {"field": sp.fields(links=False), "op": sp.op(), "value": sp.VALUE},
                "A GPU takes part only while this holds on its latest sample.",
                required=("field", "op", "value"),
            ),
            "condition": {"$ref": "#/$defs/condition"},
            "labels": {
                "type": "object",
                "propertyNames": {
                    "pattern": LABEL_PATTERN,
                    "not": {"enum": list(RESERVED_LABELS_ORDER)},
                },
                "additionalProperties": {"type": "string"},
            },
            "annotations": {
                "type": "object",
                "propertyNames": {"pattern": LABEL_PATTERN},
                "additionalProperties": TEMPLATE,
            },
            "drain": {"type": "boolean"},
            "routes": {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "uniqueItems": True,
            },
            "escalate": sp.body(
                {
                    "after": {"enum": ["reboot"]},
                    "within": sp.duration(),
                    "severity": SEVERITY,
                    "drain": {"type": "boolean"},
                    "annotations": {"type": "object", "additionalProperties": TEMPLATE},
                },
                "What changes when the same alert fires again after a reboot.",
                required=("severity",),
            ),
        },
        "required": ["name", "severity", "condition"],
    }


def build() -> dict[str, Any]:
    """The whole schema of a rule file."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://gpuwatchd.invalid/rules/schema.json",
        "title": "gpuwatchd rule file",
        "description": "Alert rules for gpuwatchd (docs/rules.md). Validate with `gpuwatchd "
        "check-config RULE_FILE`, which also checks what a schema cannot: XID codes against "
        "NVIDIA's catalog, placeholders per condition, unique names.",
        "type": "object",
        "additionalProperties": False,
        "required": ["rules"],
        "properties": {"rules": {"type": "array", "items": {"$ref": "#/$defs/rule"}}},
        "$defs": {
            "duration": {
                "oneOf": [
                    {"type": "number", "minimum": 0},
                    {"type": "string", "pattern": r"^(\d+(\.\d+)?(ms|s|m|h|d|w))+$"},
                ],
                "description": "A number of seconds, or a number and a unit with no space: "
                "250ms, 30s, 5m, 2h, 1d, 1w, combined like 1h30m.",
            },
            "condition": {
                "type": "object",
                "minProperties": 1,
                "maxProperties": 1,
                "additionalProperties": False,
                "properties": {kind.key: kind.schema() for kind in KINDS},
                "description": "Exactly one condition.",
            },
            "rule": _rule(),
        },
    }


def text() -> str:
    """``build()`` as the shipped file's text."""
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(text())
