"""The ``rules:`` section of the config file: which rule files the engine loads.

    rules:
      files: [/etc/gpuwatchd/rules.d/*.yaml]   # paths or globs, relative to the config file
      defaults: true                           # also load the shipped rules
      disable: [GpuPcieDowntrained]            # rule names to leave out
      no_drain: [NvswitchSxidFatal]            # rules that alert but never drain
      evaluation_interval: 10s                 # gauge rules at most this often

The rule files themselves are read and validated by ``gpuwatchd.rules`` (at start-up, on
reload and by ``check-config``), not here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.config.paths import default_rule_files
from gpuwatchd.config.yamlsrc import Node, Reader

MAX_EVALUATION_INTERVAL = 60.0  # gauges judged at least once a minute


@dataclass(frozen=True)
class RulesConfig:
    files: tuple[str, ...] = field(default_factory=default_rule_files)
    defaults: bool = True
    disable: tuple[str, ...] = ()
    no_drain: tuple[str, ...] = ()
    # How often the rules are evaluated when nothing urgent arrived (never more often than
    # the polls): an XID, a lost GPU, a counter that moved or a field that a rule without
    # a long enough ``for`` reads is judged at once; gauges wait for the next evaluation.
    evaluation_interval: float = 10.0


def read_rules(r: Reader, node: Node | None, base_dir: str | None) -> RulesConfig:
    d = RulesConfig()
    if node is None or node.value is None:
        return d
    keys = r.mapping(
        node, ["files", "defaults", "disable", "no_drain", "evaluation_interval"], "rules"
    )
    if keys is None:
        return d
    values: dict[str, Any] = {}
    if "files" in keys and keys["files"].value is not None:
        files: list[str] = []
        for item in r.sequence(keys["files"], "rules.files") or []:
            text = r.string(item, "rules.files")
            if text is None:
                continue
            if not text:
                r.error(item.loc, "rules.files: an empty path")
                continue
            if base_dir is not None and not os.path.isabs(text):
                text = os.path.join(base_dir, text)
            text = os.path.normpath(text)
            if text in files:
                r.error(item.loc, f"rules.files: {text!r} is listed twice")
                continue
            files.append(text)
        values["files"] = tuple(files)
    if "defaults" in keys:
        values["defaults"] = r.boolean(keys["defaults"], "rules.defaults")
    if "evaluation_interval" in keys:
        values["evaluation_interval"] = r.duration(
            keys["evaluation_interval"],
            "rules.evaluation_interval",
            maximum=MAX_EVALUATION_INTERVAL,
        )
    for key in ("disable", "no_drain"):
        if key in keys and keys[key].value is not None:
            values[key] = _names(r, keys[key], f"rules.{key}")
    return RulesConfig(**{**d.__dict__, **{k: v for k, v in values.items() if v is not None}})


def _names(r: Reader, node: Node, what: str) -> tuple[str, ...]:
    """A list of rule names, each once (which rules exist is the rule loader's check)."""
    names: list[str] = []
    for item in r.sequence(node, what) or []:
        text = r.string(item, what)
        if text is None:
            continue
        if text in names:
            r.error(item.loc, f"{what}: {text!r} is listed twice")
            continue
        names.append(text)
    return tuple(names)
