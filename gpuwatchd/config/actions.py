"""Config sections of the actions stage that no kind owns: ``routing`` and ``drain``, and
the small value readers they share with the receiver and drain driver kinds.

Each receiver kind's config type and reader live in its own module
(``actions/receivers/<kind>.py``), what the kinds share in ``config/receivers.py``; each
drain driver's own section (``drain.<mode>``) lives in its driver's module
(``actions/drain/drivers/<driver>.py``) as a ``DriverSection`` subclass and a
``DriverSectionReader``; ``configfile/loader.py`` asks the registries for the readers.
Every value is checked and every problem is reported as ``PATH:LINE:COL: message``. The
schema is documented in docs/config.md and docs/actions.md.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gpuwatchd.config.saferegex import regex_problem
from gpuwatchd.config.yamlsrc import Node, Reader, type_name

SEVERITIES = ("page", "ticket", "info")
DEFAULT_STATE_FILE = "/run/gpuwatchd/health.json"
_LABEL_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SELECTOR_RE = re.compile(r"[A-Za-z0-9_./=!,() -]{1,1024}")


# -- routing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouteConfig:
    """Alerts whose labels match go to ``receivers`` (every matching route applies)."""

    receivers: tuple[str, ...]
    match: dict[str, str] = field(default_factory=dict)
    match_re: dict[str, str] = field(default_factory=dict)
    group_by: tuple[str, ...] | None = None
    group_wait: float | None = None
    repeat_interval: float | None = None


@dataclass(frozen=True)
class RoutingConfig:
    receivers: tuple[str, ...] | None = None
    min_severity: str = "ticket"
    group_by: tuple[str, ...] = ("node",)
    group_wait: float = 5.0
    repeat_interval: float = 4 * 3600.0
    ticket_repeat_interval: float = 86400.0  # the shortest repeat of a ticket or info alert
    routes: tuple[RouteConfig, ...] = ()
    queue_size: int = 1000
    retry_initial: float = 1.0
    retry_max: float = 300.0
    give_up_after: float = 86400.0


# -- drain ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DriverSection:
    """A drain driver's own section (``drain.<mode>``, e.g. ``drain.slurm``). Each driver's
    module subclasses it with its keys (frozen, every key with a default)."""


S = TypeVar("S", bound=DriverSection)


@dataclass(frozen=True)
class DriverSectionReader:
    """How ``drain.<mode>`` is read, as its driver's module gives it to the registry.

    ``section``: its type (every key with a default); ``read(r, node, what)``: the section
    (``None`` after recording a problem at its location); ``check(drain)``: what is missing
    for the mode to work (``None``: nothing), reported at ``drain.mode``.
    """

    section: type[DriverSection]
    read: Callable[[Reader, Node, str], DriverSection | None]
    check: Callable[[DrainConfig], str | None] = lambda drain: None


@dataclass(frozen=True)
class FleetDrainConfig:
    """``drain.fleet``: a budget of nodes gpuwatchd may hold drained across the cluster."""

    max_nodes: int | None = None
    max_percent: float | None = None
    partition: str | None = None  # Slurm: count only this partition's nodes
    selector: str | None = None  # Kubernetes: count only nodes matching this label selector
    window: float | None = None  # count only drains younger than this (None: every drain)
    recheck: float = 60.0  # how often an incident held back by the budget asks again
    jitter: float = 1.0  # a drain's first check waits up to this (random): storms spread
    # when more nodes want to drain at once than the budget allows, stop draining
    # fleet-wide until an operator runs ``gpuwatchd fleet reset``
    breaker: bool = False
    correlate: float = 600.0  # the same XID on several nodes within this is named as such
    # drain.mode exec only: who counts the fleet. "slurm" (the default with exec): the daemon
    # runs sinfo itself (no privilege needed) while claims, drains and resumes go through
    # the exec command (the root drain helper: the recommended privilege split)
    census: str | None = None

    @property
    def enabled(self) -> bool:
        return self.max_nodes is not None or self.max_percent is not None


@dataclass(frozen=True)
class DrainConfig:
    mode: str = "none"
    dry_run: bool = False
    node: str | None = None
    grace: float = 0.0
    rule_grace: dict[str, float] = field(default_factory=dict)
    notify_command: tuple[str, ...] = ()
    state_file: str | None = DEFAULT_STATE_FILE
    max_drains: int = 3
    window: float = 3600.0
    resume: bool = False
    resume_hold: float = 1800.0
    timeout: float = 30.0
    attempts: int = 5
    hold_interval: float = 30.0
    fleet: FleetDrainConfig = field(default_factory=FleetDrainConfig)
    # the drivers' own sections that differ from their defaults, by mode (``drain.slurm``
    # under "slurm"); shown and read as keys of ``drain`` (``as_plain``, ``config_keys``)
    drivers: Mapping[str, DriverSection] = field(default_factory=dict, metadata={"sections": True})

    def section(self, mode: str, cls: type[S]) -> S:
        """Driver ``mode``'s own section; its defaults when the file has none."""
        value = self.drivers.get(mode)
        return value if isinstance(value, cls) else cls()


# -- small readers -------------------------------------------------------------------------
def _keys(r: Reader, node: Node | None, allowed: list[str], what: str) -> dict[str, Node]:
    if node is None or node.value is None:
        return {}
    return r.mapping(node, allowed, what) or {}


def _duration(r: Reader, node: Node, what: str, *, positive: bool = False) -> float | None:
    seconds = r.duration(node, what)
    if seconds is None:
        return None
    if not math.isfinite(seconds):
        r.error(node.loc, f"{what}: must be a finite duration, got {node.value!r}")
        return None
    if positive and seconds <= 0:
        r.error(node.loc, f"{what}: must be more than 0s, got {node.value!r}")
        return None
    return seconds


def _strings(
    r: Reader, node: Node, what: str, *, non_empty: bool = False
) -> tuple[str, ...] | None:
    items = r.sequence(node, what)
    if items is None:
        return None
    out: list[str] = []
    ok = True
    for item in items:
        text = r.string(item, what)
        if text is None:
            ok = False
        elif non_empty and not text:
            r.error(item.loc, f"{what}: empty string")
            ok = False
        else:
            out.append(text)
    return tuple(out) if ok else None


def _string_map(
    r: Reader, node: Node, what: str, key_re: re.Pattern[str] | None = None, key_what: str = ""
) -> dict[str, str] | None:
    if node.value is None:
        return {}
    if not node.is_mapping():
        r.error(node.loc, f"{what}: expected a mapping, got {type_name(node.value)}")
        return None
    out: dict[str, str] = {}
    ok = True
    for key_node, value_node in node.items():
        key = str(key_node.value)
        if key_re is not None and not key_re.fullmatch(key):
            r.error(key_node.loc, f"{what}: {key!r} is not {key_what}")
            ok = False
            continue
        value = value_node.value
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            r.error(value_node.loc, f"{what}.{key}: expected a string, got {type_name(value)}")
            ok = False
            continue
        out[key] = str(value)
    return out if ok else None


# -- routing -------------------------------------------------------------------------------
def _label_list(r: Reader, node: Node, what: str) -> tuple[str, ...] | None:
    names = _strings(r, node, what)
    if names is None:
        return None
    for item, name in zip(node.value, names, strict=True):
        if not _LABEL_RE.fullmatch(name):
            r.error(item.loc, f"{what}: {name!r} is not a label name")
            return None
    return names


def _receiver_refs(
    r: Reader, node: Node, what: str, known: set[str], *, allow_empty: bool
) -> tuple[str, ...] | None:
    names = _strings(r, node, what)
    if names is None:
        return None
    if not names and not allow_empty:
        r.error(node.loc, f"{what}: name at least one receiver")
        return None
    for item, name in zip(node.value, names, strict=True):
        if name not in known:
            import difflib

            hint = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            r.error(item.loc, f"{what}: no receiver is named {name!r}{suggestion}")
            return None
    return names


def _read_route(r: Reader, node: Node, what: str, known: set[str]) -> RouteConfig | None:
    allowed = list(RouteConfig.__dataclass_fields__)
    keys = r.mapping(node, allowed, what, required=("receivers",))
    if keys is None or "receivers" not in keys:
        return None
    receivers = _receiver_refs(r, keys["receivers"], f"{what}.receivers", known, allow_empty=False)
    values: dict[str, Any] = {}
    bad = receivers is None
    for key in ("match", "match_re"):
        if key in keys:
            m = _string_map(r, keys[key], f"{what}.{key}", _LABEL_RE, "a label name")
            if m is None:
                bad = True
                continue
            if key == "match_re":
                for label, pattern in m.items():
                    problem = regex_problem(pattern)
                    if problem is not None:
                        r.error(keys[key].loc, f"{what}.match_re.{label}: {pattern!r} {problem}")
                        bad = True
            values[key] = m
    if "group_by" in keys and keys["group_by"].value is not None:
        values["group_by"] = _label_list(r, keys["group_by"], f"{what}.group_by")
        bad = bad or values["group_by"] is None
    for key in ("group_wait", "repeat_interval"):
        if key in keys and keys[key].value is not None:
            values[key] = _duration(r, keys[key], f"{what}.{key}", positive=key != "group_wait")
            bad = bad or values[key] is None
    if bad or receivers is None:
        return None
    return RouteConfig(receivers=receivers, **values)


def read_routing(r: Reader, node: Node | None, receivers: Collection[str]) -> RoutingConfig:
    """The ``routing`` section; ``receivers``: the names of the configured receivers."""
    allowed = list(RoutingConfig.__dataclass_fields__)
    keys = _keys(r, node, allowed, "routing")
    known = set(receivers)
    d = RoutingConfig()
    values: dict[str, Any] = {}
    if "receivers" in keys and keys["receivers"].value is not None:
        values["receivers"] = _receiver_refs(
            r, keys["receivers"], "routing.receivers", known, allow_empty=True
        )
    if "min_severity" in keys:
        values["min_severity"] = r.string(keys["min_severity"], "routing.min_severity", SEVERITIES)
    if "group_by" in keys:
        values["group_by"] = _label_list(r, keys["group_by"], "routing.group_by")
    if "group_wait" in keys:
        values["group_wait"] = _duration(r, keys["group_wait"], "routing.group_wait")
    for key in (
        "repeat_interval",
        "ticket_repeat_interval",
        "retry_initial",
        "retry_max",
        "give_up_after",
    ):
        if key in keys:
            values[key] = _duration(r, keys[key], f"routing.{key}", positive=True)
    if "queue_size" in keys:
        values["queue_size"] = r.integer(keys["queue_size"], "routing.queue_size", minimum=1)
    if "routes" in keys and keys["routes"].value is not None:
        items = r.sequence(keys["routes"], "routing.routes")
        routes = [
            _read_route(r, n, f"routing.routes[{i}]", known) for i, n in enumerate(items or [])
        ]
        values["routes"] = None if None in routes or items is None else tuple(routes)
    initial = values.get("retry_initial") or d.retry_initial
    maximum = values.get("retry_max") or d.retry_max
    if "retry_max" in keys and values.get("retry_max") is not None and maximum < initial:
        r.error(
            keys["retry_max"].loc, "routing.retry_max: must not be less than routing.retry_initial"
        )
    return RoutingConfig(**{k: v for k, v in {**_plain(d), **values}.items() if v is not None})


def _plain(d: Any) -> dict[str, Any]:
    return {name: getattr(d, name) for name in d.__dataclass_fields__}


# -- drain ---------------------------------------------------------------------------------
def read_driver_section(
    r: Reader,
    node: Node,
    cls: type[S],
    what: str,
    read_value: Callable[[Reader, str, Node, str], Any],
) -> S:
    """A ``DriverSection`` of type ``cls``: its keys checked, each value read by
    ``read_value(r, key, node, where)`` (``None`` after recording a problem; the default
    stays), every key not written at its default."""
    keys = _keys(r, node, [f.name for f in dataclasses.fields(cls)], what)
    values: dict[str, Any] = {}
    for key, value_node in keys.items():
        value = read_value(r, key, value_node, f"{what}.{key}")
        if value is not None:
            values[key] = value
    return cls(**values)


def read_program(r: Reader, node: Node, what: str) -> str | None:
    """A program name or path (no spaces: one argv word)."""
    value = r.string(node, what)
    if value is not None and (not value or any(c.isspace() for c in value)):
        r.error(node.loc, f"{what}: {value!r} is not a program name or path")
        return None
    return value


def read_argv(r: Reader, node: Node, what: str) -> tuple[str, ...] | None:
    """A command as a list: program and arguments, none empty."""
    return _strings(r, node, what, non_empty=True)


def read_absolute_path(r: Reader, node: Node, what: str) -> str | None:
    value = r.string(node, what)
    if value is not None and not value.startswith("/"):
        r.error(node.loc, f"{what}: {value!r} is not an absolute path")
        return None
    return value


def read_drain(
    r: Reader, node: Node | None, drivers: Mapping[str, DriverSectionReader]
) -> DrainConfig:
    """The ``drain`` section; ``drivers``: each drain driver's section reader, by mode (the
    modes are ``none`` and these)."""
    allowed = [f for f in DrainConfig.__dataclass_fields__ if f != "drivers"] + list(drivers)
    keys = _keys(r, node, allowed, "drain")
    d = DrainConfig()
    values: dict[str, Any] = {}
    sections: dict[str, DriverSection] = {}
    for key, value_node in keys.items():
        where = f"drain.{key}"
        value: Any = None
        if key == "mode":
            value = r.string(value_node, where, ("none", *drivers))
        elif key in ("dry_run", "resume"):
            value = r.boolean(value_node, where)
        elif key == "node":
            if value_node.value is None:
                continue
            value = r.string(value_node, where)
            if value is not None and (
                not value
                or len(value) > 253
                or any(not c.isprintable() or c.isspace() for c in value)
            ):
                r.error(value_node.loc, f"{where}: {value!r} is not a node name")
                value = None
        elif key in ("grace", "resume_hold"):
            value = _duration(r, value_node, where)
        elif key in ("window", "timeout", "hold_interval"):
            value = _duration(r, value_node, where, positive=True)
        elif key == "rule_grace":
            value = _rule_grace(r, value_node, where)
        elif key == "notify_command":
            value = _strings(r, value_node, where, non_empty=True)
        elif key == "state_file":
            if value_node.value is None:
                values[key] = None
                continue
            value = r.string(value_node, where)
            if value is not None and not value.startswith("/"):
                r.error(value_node.loc, f"{where}: {value!r} is not an absolute path")
                value = None
        elif key == "max_drains":
            value = r.integer(value_node, where, minimum=1)
        elif key == "attempts":
            value = r.integer(value_node, where, minimum=1, maximum=100)
        elif key == "fleet":
            value = _read_fleet(r, value_node, where)
        elif key in drivers:
            section = drivers[key].read(r, value_node, where)
            if section is not None and section != drivers[key].section():
                sections[key] = section  # a section at its defaults is as good as none
            continue
        if value is not None:
            values[key] = value
    result = DrainConfig(**{**_plain(d), **values, "drivers": sections})
    if result.fleet.enabled and result.mode == "exec" and result.fleet.census is None:
        # the documented secure setup (exec through the root drain helper) has the budget:
        # the daemon counts with sinfo, the helper writes the claims (docs/fleet.md)
        result = replace(result, fleet=replace(result.fleet, census="slurm"))
    if result.fleet.census is not None and result.mode != "exec" and "fleet" in keys:
        r.error(
            keys["fleet"].loc,
            f"drain.fleet.census: only for drain.mode exec (mode {result.mode} counts by itself)",
        )
    if result.mode in drivers and "mode" in keys:
        problem = drivers[result.mode].check(result)
        if problem is not None:
            r.error(keys["mode"].loc, f"drain.mode: {problem}")
    return result


def _read_fleet(r: Reader, node: Node, what: str) -> FleetDrainConfig | None:
    keys = _keys(r, node, list(FleetDrainConfig.__dataclass_fields__), what)
    values: dict[str, Any] = {}
    for key, value_node in keys.items():
        where = f"{what}.{key}"
        value: Any = None
        if value_node.value is None and key in (
            "max_nodes",
            "max_percent",
            "partition",
            "selector",
            "window",
            "census",
        ):
            continue
        if key == "max_nodes":
            value = r.integer(value_node, where, minimum=1)
        elif key == "max_percent":
            value = r.number(value_node, where, minimum=0.01, maximum=100)
        elif key == "partition":
            value = r.string(value_node, where)
            if value is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", value):
                r.error(value_node.loc, f"{where}: {value!r} is not a Slurm partition name")
                value = None
        elif key == "selector":
            value = r.string(value_node, where)
            if value is not None and not _SELECTOR_RE.fullmatch(value):
                r.error(value_node.loc, f"{where}: {value!r} is not a Kubernetes label selector")
                value = None
        elif key in ("window", "recheck", "correlate"):
            value = _duration(r, value_node, where, positive=True)
        elif key == "jitter":
            value = _duration(r, value_node, where)
        elif key == "breaker":
            value = r.boolean(value_node, where)
        elif key == "census":
            value = r.string(value_node, where)
            if value is not None and value != "slurm":
                r.error(value_node.loc, f"{where}: {value!r} is not one of: slurm")
                value = None
        if value is not None:
            values[key] = value
    return FleetDrainConfig(**values)


def _rule_grace(r: Reader, node: Node, what: str) -> dict[str, float] | None:
    if node.value is None:
        return {}
    if not node.is_mapping():
        r.error(
            node.loc,
            f"{what}: expected a mapping of rule name to duration, got {type_name(node.value)}",
        )
        return None
    out: dict[str, float] = {}
    for key_node, value_node in node.items():
        seconds = _duration(r, value_node, f"{what}.{key_node.value}")
        if seconds is None:
            return None
        out[str(key_node.value)] = seconds
    return out


def parse_duration_text(text: str) -> float | None:
    """A duration as written in config (``5m``) or a number of seconds; ``None`` if bad."""
    from gpuwatchd.config.yamlsrc import parse_duration

    try:
        value = float(text)
    except ValueError:
        return parse_duration(text)
    return value if math.isfinite(value) and value >= 0 else None
