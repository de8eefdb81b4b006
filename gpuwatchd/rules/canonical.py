"""The canonical form of a rule file: one layout, so that diffs show only real changes.

The canonical text is the file's leading comment block, unchanged, followed by its data
dumped with keys in the order of the language (``loader.RULE_KEYS``, the condition's own
order), lists of scalars in flow style (``[48, 63]``) and everything else in block style.
Values are kept as written (``5m`` stays ``5m``). ``gpuwatchd rules fmt`` writes it; a test
holds every shipped file to it.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuwatchd.config.yamlsrc import Node, parse
from gpuwatchd.rules.loader import CONDITION_KEYS, ESCALATE_KEYS, GUARD_KEYS, RULE_KEYS, SELECT_KEYS

WIDTH = 92
FOLD_AT = 72  # longer strings are written folded (>-), wrapped at WIDTH


def _ordered(mapping: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    out = {k: mapping[k] for k in order if k in mapping}
    out.update({k: v for k, v in mapping.items() if k not in out})
    return out


def _rule(rule: Any) -> Any:
    if not isinstance(rule, dict):
        return rule
    out = _ordered(rule, RULE_KEYS)
    cond = out.get("condition")
    if isinstance(cond, dict):
        out["condition"] = {
            kind: _ordered(body, CONDITION_KEYS[kind])
            if isinstance(body, dict) and kind in CONDITION_KEYS
            else body
            for kind, body in cond.items()
        }
    for key, order in (("when", GUARD_KEYS), ("select", SELECT_KEYS), ("escalate", ESCALATE_KEYS)):
        if isinstance(out.get(key), dict):
            out[key] = _ordered(out[key], order)
    return out


class _Dumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = all(not isinstance(x, dict | list) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    if len(data) > FOLD_AT and data == data.strip() and "  " not in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=">")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(list, _represent_list)
_Dumper.add_representer(str, _represent_str)


def header(text: str) -> str:
    """The leading comment block (and blank lines) of a file."""
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    for line in lines:
        if line.startswith("#") or not line.strip():
            out.append(line)
        else:
            break
    return "".join(out)


def dump(plain: Any) -> str:
    return yaml.dump(
        plain,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=WIDTH,
        allow_unicode=True,
        indent=2,
    )


def canonical_data(root: Node | None) -> Any:
    if root is None:
        return None
    plain = root.plain()
    if isinstance(plain, dict) and isinstance(plain.get("rules"), list):
        plain = dict(plain)
        plain["rules"] = [_rule(r) for r in plain["rules"]]
    return plain


def canonical_text(text: str, path: str) -> str:
    """The canonical form of a rule file's text (raises ``ConfigError`` if it is not YAML)."""
    root = parse(text, path)
    data = canonical_data(root)
    head = header(text)
    if data is None:
        return head
    return head + dump(data)
