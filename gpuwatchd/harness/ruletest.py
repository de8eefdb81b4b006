"""Rule unit tests (``gpuwatchd rules test FILE``), in the spirit of ``promtool test rules``.

A test file names the rule files under test and a list of tests. Each test plays an input
(a scenario file, an inline scenario, or inline series) through the real pipeline on a
virtual clock and checks which alerts fire when::

    rule_files: [../gpu.yaml]            # relative to this file; default: the shipped rules
    tests:
    - name: the temperature page fires once and resolves once
      scenario: ../../scenarios/thermal-slowdown.yaml
      alerts:                            # the firing alerts at a time
      - at: 46m
        rule: GpuTemperatureHigh         # optional: look at this rule's alerts only
        firing:
        - {gpu: 6, severity: page}
      transitions:                       # exactly these firing/resolved transitions, in order,
      - {at: 45m, rule: GpuTemperatureHigh, state: firing, gpu: 6}     # for the rules named
      - {at: 1h20m, rule: GpuTemperatureHigh, state: resolved, gpu: 6}
      never:                             # no firing transition may match any of these
      - {severity: page, rule: GpuEccAccelerating}

Inline series (each value one ``step``; ``60x3`` is 60 four times, ``0+5x3`` is 0 5 10 15,
``_`` leaves the field as it is)::

      input:
        gpus: 2
        step: 1m
        series:
        - {gpu: 0, field: temperature_gpu, values: '60 90x10 60'}
        timeline:                        # any scenario timeline entries
        - {at: 5m, gpu: 1, lose: true}

Extra NVML fields (the config's ``fields`` section, same format) may be declared at the top
with ``fields:``; the rules and inputs of the file can then use them by name.

A failing test prints where it is (``PATH:LINE:COL``), what was expected and what
happened; the command exits 1.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TextIO

import yaml

from gpuwatchd.config.fields import read_fields
from gpuwatchd.config.yamlsrc import Node, Reader, load_file
from gpuwatchd.configfile.loader import Config, GpusConfig, default_config
from gpuwatchd.core.alerts import AlertState, AlertTransition
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.errors import ConfigError, Location
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.rules.engine import Alert, Engine
from gpuwatchd.rules.loader import load_rule_set
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.rules.store import StateStore
from gpuwatchd.scenario.model import Scenario, format_duration, load_scenario, parse_scenario
from gpuwatchd.service.assembly import Wiring

TOP_KEYS = ("rule_files", "fields", "tests")
TEST_KEYS = ("name", "scenario", "input", "gpus_expected", "alerts", "transitions", "never")
INPUT_KEYS = (
    "name",
    "description",
    "duration",
    "step",
    "gpus",
    "baseline",
    "jitter",
    "timeline",
    "series",
)
SERIES_KEYS = ("gpu", "link", "field", "values")
ALERTS_KEYS = ("at", "rule", "firing")
MATCH_KEYS = ("rule", "severity", "gpu", "link", "xid", "labels", "annotations")
TRANSITION_KEYS = ("at", "rule", "state", "severity", "gpu", "link", "xid", "labels")
STATES = ("pending", "firing", "resolved")
_NUM = r"[-+]?[0-9.]+(?:[eE][-+]?\d+)?"
_TOKEN_RE = re.compile(
    r"(?P<skip>_)(?:x(?P<skipn>\d+))?$"
    rf"|(?P<a>{_NUM})(?:(?P<sign>[-+])(?P<b>[0-9.]+(?:[eE][-+]?\d+)?))?x(?P<n>\d+)$"
    rf"|(?P<rv>{_NUM}[A-Za-z%]+?)x(?P<rn>\d+)$"
    r"|(?P<v>\S+)$"
)


@dataclass
class Matcher:
    loc: Location
    rule: str | None = None
    severity: str | None = None
    state: str | None = None
    at: float | None = None
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)

    def matches(
        self,
        rule: str,
        severity: str,
        labels: Any,
        annotations: Any,
        state: str | None = None,
    ) -> bool:
        if self.rule is not None and rule != self.rule:
            return False
        if self.severity is not None and severity != self.severity:
            return False
        if self.state is not None and state != self.state:
            return False
        if any(labels.get(k) != v for k, v in self.labels.items()):
            return False
        return all(annotations.get(k) == v for k, v in self.annotations.items())

    def describe(self) -> str:
        parts = [f"{k}={v}" for k, v in sorted(self.labels.items())]
        head = self.rule or "*"
        extra = f" severity={self.severity}" if self.severity else ""
        anns = "".join(f" {k}={v!r}" for k, v in sorted(self.annotations.items()))
        return f"{head}{{{', '.join(parts)}}}{extra}{anns}"


@dataclass
class AlertsCheck:
    loc: Location
    at: float
    rule: str | None
    firing: list[Matcher]


@dataclass
class TestCase:
    name: str
    loc: Location
    scenario: Scenario
    gpus_expected: int | None = None
    checks: list[AlertsCheck] = field(default_factory=list)
    transitions: list[Matcher] | None = None
    never: list[Matcher] = field(default_factory=list)
    fields: tuple[ExtraField, ...] = ()  # the file's extra NVML fields


def _alert_text(rule: str, severity: str, labels: Any) -> str:
    shown = {k: v for k, v in labels.items() if k in ("gpu", "link", "xid")}
    inner = ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))
    return f"{rule}{{{inner}}} severity={severity}"


def _transition_line(
    t: float, rule: str, state: str, labels: Any, severity: str | None = None
) -> str:
    shown = {k: v for k, v in labels.items() if k in ("gpu", "link", "xid")}
    inner = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
    sev = f" severity={severity}" if severity else ""
    return f"{format_duration(t)} {rule} {state}{sev} {inner}".rstrip()


# -- parsing the test file ------------------------------------------------------------------
class TestFileParser:
    def __init__(self, path: str) -> None:
        self.path = path
        self.base = os.path.dirname(os.path.abspath(path))
        self.r = Reader()
        self.fields: tuple[ExtraField, ...] = ()

    def parse(self) -> tuple[RuleSet, list[TestCase]]:
        root = load_file(self.path)
        if root is None or root.value is None:
            self.r.fail(Location(self.path, 1, 1), "empty test file: expected 'tests:'")
        keys = self.r.mapping(root, list(TOP_KEYS), "rule test file") or {}
        if "tests" not in keys:
            self.r.fail(root.loc, "rule test file: missing required key 'tests'")
        files: list[str] = []
        defaults = True
        if "rule_files" in keys:
            defaults = False
            for item in self.r.sequence(keys["rule_files"], "rule_files") or []:
                text = self.r.string(item, "rule_files")
                if text is None:
                    continue
                path = os.path.normpath(os.path.join(self.base, text))
                if not os.path.exists(path):
                    self.r.error(item.loc, f"rule_files: {text!r} does not exist")
                    continue
                files.append(path)
        self.fields = read_fields(self.r, keys.get("fields"))
        self.r.raise_if_any()
        rules = load_rule_set(files, defaults=defaults, extra_fields=self.fields)
        names = {r.name for r in rules.rules}
        tests: list[TestCase] = []
        for i, item in enumerate(self.r.sequence(keys["tests"], "tests") or []):
            test = self.test(item, f"tests[{i}]", names)
            if test is not None:
                tests.append(test)
        self.r.raise_if_any()
        return rules, tests

    def _rule_name(self, node: Node, what: str, names: set[str]) -> str | None:
        text = self.r.string(node, what)
        if text is not None and text not in names:
            hint = difflib.get_close_matches(text, sorted(names), n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.r.error(node.loc, f"{what}: no rule named {text!r} is loaded{suggestion}")
            return None
        return text

    def test(self, node: Node, what: str, names: set[str]) -> TestCase | None:
        keys = self.r.mapping(node, list(TEST_KEYS), what)
        if keys is None:
            return None
        before = len(self.r.problems)
        name = self.r.string(keys["name"], f"{what}.name") if "name" in keys else None
        if name is None and "name" not in keys:
            self.r.error(node.loc, f"{what}: missing required key 'name'")
        if name:
            what = f"test {name!r}"
        scenario: Scenario | None = None
        if ("scenario" in keys) == ("input" in keys):
            self.r.error(node.loc, f"{what}: give exactly one of 'scenario' and 'input'")
        elif "scenario" in keys:
            scenario = self.scenario(keys["scenario"], f"{what}.scenario")
        else:
            scenario = self.inline(keys["input"], f"{what}.input")
        expected = None
        if "gpus_expected" in keys:
            expected = self.r.integer(keys["gpus_expected"], f"{what}.gpus_expected", 0, 64)
        checks: list[AlertsCheck] = []
        if "alerts" in keys:
            for j, item in enumerate(self.r.sequence(keys["alerts"], f"{what}.alerts") or []):
                check = self.check(item, f"{what}.alerts[{j}]", names)
                if check is not None:
                    checks.append(check)
        transitions = None
        if "transitions" in keys:
            transitions = []
            for j, item in enumerate(
                self.r.sequence(keys["transitions"], f"{what}.transitions") or []
            ):
                m = self.matcher(item, f"{what}.transitions[{j}]", names, TRANSITION_KEYS)
                if m is not None:
                    if m.at is None or m.rule is None or m.state is None:
                        self.r.error(item.loc, f"{what}.transitions[{j}]: needs at, rule, state")
                    transitions.append(m)
        never: list[Matcher] = []
        if "never" in keys:
            for j, item in enumerate(self.r.sequence(keys["never"], f"{what}.never") or []):
                m = self.matcher(item, f"{what}.never[{j}]", names, MATCH_KEYS)
                if m is not None:
                    never.append(m)
        if len(self.r.problems) > before or scenario is None or name is None:
            return None
        return TestCase(name, node.loc, scenario, expected, checks, transitions, never, self.fields)

    def scenario(self, node: Node, what: str) -> Scenario | None:
        if isinstance(node.value, str):
            path = os.path.normpath(os.path.join(self.base, node.value))
            try:
                return load_scenario(path, self.fields)
            except ConfigError as exc:
                self.r.problems.extend(exc.problems)
                return None
        if node.is_mapping():
            return self._compile(node.plain(), node, what)
        self.r.error(node.loc, f"{what}: expected a scenario file name or an inline scenario")
        return None

    def inline(self, node: Node, what: str) -> Scenario | None:
        keys = self.r.mapping(node, list(INPUT_KEYS), what)
        if keys is None:
            return None
        plain: dict[str, Any] = {k: v.plain() for k, v in keys.items() if k != "series"}
        plain.setdefault("name", "rule-test")
        plain.setdefault("step", "1m")
        if isinstance(plain.get("gpus"), int) and not isinstance(plain["gpus"], bool):
            plain["gpus"] = {"count": plain["gpus"]}
        plain.setdefault("gpus", {"count": 1})
        step = (
            self.r.duration(keys["step"], f"{what}.step", allow_zero=False)
            if ("step" in keys)
            else 60.0
        )
        if step is None:
            return None
        timeline: list[Any] = list(plain.get("timeline") or [])
        longest = 0
        if "series" in keys:
            for j, item in enumerate(self.r.sequence(keys["series"], f"{what}.series") or []):
                entries = self.series(item, f"{what}.series[{j}]", step)
                if entries is None:
                    continue
                longest = max(longest, len(entries))
                timeline.extend(e for e in entries if e is not None)
        plain["timeline"] = timeline
        if "duration" not in plain:
            plain["duration"] = format_duration(max(longest - 1, 1) * step)
        return self._compile(plain, node, what)

    def series(self, node: Node, what: str, step: float) -> list[dict[str, Any] | None] | None:
        keys = self.r.mapping(node, list(SERIES_KEYS), what)
        if keys is None:
            return None
        for key in ("field", "values"):
            if key not in keys:
                self.r.error(node.loc, f"{what}: missing required key {key!r}")
                return None
        fieldname = self.r.string(keys["field"], f"{what}.field")
        text = keys["values"].value
        if isinstance(text, int | float) and not isinstance(text, bool):
            text = str(text)
        if not isinstance(text, str) or fieldname is None:
            self.r.error(keys["values"].loc, f"{what}.values: expected a string like '60 90x3'")
            return None
        values: list[str | None] = []
        for token in text.split():
            m = _TOKEN_RE.match(token)
            if m is None:  # pragma: no cover - the last branch matches any token
                self.r.error(keys["values"].loc, f"{what}.values: bad token {token!r}")
                return None
            if m.group("skip"):
                values.extend([None] * (int(m.group("skipn") or 0) + 1))
            elif m.group("rn") is not None:  # a value with a unit, repeated: 1980MHzx20
                values.extend([m.group("rv")] * (int(m.group("rn")) + 1))
            elif m.group("n") is not None:
                a = float(m.group("a"))
                b = float(m.group("b") or 0) * (-1 if m.group("sign") == "-" else 1)
                values.extend(_num(a + i * b) for i in range(int(m.group("n")) + 1))
            else:
                values.append(m.group("v"))
        base: dict[str, Any] = {}
        if "gpu" in keys:
            base["gpu"] = keys["gpu"].plain()
        if "link" in keys:
            base["link"] = keys["link"].plain()
        out: list[dict[str, Any] | None] = []
        for i, v in enumerate(values):
            if v is None:
                out.append(None)
                continue
            out.append({"at": format_duration(i * step), **base, "set": {fieldname: v}})
        return out

    def _compile(self, plain: Any, node: Node, what: str) -> Scenario | None:
        text = yaml.safe_dump(plain, sort_keys=False)
        try:
            return parse_scenario(text, f"{self.path}", self.fields)
        except ConfigError as exc:
            for _loc, message in exc.problems:
                self.r.error(node.loc, f"{what}: {message}")
            return None

    def check(self, node: Node, what: str, names: set[str]) -> AlertsCheck | None:
        keys = self.r.mapping(node, list(ALERTS_KEYS), what)
        if keys is None:
            return None
        if "at" not in keys or "firing" not in keys:
            self.r.error(node.loc, f"{what}: needs 'at' and 'firing' (a list; [] for none)")
            return None
        at = self.r.duration(keys["at"], f"{what}.at")
        rule = self._rule_name(keys["rule"], f"{what}.rule", names) if "rule" in keys else None
        firing: list[Matcher] = []
        for j, item in enumerate(self.r.sequence(keys["firing"], f"{what}.firing") or []):
            m = self.matcher(item, f"{what}.firing[{j}]", names, MATCH_KEYS)
            if m is not None:
                if rule is not None and m.rule is None:
                    m.rule = rule
                firing.append(m)
        if at is None:
            return None
        return AlertsCheck(node.loc, at, rule, firing)

    def matcher(
        self, node: Node, what: str, names: set[str], allowed: tuple[str, ...]
    ) -> Matcher | None:
        keys = self.r.mapping(node, list(allowed), what)
        if keys is None:
            return None
        m = Matcher(node.loc)
        if "rule" in keys:
            m.rule = self._rule_name(keys["rule"], f"{what}.rule", names)
        if "severity" in keys:
            m.severity = self.r.string(
                keys["severity"], f"{what}.severity", ("page", "ticket", "info")
            )
        if "state" in keys:
            m.state = self.r.string(keys["state"], f"{what}.state", STATES)
        if "at" in keys:
            m.at = self.r.duration(keys["at"], f"{what}.at")
        for key in ("gpu", "link", "xid"):
            if key in keys:
                value = keys[key].value
                if isinstance(value, bool) or not isinstance(value, int | str):
                    self.r.error(keys[key].loc, f"{what}.{key}: expected a number")
                    continue
                m.labels[key] = str(value)
        for key in ("labels", "annotations"):
            if key in keys:
                sub = keys[key]
                if not sub.is_mapping():
                    self.r.error(sub.loc, f"{what}.{key}: expected a mapping")
                    continue
                target = m.labels if key == "labels" else m.annotations
                for k_node, v_node in sub.items():
                    target[k_node.value] = str(v_node.value)
        return m


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


# -- running --------------------------------------------------------------------------------
@dataclass
class Outcome:
    test: TestCase
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems


def _config(test: TestCase) -> Config:
    config = default_config({})
    config = dataclasses.replace(config, node_name="rule-test", fields=test.fields)
    if test.gpus_expected is not None:
        config = dataclasses.replace(config, gpus=GpusConfig(expected=test.gpus_expected))
    return config


def run_test(rules: RuleSet, test: TestCase) -> Outcome:
    from gpuwatchd.harness.simulate import Simulation

    clock = VirtualClock()
    engine = Engine(rules, StateStore(":memory:", boot_id="rule-test"), clock)
    seen: list[tuple[float, AlertTransition]] = []
    sim = Simulation(test.scenario, _config(test), clock=clock, wiring=Wiring(rules=engine))
    sim.pipeline.on_transition = lambda tr: seen.append((tr.timestamp - sim.t0, tr))
    problems: list[str] = []
    checks = sorted(test.checks, key=lambda c: c.at)
    step = test.scenario.step
    duration = test.scenario.duration
    n = 0
    while True:
        sim.step()
        t = n * step
        while checks and checks[0].at <= t + 1e-9:
            problems.extend(_check(checks.pop(0), engine, t))
        n += 1
        if n * step > duration + 1e-9:
            break
        clock.set(sim.t0 + n * step)
    sim.finish()
    engine.close()
    for check in checks:
        problems.append(
            f"{check.loc}: at {format_duration(check.at)}: after the end of the input "
            f"({format_duration(duration)})"
        )
    if test.transitions is not None:
        problems.extend(_check_transitions(test, seen))
    for m in test.never:
        for t, tr in seen:
            if tr.state is AlertState.FIRING and m.matches(
                tr.rule, tr.severity.value, tr.labels, tr.annotations
            ):
                problems.append(
                    f"{m.loc}: at {format_duration(t)}: "
                    f"{_alert_text(tr.rule, tr.severity.value, tr.labels)} fired, "
                    f"but the test says never {m.describe()}"
                )
                break
    return Outcome(test, problems)


def _check(check: AlertsCheck, engine: Engine, t: float) -> list[str]:
    firing: list[Alert] = [
        a for a in engine.alerts(AlertState.FIRING) if check.rule is None or a.rule == check.rule
    ]
    unmatched = list(firing)
    missing: list[Matcher] = []
    for m in check.firing:
        found = next(
            (a for a in unmatched if m.matches(a.rule, a.severity.value, a.labels, a.annotations)),
            None,
        )
        if found is None:
            missing.append(m)
        else:
            unmatched.remove(found)
    if not missing and not unmatched:
        return []
    scope = f" of {check.rule}" if check.rule else ""
    lines = [
        f"{check.loc}: at {format_duration(check.at)} (evaluated at {format_duration(t)}): "
        f"firing alerts{scope} differ"
    ]
    lines += [f"    expected, not firing: {m.describe()}" for m in missing]
    lines += [
        f"    firing, not expected: {_alert_text(a.rule, a.severity.value, a.labels)}"
        for a in unmatched
    ]
    got = [_alert_text(a.rule, a.severity.value, a.labels) for a in firing] or ["(none)"]
    lines.append("    firing then: " + "; ".join(got))
    return ["\n".join(lines)]


def _check_transitions(test: TestCase, seen: list[tuple[float, AlertTransition]]) -> list[str]:
    assert test.transitions is not None
    rules = {m.rule for m in test.transitions}
    states = {"firing", "resolved"} | {m.state for m in test.transitions if m.state}
    # severities are compared when the expectation names any (then it must name all)
    with_severity = any(m.severity for m in test.transitions)
    expected = [
        _transition_line(
            m.at or 0.0,
            m.rule or "",
            m.state or "",
            m.labels,
            m.severity or "?" if with_severity else None,
        )
        for m in test.transitions
    ]
    # labels the expectation does not name (e.g. uuid) are not compared
    named: set[str] = set()
    for m in test.transitions:
        named |= set(m.labels)
    got = [
        _transition_line(
            t,
            tr.rule,
            tr.state.value,
            {k: v for k, v in tr.labels.items() if k in named},
            tr.severity.value if with_severity else None,
        )
        for t, tr in seen
        if tr.rule in rules and tr.state.value in states
    ]
    if got == expected:
        return []
    diff = difflib.unified_diff(expected, got, "expected", "got", lineterm="", n=2)
    where = test.transitions[0].loc if test.transitions else test.loc
    return [f"{where}: transitions differ:\n    " + "\n    ".join(diff)]


def run_file(path: str, out: TextIO) -> tuple[int, int]:
    """Run every test in a file; print results; ``(tests, failures)``. A file that does not
    load counts as one failure."""
    try:
        rules, tests = TestFileParser(path).parse()
    except ConfigError as exc:
        for line in exc.lines():
            out.write(line + "\n")
        return 1, 1
    failed = 0
    for test in tests:
        outcome = run_test(rules, test)
        if outcome.ok:
            out.write(f"{path}: PASS {test.name}\n")
        else:
            failed += 1
            out.write(f"{path}: FAIL {test.name}\n")
            for problem in outcome.problems:
                out.write(f"  {problem}\n")
    return len(tests), failed


def run_files(paths: Iterable[str], out: TextIO) -> int:
    total = failed = 0
    for path in paths:
        n, f = run_file(path, out)
        total += n
        failed += f
    out.write(f"{total - failed} passed, {failed} failed\n")
    return 1 if failed else 0
