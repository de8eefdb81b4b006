"""Alert rules: the language (YAML), the engine (a pipeline stage) and its durable state.

docs/rules.md describes the rule language; ``rules/`` in the source tree holds the
shipped rules (also installed as ``gpuwatchd/data/rules``).
"""

from __future__ import annotations

from gpuwatchd.rules.engine import Alert, Engine
from gpuwatchd.rules.loader import (
    default_rule_files,
    load_rule_set,
    parse_rules,
    rules_from_settings,
)
from gpuwatchd.rules.model import Rule, RuleSet
from gpuwatchd.rules.stage import RulesStage, rules_stage
from gpuwatchd.rules.store import StateStore

__all__ = [
    "Alert",
    "Engine",
    "Rule",
    "RuleSet",
    "RulesStage",
    "StateStore",
    "default_rule_files",
    "load_rule_set",
    "parse_rules",
    "rules_from_settings",
    "rules_stage",
]
