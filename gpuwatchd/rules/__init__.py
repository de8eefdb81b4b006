"""Alert rules: the language (YAML), the engine (a pipeline stage) and its durable state.

docs/rules.md describes the rule language; ``rules/`` in the source tree holds the
shipped rules (also installed as ``gpuwatchd/data/rules``).
"""

from __future__ import annotations

from .engine import Alert, Engine
from .loader import default_rule_files, load_rule_set, parse_rules, rules_from_config
from .model import Rule, RuleSet
from .stage import RulesStage, rules_stage
from .store import StateStore

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
    "rules_from_config",
    "rules_stage",
]
