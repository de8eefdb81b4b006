"""The condition kinds: one module each, all in the registry, and the shipped JSON Schema
built from their pieces."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import gpuwatchd.rules.conditions as conditions_pkg
from gpuwatchd.rules import schema
from gpuwatchd.rules.conditions.base import ConditionKind
from gpuwatchd.rules.conditions.registry import BY_KEY, KINDS
from gpuwatchd.rules.loader import CONDITION_KEYS

ROOT = Path(__file__).resolve().parent.parent.parent


def test_shipped_schema_is_generated_from_the_kinds() -> None:
    shipped = (ROOT / "rules" / "schema.json").read_text()
    assert shipped == schema.text(), (
        "rules/schema.json is out of date: python -m gpuwatchd.rules.schema > rules/schema.json"
    )


def test_every_kind_module_is_registered_once() -> None:
    found: dict[str, ConditionKind] = {}
    for info in pkgutil.iter_modules(conditions_pkg.__path__):
        module = importlib.import_module(f"gpuwatchd.rules.conditions.{info.name}")
        kind = getattr(module, "KIND", None)
        if isinstance(kind, ConditionKind):
            assert kind.key == info.name, f"{info.name}.py defines kind {kind.key!r}"
            found[kind.key] = kind
    assert sorted(found) == sorted(BY_KEY)
    assert len(KINDS) == len(BY_KEY)
    assert all(found[k.key] is k for k in KINDS)


def test_each_kind_describes_exactly_the_keys_it_reads() -> None:
    for kind in KINDS:
        piece = kind.schema()
        body = piece["oneOf"][0] if "oneOf" in piece else piece
        assert list(body["properties"]) == list(kind.keys), kind.key
        assert CONDITION_KEYS[kind.key] == kind.keys
