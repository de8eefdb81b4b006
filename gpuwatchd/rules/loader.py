"""Rule files (YAML) to a ``RuleSet``, with every mistake reported as ``PATH:LINE:COL``.

A rule file is a mapping with one key, ``rules``, a list of rules. docs/rules.md describes
the language; ``rules/schema.json`` is the same in JSON Schema for editors. The loader
checks everything it can before the daemon runs a rule: key names (with did-you-mean),
duplicate keys, types, durations, field names, XID codes and catalog buckets, throttle
reason names, annotation placeholders, and rule names unique across all files. It reads
every file completely and reports all problems at once.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Mapping
from importlib import resources
from types import MappingProxyType

from gpuwatchd.config import yamlsrc
from gpuwatchd.config.sections import normalize_gpu_id
from gpuwatchd.config.stages import RulesSettings
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.errors import ConfigError, Location
from gpuwatchd.core.fields import ExtraField, gpu_fields_with
from gpuwatchd.rules.conditions.reading import BodyReader, hint
from gpuwatchd.rules.conditions.registry import BY_KEY, KINDS
from gpuwatchd.rules.model import Condition, Escalation, Guard, Rule, RuleSet, Selector
from gpuwatchd.rules.templates import Template, compile_template
from gpuwatchd.xid import catalog as xid_catalog

# -- the schema, as tables the loader, the canonical form and the JSON Schema share --------
TOP_KEYS = ("rules",)
RULE_KEYS = (
    "name",
    "description",
    "severity",
    "for",
    "keep_firing_for",
    "select",
    "when",
    "condition",
    "labels",
    "annotations",
    "drain",
    "routes",
    "escalate",
)
CONDITION_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType({k.key: k.keys for k in KINDS})
SELECT_KEYS = ("models", "gpus")
GUARD_KEYS = ("field", "op", "value")
ESCALATE_KEYS = ("after", "within", "severity", "drain", "annotations")
SEVERITIES = tuple(s.value for s in AlertSeverity)
IDENTITY_LABELS = ("node", "gpu", "uuid", "pci_bus_id", "model", "link", "xid")
RESERVED_LABELS_ORDER = (*IDENTITY_LABELS, "alertname", "severity", "rule")
RESERVED_LABELS = frozenset(RESERVED_LABELS_ORDER)

COMMON_PLACEHOLDERS = frozenset({"node", "rule", "severity", "value"})
GPU_PLACEHOLDERS = frozenset({"gpu", "uuid", "pci_bus_id", "model"})
_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = re.compile(r"[*?\[]")


def placeholders_for(kind: str, link: bool) -> frozenset[str]:
    found = BY_KEY.get(kind)
    names = set(COMMON_PLACEHOLDERS)
    if found is not None:
        names |= found.placeholders
    if found is None or not found.node_level:
        names |= GPU_PLACEHOLDERS
    if link:
        names.add("link")
    return frozenset(names)


# -- the per-file parser --------------------------------------------------------------------
class RuleParser:
    """Reads rule files into ``Rule`` objects, collecting every problem in one ``Reader``."""

    def __init__(
        self,
        catalog: xid_catalog.Catalog | None = None,
        extra_fields: tuple[ExtraField, ...] = (),
    ) -> None:
        self.r = Reader()
        self.catalog = catalog or xid_catalog.Catalog.default()
        self.body = BodyReader(self.r, self.catalog, gpu_fields_with(extra_fields))
        self.seen: dict[str, Location] = {}

    # -- helpers ------------------------------------------------------------------------
    def _keys(
        self, node: Node, allowed: tuple[str, ...], what: str, required: tuple[str, ...] = ()
    ) -> dict[str, Node] | None:
        keys = self.r.mapping(node, list(allowed), what)
        if keys is None:
            return None
        for key in required:
            if key not in keys:
                self.r.error(node.loc, f"{what}: missing required key {key!r}")
        return keys

    def _duration(
        self, node: Node, what: str, *, positive: bool = False, maximum: float | None = None
    ) -> float | None:
        return self.body.duration(node, what, positive=positive, maximum=maximum)

    # -- files --------------------------------------------------------------------------
    def file(self, root: Node | None, path: str) -> list[Rule]:
        if root is None or root.value is None:
            return []  # an empty file (all comments) holds no rules
        keys = self._keys(root, TOP_KEYS, "rule file", required=("rules",))
        if keys is None or "rules" not in keys:
            return []
        items = self.r.sequence(keys["rules"], "rules")
        rules: list[Rule] = []
        for i, item in enumerate(items or []):
            rule = self.rule(item, i)
            if rule is not None:
                rules.append(rule)
        return rules

    def rule(self, node: Node, index: int) -> Rule | None:
        what = f"rules[{index}]"
        before = len(self.r.problems)  # counting the missing required keys too
        keys = self._keys(node, RULE_KEYS, what, required=("name", "severity", "condition"))
        if keys is None:
            return None
        name = None
        if "name" in keys:
            name = self.r.string(keys["name"], f"{what}.name")
            if name is not None and not _NAME_RE.fullmatch(name):
                self.r.error(
                    keys["name"].loc,
                    f"{what}.name: {name!r} is not a rule name (a letter, then letters, digits "
                    "or '_', at most 100 characters, e.g. GpuTemperatureHigh)",
                )
                name = None
            if name is not None:
                first = self.seen.get(name)
                if first is not None:
                    self.r.error(
                        keys["name"].loc,
                        f"{what}.name: rule {name!r} is already defined at {first}",
                    )
                else:
                    self.seen[name] = keys["name"].loc
        if name:
            what = f"rule {name!r}"
        severity = None
        if "severity" in keys:
            text = self.r.string(keys["severity"], f"{what}.severity", SEVERITIES)
            severity = AlertSeverity(text) if text else None
        description = ""
        if "description" in keys:
            description = self.r.string(keys["description"], f"{what}.description") or ""
        for_ = 0.0
        if "for" in keys:
            for_ = self._duration(keys["for"], f"{what}.for", maximum=30 * 86400) or 0.0
        keep = 0.0
        if "keep_firing_for" in keys:
            keep = (
                self._duration(
                    keys["keep_firing_for"], f"{what}.keep_firing_for", maximum=30 * 86400
                )
                or 0.0
            )
        cond_kind: str | None = None
        condition: Condition | None = None
        if "condition" in keys:
            parsed = self.condition(keys["condition"], f"{what}.condition")
            if parsed is not None:
                cond_kind, condition = parsed
        when = self.guard(keys["when"], f"{what}.when") if "when" in keys else None
        select = self.selector(keys["select"], f"{what}.select") if "select" in keys else None
        kind = BY_KEY.get(cond_kind or "")
        if kind is not None:
            for key, why in kind.not_with.items():
                if key in keys:
                    self.r.error(keys[key].loc, f"{what}.{key}: {why}")
        labels = self.labels(keys["labels"], f"{what}.labels") if "labels" in keys else {}
        link = condition.link if condition is not None else False
        allowed = placeholders_for(cond_kind or "", link)
        annotations: dict[str, Template] = {}
        if "annotations" in keys:
            annotations = self.annotations(keys["annotations"], f"{what}.annotations", allowed)
        drain = False
        if "drain" in keys:
            drain = bool(self.r.boolean(keys["drain"], f"{what}.drain"))
        routes: tuple[str, ...] = ()
        if "routes" in keys:
            routes = tuple(self.routes(keys["routes"], f"{what}.routes"))
        escalate = None
        if "escalate" in keys:
            escalate = self.escalate(keys["escalate"], f"{what}.escalate", allowed)
        if len(self.r.problems) > before:
            return None
        assert name is not None and severity is not None
        assert cond_kind is not None and condition is not None
        return Rule(
            name=name,
            severity=severity,
            kind=cond_kind,
            condition=condition,
            loc=keys["name"].loc,
            description=description,
            for_=for_,
            keep_firing_for=keep,
            when=when,
            select=select,
            labels=MappingProxyType(labels),
            annotations=MappingProxyType(annotations),
            drain=drain,
            routes=routes,
            escalate=escalate,
        )

    # -- rule parts ---------------------------------------------------------------------
    def guard(self, node: Node, what: str) -> Guard | None:
        keys = self._keys(node, GUARD_KEYS, what, required=GUARD_KEYS)
        if keys is None or len(keys) < 3:
            return None
        found = self.body.field(keys["field"], f"{what}.field", allow_link=False)
        op = self.body.op(keys["op"], f"{what}.op", ">")
        value = self.body.value(keys["value"], f"{what}.value", found[1] if found else None)
        if found is None or op is None or value is None:
            return None
        return Guard(found[0], op, value)

    def selector(self, node: Node, what: str) -> Selector | None:
        keys = self._keys(node, SELECT_KEYS, what)
        if keys is None:
            return None
        models = (
            frozenset(t for t, _ in self.body.strings(keys["models"], f"{what}.models"))
            if ("models" in keys)
            else frozenset()
        )
        gpus: set[str] = set()
        if "gpus" in keys:
            for text, item in self.body.strings(keys["gpus"], f"{what}.gpus"):
                gpu_id = normalize_gpu_id(text)
                if gpu_id is None:
                    self.r.error(
                        item.loc,
                        f"{what}.gpus: {text!r} is neither a GPU UUID (GPU-...) nor a PCI bus "
                        "id (00000000:3B:00.0); GPU indexes change across reboots",
                    )
                else:
                    gpus.add(gpu_id.upper())
        return Selector(models, frozenset(gpus))

    def labels(self, node: Node, what: str) -> dict[str, str]:
        out: dict[str, str] = {}
        if not node.is_mapping():
            self.r.error(node.loc, f"{what}: expected a mapping of label names to strings")
            return out
        for key_node, value_node in node.items():
            key = key_node.value
            if not _LABEL_RE.fullmatch(key) or key.startswith("__"):
                self.r.error(
                    key_node.loc, f"{what}: {key!r} is not a label name ([A-Za-z_][A-Za-z0-9_]*)"
                )
                continue
            if key in RESERVED_LABELS:
                self.r.error(
                    key_node.loc,
                    f"{what}: {key!r} is set by gpuwatchd (reserved: "
                    f"{', '.join(sorted(RESERVED_LABELS))})",
                )
                continue
            value = self.r.string(value_node, f"{what}.{key}")
            if value is not None:
                out[key] = value
        return out

    def annotations(self, node: Node, what: str, allowed: frozenset[str]) -> dict[str, Template]:
        out: dict[str, Template] = {}
        if not node.is_mapping():
            self.r.error(node.loc, f"{what}: expected a mapping of names to template strings")
            return out
        for key_node, value_node in node.items():
            key = key_node.value
            if not _LABEL_RE.fullmatch(key):
                self.r.error(key_node.loc, f"{what}: {key!r} is not an annotation name")
                continue
            text = self.r.string(value_node, f"{what}.{key}")
            if text is None:
                continue
            compiled = compile_template(text, allowed)
            if isinstance(compiled, str):
                self.r.error(value_node.loc, f"{what}.{key}: {compiled}")
                continue
            out[key] = compiled
        return out

    def routes(self, node: Node, what: str) -> list[str]:
        out: list[str] = []
        for text, item in self.body.strings(node, what):
            if not text or text in out:
                self.r.error(item.loc, f"{what}: {text!r} is empty or listed twice")
                continue
            out.append(text)
        return out

    def escalate(self, node: Node, what: str, allowed: frozenset[str]) -> Escalation | None:
        keys = self._keys(node, ESCALATE_KEYS, what, required=("severity",))
        if keys is None:
            return None
        before = len(self.r.problems)
        if "after" in keys:
            self.r.string(keys["after"], f"{what}.after", ("reboot",))
        within = 30 * 86400.0
        if "within" in keys:
            within = self._duration(keys["within"], f"{what}.within", positive=True) or within
        text = (
            self.r.string(keys["severity"], f"{what}.severity", SEVERITIES)
            if "severity" in keys
            else None
        )
        drain = False
        if "drain" in keys:
            drain = bool(self.r.boolean(keys["drain"], f"{what}.drain"))
        annotations: dict[str, Template] = {}
        if "annotations" in keys:
            annotations = self.annotations(keys["annotations"], f"{what}.annotations", allowed)
        if len(self.r.problems) > before or text is None:
            return None
        return Escalation(within, AlertSeverity(text), drain, MappingProxyType(annotations))

    # -- conditions ---------------------------------------------------------------------
    def condition(self, node: Node, what: str) -> tuple[str, Condition] | None:
        if not node.is_mapping():
            self.r.error(
                node.loc,
                f"{what}: expected a mapping with one of: {', '.join(CONDITION_KEYS)}",
            )
            return None
        pairs = list(node.items())
        if len(pairs) != 1:
            where = pairs[1][0].loc if len(pairs) > 1 else node.loc
            self.r.error(
                where,
                f"{what}: exactly one condition per rule, one of: {', '.join(CONDITION_KEYS)}",
            )
            return None
        key_node, body = pairs[0]
        kind = key_node.value
        if kind not in CONDITION_KEYS:
            self.r.error(
                key_node.loc,
                f"{what}: unknown condition {kind!r}{hint(kind, CONDITION_KEYS)} "
                f"(one of: {', '.join(CONDITION_KEYS)})",
            )
            return None
        sub = f"{what}.{kind}"
        if body.value is None:
            body = Node({}, body.loc)
        spec = BY_KEY[kind]
        keys = self._keys(body, spec.keys, sub)
        if keys is None:
            return None
        before = len(self.r.problems)
        cond = spec.parse(self.body, body, keys, sub)
        if cond is None or len(self.r.problems) > before:
            return None
        return kind, cond


# -- files and sets -------------------------------------------------------------------------
def parse_rules(text: str, path: str, extra_fields: tuple[ExtraField, ...] = ()) -> list[Rule]:
    """The rules in one file's text; raises ``ConfigError`` listing every problem.
    ``extra_fields`` (the config's ``fields``) are field names the rules may use."""
    parser = RuleParser(extra_fields=extra_fields)
    rules = parser.file(yamlsrc.parse(text, path), path)
    parser.r.raise_if_any()
    return rules


def default_rule_files() -> list[str]:
    """The shipped rule files (``gpuwatchd/data/rules`` -> the source tree's ``rules/``)."""
    base = resources.files("gpuwatchd") / "data" / "rules"
    try:
        names = sorted(
            entry.name
            for entry in base.iterdir()
            if entry.name.endswith(".yaml") and entry.is_file()
        )
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.realpath(str(base / name)) for name in names]


def expand_files(patterns: Iterable[str]) -> list[tuple[str, str]]:
    """``(pattern, file)`` for each file a pattern names, sorted within a glob."""
    out: list[tuple[str, str]] = []
    for pattern in patterns:
        if _GLOB_CHARS.search(pattern):
            out.extend((pattern, p) for p in sorted(glob.glob(pattern)) if os.path.isfile(p))
        else:
            out.append((pattern, pattern))
    return out


def load_rule_set(
    files: Iterable[str],
    *,
    defaults: bool = True,
    disable: Iterable[str] = (),
    config_source: str | None = None,
    catalog: xid_catalog.Catalog | None = None,
    extra_fields: tuple[ExtraField, ...] = (),
    no_drain: Iterable[str] = (),
) -> RuleSet:
    """Load the shipped rules (``defaults``) then ``files`` (paths or globs), drop the
    rules named in ``disable``, and take the drain off those named in ``no_drain``; raises
    one ``ConfigError`` with every problem. Rules may use the ``extra_fields`` (the
    config's ``fields`` section) by name."""
    parser = RuleParser(catalog, extra_fields)
    rules: list[Rule] = []
    loaded: list[str] = []
    paths = (default_rule_files() if defaults else []) + [p for _, p in expand_files(files)]
    seen_paths: set[str] = set()
    for path in paths:
        real = os.path.realpath(path)
        if real in seen_paths:
            continue
        seen_paths.add(real)
        try:
            root = yamlsrc.load_file(path)
        except ConfigError as exc:
            parser.r.problems.extend(exc.problems)
            continue
        rules.extend(parser.file(root, path))
        yamlsrc.hide_private_text(parser.r.problems, path)
        loaded.append(path)
    names = {r.name for r in rules}
    for key, listed in (("disable", disable), ("no_drain", no_drain)):
        unknown = [n for n in listed if n not in names and n not in parser.seen]
        if unknown:
            locs = _disable_locations(config_source, key)
            for name in unknown:
                loc = locs.get(name, Location(config_source or "<config>", 1, 1))
                parser.r.error(
                    loc,
                    f"rules.{key}: no rule named {name!r}{hint(name, names | set(parser.seen))}",
                )
    parser.r.raise_if_any()
    keep = set(no_drain)
    rules = [_without_drain(r) if r.name in keep else r for r in rules]
    return RuleSet(tuple(rules), tuple(loaded)).without(set(disable))


def _without_drain(rule: Rule) -> Rule:
    """The rule as ``rules.no_drain`` wants it: it alerts as before and never drains."""
    escalate = rule.escalate
    if escalate is not None:
        escalate = dataclasses.replace(escalate, drain=False)
    return dataclasses.replace(rule, drain=False, escalate=escalate)


def _disable_locations(config_source: str | None, key: str = "disable") -> dict[str, Location]:
    if config_source is None:
        return {}
    try:
        root = yamlsrc.load_file(config_source)
    except ConfigError:
        return {}
    rules = root.get("rules") if root is not None else None
    disable = rules.get(key) if rules is not None else None
    if disable is None or not disable.is_sequence():
        return {}
    return {str(item.value): item.loc for item in disable.value}


def rules_from_settings(settings: RulesSettings, extra_files: Iterable[str] = ()) -> RuleSet:
    """Every rule the config asks for (its ``rules`` section), plus ``extra_files``."""
    rc = settings.rules
    files: list[str] = list(rc.files)
    missing = [p for p in files if not _GLOB_CHARS.search(p) and not os.path.exists(p)]
    if missing:
        locs = _file_locations(settings.source)
        raise ConfigError(
            [
                (
                    locs.get(p, Location(settings.source or "<config>", 1, 1)),
                    f"rules.files: {p!r} does not exist",
                )
                for p in missing
            ]
        )
    return load_rule_set(
        [*files, *extra_files],
        defaults=rc.defaults,
        disable=tuple(rc.disable),
        no_drain=tuple(rc.no_drain),
        config_source=settings.source,
        catalog=settings.xid.catalog(),
        extra_fields=settings.fields,
    )


def _file_locations(config_source: str | None) -> dict[str, Location]:
    if config_source is None:
        return {}
    try:
        root = yamlsrc.load_file(config_source)
    except ConfigError:
        return {}
    rules = root.get("rules") if root is not None else None
    files = rules.get("files") if rules is not None else None
    if files is None or not files.is_sequence():
        return {}
    base = os.path.dirname(os.path.abspath(config_source))
    out: dict[str, Location] = {}
    for item in files.value:
        if isinstance(item.value, str):
            out[os.path.normpath(os.path.join(base, item.value))] = item.loc
            out[item.value] = item.loc
    return out
