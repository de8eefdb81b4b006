"""Rule files (YAML) to a ``RuleSet``, with every mistake reported as ``PATH:LINE:COL``.

A rule file is a mapping with one key, ``rules``, a list of rules. docs/rules.md describes
the language; ``rules/schema.json`` is the same in JSON Schema for editors. The loader
checks everything it can before the daemon runs a rule: key names (with did-you-mean),
duplicate keys, types, durations, field names, XID codes and catalog buckets, throttle
reason names, annotation placeholders, and rule names unique across all files. It reads
every file completely and reports all problems at once.
"""

from __future__ import annotations

import difflib
import glob
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Any

from gpuwatchd.config import yamlsrc
from gpuwatchd.config.loader import Config, normalize_gpu_id
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.core.errors import ConfigError, Location
from gpuwatchd.core.fields import CLOCK_EVENT_REASON_BITS, GPU_FIELDS, LINK_FIELDS, FieldSpec
from gpuwatchd.core.records import GpuStatus
from gpuwatchd.core.units import value_with_unit
from gpuwatchd.rules.model import (
    OPS,
    Condition,
    Count,
    Escalation,
    GpuCount,
    GpuStatusIs,
    Guard,
    Increase,
    Op,
    PcieDowntrained,
    PeerOutlier,
    Rate,
    Rule,
    RuleSet,
    Selector,
    StuckWorkload,
    Threshold,
    Throttle,
    Trend,
    XidMatch,
)
from gpuwatchd.rules.safeyaml import load_limited, parse_limited
from gpuwatchd.rules.templates import Template, compile_template
from gpuwatchd.xid import catalog as xid_catalog
from gpuwatchd.xid import catalog_data

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
CONDITION_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "threshold": ("field", "op", "value"),
        "increase": ("field", "window", "op", "value"),
        "rate": ("field", "window", "op", "value"),
        "count": ("field", "window", "op", "value"),
        "xid": ("codes", "buckets", "severities", "count", "window", "quiet", "by_code"),
        "throttle": ("reasons", "match"),
        "trend": (
            "field",
            "window",
            "baseline",
            "factor",
            "min_increase",
            "slices",
            "min_slices",
        ),
        "peer_outlier": ("field", "direction", "ratio", "min_delta", "window", "min_peers"),
        "gpu_status": ("status",),
        "gpu_count": ("pci",),
        "pcie_downtrained": ("generation", "width"),
        "stuck_workload": ("max_utilization", "min_processes"),
    }
)
SELECT_KEYS = ("models", "gpus")
GUARD_KEYS = ("field", "op", "value")
ESCALATE_KEYS = ("after", "within", "severity", "drain", "annotations")
SEVERITIES = tuple(s.value for s in AlertSeverity)
STATUSES = ("lost", "stale", "error")
IDENTITY_LABELS = ("node", "gpu", "uuid", "pci_bus_id", "model", "link", "xid")
RESERVED_LABELS = frozenset({*IDENTITY_LABELS, "alertname", "severity", "rule"})

COMMON_PLACEHOLDERS = frozenset({"node", "rule", "severity", "value"})
GPU_PLACEHOLDERS = frozenset({"gpu", "uuid", "pci_bus_id", "model"})
KIND_PLACEHOLDERS: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "threshold": frozenset({"field", "threshold"}),
        "increase": frozenset({"field", "threshold", "window"}),
        "rate": frozenset({"field", "threshold", "window"}),
        "count": frozenset({"field", "threshold", "window"}),
        "xid": frozenset({"xid", "xid_text", "action", "count", "window"}),
        "throttle": frozenset({"reasons"}),
        "trend": frozenset({"field", "window", "ratio", "baseline_rate"}),
        "peer_outlier": frozenset({"field", "peers_median"}),
        "gpu_status": frozenset({"status"}),
        "gpu_count": frozenset({"expected", "seen", "pci_seen"}),
        "pcie_downtrained": frozenset({"generation", "generation_max", "width", "width_max"}),
        "stuck_workload": frozenset({"utilization", "processes"}),
    }
)

_NAME_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_GLOB_CHARS = re.compile(r"[*?\[]")


def _catalog_codes() -> frozenset[int]:
    return frozenset(row.code for row in catalog_data.XIDS)


def _catalog_buckets() -> dict[str, frozenset[int]]:
    """Immediate resolution bucket -> the XID codes that have it."""
    out: dict[str, set[int]] = {}
    for row in catalog_data.XIDS:
        if row.immediate:
            out.setdefault(row.immediate, set()).add(row.code)
    return {k: frozenset(v) for k, v in out.items()}


def _investigatory_buckets() -> frozenset[str]:
    return frozenset(row.investigatory for row in catalog_data.XIDS if row.investigatory)


CATALOG_SEVERITIES = tuple(s.value for s in xid_catalog.XidSeverity)


def placeholders_for(kind: str, link: bool) -> frozenset[str]:
    names = set(COMMON_PLACEHOLDERS) | KIND_PLACEHOLDERS.get(kind, frozenset())
    if kind != "gpu_count":
        names |= GPU_PLACEHOLDERS
    if link:
        names.add("link")
    return frozenset(names)


def _hint(word: str, choices: Iterable[str]) -> str:
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


# -- the per-file parser --------------------------------------------------------------------
@dataclass
class _Ctx:
    r: Reader
    where: str  # "rules[3] (GpuTemperatureHigh)"


class RuleParser:
    """Reads rule files into ``Rule`` objects, collecting every problem in one ``Reader``."""

    def __init__(self, catalog: xid_catalog.Catalog | None = None) -> None:
        self.r = Reader()
        self.catalog = catalog or xid_catalog.Catalog.default()
        self.buckets = _catalog_buckets()
        self.codes = _catalog_codes()
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
        seconds = self.r.duration(node, what, allow_zero=not positive)
        if seconds is None:
            return None
        if maximum is not None and seconds > maximum:
            self.r.error(node.loc, f"{what}: at most 30d, got {node.value!r}")
            return None
        return seconds

    def _field(
        self, node: Node, what: str, *, counter: bool = False, allow_link: bool = True
    ) -> tuple[str, FieldSpec, bool] | None:
        name = self.r.string(node, what)
        if name is None:
            return None
        if name in GPU_FIELDS:
            spec, link = GPU_FIELDS[name], False
        elif name in LINK_FIELDS and allow_link:
            spec, link = LINK_FIELDS[name], True
        else:
            choices = list(GPU_FIELDS) + (list(LINK_FIELDS) if allow_link else [])
            extra = "" if allow_link or name not in LINK_FIELDS else " (a per-link field)"
            self.r.error(node.loc, f"{what}: unknown field {name!r}{extra}{_hint(name, choices)}")
            return None
        if counter and spec.kind != "counter" and not spec.integer:
            self.r.error(
                node.loc,
                f"{what}: {name!r} is a gauge; this condition needs a counter "
                "(compare gauges with 'threshold')",
            )
            return None
        return name, spec, link

    def _op(self, node: Node | None, what: str, default: Op) -> Op | None:
        if node is None:
            return default
        value = self.r.string(node, what, OPS)
        return None if value is None else value  # type: ignore[return-value]

    def _value(self, node: Node, what: str, spec: FieldSpec | None) -> float | None:
        """A number, or (for a field) a number with a unit like ``1980MHz`` or ``97%``."""
        raw = node.value
        if isinstance(raw, str) and spec is not None:
            parsed = value_with_unit(raw, spec)
            if isinstance(parsed, str):
                self.r.error(node.loc, f"{what}: {parsed}")
                return None
            return parsed
        return self.r.number(node, what)

    def _strings(self, node: Node, what: str) -> list[tuple[str, Node]]:
        items = self.r.sequence(node, what)
        out: list[tuple[str, Node]] = []
        for item in items or []:
            text = self.r.string(item, what)
            if text is not None:
                out.append((text, item))
        return out

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
        if cond_kind == "xid" and "keep_firing_for" in keys:
            self.r.error(
                keys["keep_firing_for"].loc,
                f"{what}.keep_firing_for: an xid rule resolves after condition.xid.quiet; "
                "set that instead",
            )
        when = self.guard(keys["when"], f"{what}.when") if "when" in keys else None
        select = self.selector(keys["select"], f"{what}.select") if "select" in keys else None
        if cond_kind == "gpu_count" and "select" in keys:
            self.r.error(
                keys["select"].loc, f"{what}.select: a gpu_count rule watches the whole node"
            )
        if cond_kind in ("gpu_count", "gpu_status", "xid") and "when" in keys:
            self.r.error(
                keys["when"].loc,
                f"{what}.when: not available for {cond_kind} rules (it needs the GPU's "
                "latest sample, which a lost GPU does not have)",
            )
        if cond_kind == "xid" and "for" in keys:
            self.r.error(
                keys["for"].loc,
                f"{what}.for: an xid rule fires on the event itself; use condition.xid.count "
                "and window to ask for repeats",
            )
        labels = self.labels(keys["labels"], f"{what}.labels") if "labels" in keys else {}
        link = bool(getattr(condition, "link", False))
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
        found = self._field(keys["field"], f"{what}.field", allow_link=False)
        op = self._op(keys["op"], f"{what}.op", ">")
        value = self._value(keys["value"], f"{what}.value", found[1] if found else None)
        if found is None or op is None or value is None:
            return None
        return Guard(found[0], op, value)

    def selector(self, node: Node, what: str) -> Selector | None:
        keys = self._keys(node, SELECT_KEYS, what)
        if keys is None:
            return None
        models = (
            frozenset(t for t, _ in self._strings(keys["models"], f"{what}.models"))
            if ("models" in keys)
            else frozenset()
        )
        gpus: set[str] = set()
        if "gpus" in keys:
            for text, item in self._strings(keys["gpus"], f"{what}.gpus"):
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
        for text, item in self._strings(node, what):
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
                f"{what}: unknown condition {kind!r}{_hint(kind, CONDITION_KEYS)} "
                f"(one of: {', '.join(CONDITION_KEYS)})",
            )
            return None
        sub = f"{what}.{kind}"
        if body.value is None:
            body = Node({}, body.loc)
        keys = self._keys(body, CONDITION_KEYS[kind], sub)
        if keys is None:
            return None
        parse: Callable[[Node, dict[str, Node], str], Condition | None] = getattr(
            self, f"_c_{kind}"
        )
        before = len(self.r.problems)
        cond = parse(body, keys, sub)
        if cond is None or len(self.r.problems) > before:
            return None
        return kind, cond

    def _need(self, body: Node, keys: dict[str, Node], names: tuple[str, ...], what: str) -> bool:
        missing = [n for n in names if n not in keys]
        for n in missing:
            self.r.error(body.loc, f"{what}: missing required key {n!r}")
        return not missing

    def _c_threshold(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not self._need(body, keys, ("field", "op", "value"), what):
            return None
        found = self._field(keys["field"], f"{what}.field")
        op = self._op(keys["op"], f"{what}.op", ">")
        value = self._value(keys["value"], f"{what}.value", found[1] if found else None)
        if found is None or op is None or value is None:
            return None
        return Threshold(found[0], op, value, found[2])

    def _windowed(
        self, body: Node, keys: dict[str, Node], what: str, default_op: Op, default_value: float
    ) -> tuple[str, float, Op, float, bool] | None:
        if not self._need(body, keys, ("field", "window"), what):
            return None
        found = self._field(keys["field"], f"{what}.field", counter=True)
        window = self._duration(keys["window"], f"{what}.window", positive=True, maximum=30 * 86400)
        op = self._op(keys.get("op"), f"{what}.op", default_op)
        value: float | None = default_value
        if "value" in keys:
            value = self.r.number(keys["value"], f"{what}.value")
        if found is None or window is None or op is None or value is None:
            return None
        return found[0], window, op, value, found[2]

    def _c_increase(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        got = self._windowed(body, keys, what, ">", 0.0)
        return None if got is None else Increase(*got)

    def _c_rate(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        got = self._windowed(body, keys, what, ">", 0.0)
        return None if got is None else Rate(*got)

    def _c_count(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        got = self._windowed(body, keys, what, ">=", 1.0)
        return None if got is None else Count(*got)

    def _c_xid(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not any(k in keys for k in ("codes", "buckets", "severities")):
            self.r.error(body.loc, f"{what}: needs at least one of codes, buckets, severities")
            return None
        codes: set[int] = set()
        if "codes" in keys:
            for item in self.r.sequence(keys["codes"], f"{what}.codes") or []:
                code = self.r.integer(item, f"{what}.codes", minimum=0, maximum=999_999)
                if code is None:
                    continue
                if code not in self.codes:
                    near = sorted(self.codes, key=lambda c: abs(c - code))[:3]
                    self.r.error(
                        item.loc,
                        f"{what}.codes: XID {code} is not in NVIDIA's XID catalog "
                        f"(nearest known: {', '.join(map(str, sorted(near)))})",
                    )
                    continue
                codes.add(code)
        if "buckets" in keys:
            for text, item in self._strings(keys["buckets"], f"{what}.buckets"):
                members = self.buckets.get(text)
                if members is None:
                    if text in _investigatory_buckets():
                        why = (
                            "is only an investigatory bucket; buckets match the catalog's "
                            "immediate resolution"
                        )
                    else:
                        why = "is not an immediate resolution bucket of the XID catalog"
                        why += _hint(text, self.buckets)
                    self.r.error(
                        item.loc,
                        f"{what}.buckets: {text!r} {why} "
                        f"(one of: {', '.join(sorted(self.buckets))})",
                    )
                    continue
                codes |= members
        if "severities" in keys:
            for text, item in self._strings(keys["severities"], f"{what}.severities"):
                if text not in CATALOG_SEVERITIES:
                    self.r.error(
                        item.loc,
                        f"{what}.severities: {text!r} is not a catalog severity (one of "
                        f"{', '.join(CATALOG_SEVERITIES)}){_hint(text, CATALOG_SEVERITIES)}",
                    )
                    continue
                for entry in self.catalog:  # the config's xid.overrides apply
                    if entry.severity.value == text:
                        codes.add(entry.xid)
        count = 1
        if "count" in keys:
            count = self.r.integer(keys["count"], f"{what}.count", minimum=1, maximum=10000) or 1
        window = 600.0
        if "window" in keys:
            window = (
                self._duration(keys["window"], f"{what}.window", positive=True, maximum=30 * 86400)
                or window
            )
        quiet = 3600.0
        if "quiet" in keys:
            quiet = (
                self._duration(keys["quiet"], f"{what}.quiet", positive=True, maximum=30 * 86400)
                or quiet
            )
        by_code = False
        if "by_code" in keys:
            by_code = bool(self.r.boolean(keys["by_code"], f"{what}.by_code"))
        if not codes:
            self.r.error(body.loc, f"{what}: matches no XID code")
            return None
        return XidMatch(frozenset(codes), count, window, quiet, by_code)

    def _c_throttle(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not self._need(body, keys, ("reasons",), what):
            return None
        reasons: list[str] = []
        mask = 0
        for text, item in self._strings(keys["reasons"], f"{what}.reasons"):
            bit = CLOCK_EVENT_REASON_BITS.get(text)
            if bit is None:
                self.r.error(
                    item.loc,
                    f"{what}.reasons: unknown clock-event reason {text!r}"
                    f"{_hint(text, CLOCK_EVENT_REASON_BITS)} (one of "
                    f"{', '.join(CLOCK_EVENT_REASON_BITS)})",
                )
                continue
            reasons.append(text)
            mask |= bit
        if not reasons:
            if not self.r.problems:
                self.r.error(keys["reasons"].loc, f"{what}.reasons: name at least one reason")
            return None
        match = "any"
        if "match" in keys:
            match = self.r.string(keys["match"], f"{what}.match", ("any", "all")) or "any"
        return Throttle(tuple(reasons), mask, "all" if match == "all" else "any")

    def _c_trend(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not self._need(body, keys, ("field",), what):
            return None
        found = self._field(keys["field"], f"{what}.field", counter=True)
        d = Trend("")
        values: dict[str, Any] = {}
        for name in ("window", "baseline"):
            if name in keys:
                values[name] = self._duration(
                    keys[name], f"{what}.{name}", positive=True, maximum=30 * 86400
                )
        if "factor" in keys:
            values["factor"] = self.r.number(keys["factor"], f"{what}.factor", minimum=1.0)
        if "min_increase" in keys:
            values["min_increase"] = self.r.number(
                keys["min_increase"], f"{what}.min_increase", minimum=1.0
            )
        if "slices" in keys:
            values["slices"] = self.r.integer(keys["slices"], f"{what}.slices", 1, 100)
        if "min_slices" in keys:
            values["min_slices"] = self.r.integer(keys["min_slices"], f"{what}.min_slices", 1, 100)
        if found is None or any(v is None for v in values.values()):
            return None
        trend = Trend(
            found[0],
            link=found[2],
            **{
                k: values.get(k, getattr(d, k))
                for k in ("window", "baseline", "factor", "min_increase", "slices", "min_slices")
            },
        )
        if trend.min_slices > trend.slices:
            where = keys.get("min_slices", body).loc
            self.r.error(
                where, f"{what}.min_slices: {trend.min_slices} is more than slices ({trend.slices})"
            )
            return None
        if trend.window + trend.baseline > 30 * 86400:
            self.r.error(body.loc, f"{what}: window + baseline must be at most 30d (history kept)")
            return None
        return trend

    def _c_peer_outlier(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not self._need(body, keys, ("field", "direction", "ratio"), what):
            return None
        window = None
        if "window" in keys:
            window = self._duration(
                keys["window"], f"{what}.window", positive=True, maximum=30 * 86400
            )
            if window is None:
                return None
        found = self._field(
            keys["field"], f"{what}.field", counter=window is not None, allow_link=False
        )
        direction = self.r.string(keys["direction"], f"{what}.direction", ("above", "below"))
        ratio = self.r.number(keys["ratio"], f"{what}.ratio", minimum=0.0)
        min_delta: float | None = 0.0
        if "min_delta" in keys:
            min_delta = self._value(
                keys["min_delta"], f"{what}.min_delta", found[1] if found and not window else None
            )
        min_peers = 2
        if "min_peers" in keys:
            min_peers = self.r.integer(keys["min_peers"], f"{what}.min_peers", 1, 64) or 2
        if found is None or direction is None or ratio is None or min_delta is None:
            return None
        if (direction == "above" and ratio < 1.0) or (direction == "below" and ratio > 1.0):
            self.r.error(
                keys["ratio"].loc,
                f"{what}.ratio: for direction {direction!r} the ratio must be "
                f"{'>= 1' if direction == 'above' else '<= 1'} (e.g. "
                f"{'3: three times the median' if direction == 'above' else '0.8: 80% of it'})",
            )
            return None
        return PeerOutlier(
            found[0],
            "above" if direction == "above" else "below",
            ratio,
            min_delta,
            window,
            min_peers,
        )

    def _c_gpu_status(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        if not self._need(body, keys, ("status",), what):
            return None
        statuses: set[GpuStatus] = set()
        for text, item in self._strings(keys["status"], f"{what}.status"):
            if text not in STATUSES:
                self.r.error(
                    item.loc,
                    f"{what}.status: {text!r} is not one of {', '.join(STATUSES)}"
                    f"{_hint(text, STATUSES)}",
                )
                continue
            statuses.add(GpuStatus(text))
        if not statuses:
            return None
        return GpuStatusIs(frozenset(statuses))

    def _c_gpu_count(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        pci = True
        if "pci" in keys:
            pci = bool(self.r.boolean(keys["pci"], f"{what}.pci"))
        return GpuCount(pci)

    def _c_pcie_downtrained(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        gen = width = True
        if "generation" in keys:
            gen = bool(self.r.boolean(keys["generation"], f"{what}.generation"))
        if "width" in keys:
            width = bool(self.r.boolean(keys["width"], f"{what}.width"))
        if not gen and not width:
            self.r.error(body.loc, f"{what}: generation and width are both off: watches nothing")
            return None
        return PcieDowntrained(gen, width)

    def _c_stuck_workload(self, body: Node, keys: dict[str, Node], what: str) -> Condition | None:
        util: float | None = 0.0
        if "max_utilization" in keys:
            util = self._value(
                keys["max_utilization"], f"{what}.max_utilization", GPU_FIELDS["utilization_gpu"]
            )
            if util is not None and not 0.0 <= util < 1.0:
                self.r.error(
                    keys["max_utilization"].loc,
                    f"{what}.max_utilization: a ratio from 0 to below 1 (5% is 0.05)",
                )
                util = None
        procs = 1
        if "min_processes" in keys:
            procs = self.r.integer(keys["min_processes"], f"{what}.min_processes", 1, 1000) or 1
        if util is None:
            return None
        return StuckWorkload(util, procs)


# -- files and sets -------------------------------------------------------------------------
def parse_rules(text: str, path: str) -> list[Rule]:
    """The rules in one file's text; raises ``ConfigError`` listing every problem."""
    parser = RuleParser()
    rules = parser.file(parse_limited(text, path), path)
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
) -> RuleSet:
    """Load the shipped rules (``defaults``) then ``files`` (paths or globs), drop the
    rules named in ``disable``; raises one ``ConfigError`` with every problem."""
    parser = RuleParser(catalog)
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
            root = load_limited(path)
        except ConfigError as exc:
            parser.r.problems.extend(exc.problems)
            continue
        rules.extend(parser.file(root, path))
        yamlsrc.hide_private_text(parser.r.problems, path)
        loaded.append(path)
    names = {r.name for r in rules}
    unknown = [n for n in disable if n not in names and n not in parser.seen]
    if unknown:
        locs = _disable_locations(config_source)
        for name in unknown:
            loc = locs.get(name, Location(config_source or "<config>", 1, 1))
            parser.r.error(
                loc, f"rules.disable: no rule named {name!r}{_hint(name, names | set(parser.seen))}"
            )
    parser.r.raise_if_any()
    return RuleSet(tuple(rules), tuple(loaded)).without(set(disable))


def _disable_locations(config_source: str | None) -> dict[str, Location]:
    if config_source is None:
        return {}

    try:
        root = yamlsrc.load_file(config_source)
    except ConfigError:
        return {}
    rules = root.get("rules") if root is not None else None
    disable = rules.get("disable") if rules is not None else None
    if disable is None or not disable.is_sequence():
        return {}
    return {str(item.value): item.loc for item in disable.value}


def rules_from_config(config: Config, extra_files: Iterable[str] = ()) -> RuleSet:
    """Every rule the config asks for (its ``rules`` section), plus ``extra_files``."""
    rc = getattr(config, "rules", None)
    files: list[str] = list(getattr(rc, "files", ()))
    defaults = bool(getattr(rc, "defaults", True))
    disable = tuple(getattr(rc, "disable", ()))
    missing = [p for p in files if not _GLOB_CHARS.search(p) and not os.path.exists(p)]
    if missing:
        locs = _file_locations(config.source)
        raise ConfigError(
            [
                (
                    locs.get(p, Location(config.source or "<config>", 1, 1)),
                    f"rules.files: {p!r} does not exist",
                )
                for p in missing
            ]
        )
    xid = getattr(config, "xid", None)
    return load_rule_set(
        [*files, *extra_files],
        defaults=defaults,
        disable=disable,
        config_source=config.source,
        catalog=xid.catalog() if xid is not None else None,
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
