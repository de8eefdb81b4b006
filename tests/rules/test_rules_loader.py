"""Rule files: one test per kind of mistake, each asserting its exact PATH:LINE:COL; the
shipped rule files load, are canonical, validate against rules/schema.json."""

from __future__ import annotations

import glob
import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from gpuwatchd.config.yamlsrc import MAX_NODES
from gpuwatchd.configfile.loader import load_config
from gpuwatchd.configfile.stages import for_rules
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.fields import CLOCK_EVENT_REASON_BITS
from gpuwatchd.rules import default_rule_files, load_rule_set, parse_rules, rules_from_settings
from gpuwatchd.rules.canonical import canonical_text
from gpuwatchd.rules.loader import CONDITION_KEYS, RULE_KEYS

ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED = sorted(glob.glob(str(ROOT / "rules" / "*.yaml")))
PROFILES = sorted(glob.glob(str(ROOT / "rules" / "profiles" / "*.yaml")))
SCHEMA = ROOT / "rules" / "schema.json"


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_rules(textwrap.dedent(text), "r.yaml")
    return info.value.lines()


def one_rule(body: str) -> str:
    """A file with one rule whose lines after ``- name: R`` are ``body`` (4 = line 3)."""
    return "rules:\n- name: R\n" + textwrap.indent(textwrap.dedent(body), "  ")


OK_RULE = """\
severity: page
condition:
  threshold: {field: temperature_gpu, op: '>', value: 85}
"""


def test_a_good_rule_loads() -> None:
    (rule,) = parse_rules(one_rule(OK_RULE), "r.yaml")
    assert rule.name == "R" and rule.kind == "threshold"
    assert str(rule.loc) == "r.yaml:2:9"


# -- one test per kind of mistake -----------------------------------------------------------------
def test_unknown_key_with_did_you_mean() -> None:
    assert errors(one_rule(OK_RULE + "anotations: {}\n")) == [
        "r.yaml:6:3: rules[0]: unknown key 'anotations' (did you mean 'annotations'?)"
    ]


def test_unknown_condition_key_with_did_you_mean() -> None:
    text = one_rule(
        "severity: page\ncondition:\n  threshold: {feild: temperature_gpu, op: '>', value: 1}\n"
    )
    assert errors(text) == [
        "r.yaml:5:16: rule 'R'.condition.threshold: missing required key 'field'",
        "r.yaml:5:17: rule 'R'.condition.threshold: unknown key 'feild' (did you mean 'field'?)",
    ]


def test_unknown_condition_kind() -> None:
    text = one_rule("severity: page\ncondition:\n  treshold: {}\n")
    assert errors(text)[0].startswith(
        "r.yaml:5:5: rule 'R'.condition: unknown condition 'treshold' (did you mean 'threshold'?)"
    )


def test_two_conditions_in_one_rule() -> None:
    text = one_rule(OK_RULE + "  gpu_count: {}\n")
    assert errors(text)[0].startswith("r.yaml:6:5: rule 'R'.condition: exactly one condition")


def test_duplicate_key() -> None:
    assert errors(one_rule(OK_RULE + "severity: ticket\n")) == [
        "r.yaml:6:3: duplicate key 'severity'"
    ]


def test_wrong_types() -> None:
    text = one_rule(
        "severity: 3\ndrain: 'yes'\nroutes: pager\n"
        "condition:\n  threshold: {field: temperature_gpu, op: '>', value: [85]}\n"
    )
    assert errors(text) == [
        "r.yaml:3:13: rule 'R'.severity: expected a string, got number",
        "r.yaml:4:10: rule 'R'.drain: expected true or false, got string",
        "r.yaml:5:11: rule 'R'.routes: expected a list, got string",
        "r.yaml:7:57: rule 'R'.condition.threshold.value: expected a number, got list",
    ]


def test_bad_durations() -> None:
    text = one_rule(
        "severity: page\nfor: 5 mins\nkeep_firing_for: -1m\n"
        "condition:\n  increase: {field: ecc_corrected_volatile, window: 0s}\n"
    )
    lines = errors(text)
    assert lines[0].startswith("r.yaml:4:8: rule 'R'.for: '5 mins' is not a duration")
    assert lines[1].startswith("r.yaml:5:20: rule 'R'.keep_firing_for: '-1m' is not a duration")
    assert lines[2] == (
        "r.yaml:7:55: rule 'R'.condition.increase.window: must be more than 0s, got '0s'"
    )


def test_unknown_field_name() -> None:
    text = one_rule(
        "severity: page\ncondition:\n  threshold: {field: temprature, op: '>', value: 1}\n"
    )
    assert errors(text) == [
        "r.yaml:5:24: rule 'R'.condition.threshold.field: unknown field 'temprature' "
        "(did you mean 'temperature_gpu'?)"
    ]


def test_a_gauge_is_not_a_counter() -> None:
    text = one_rule(
        "severity: page\ncondition:\n  increase: {field: temperature_gpu, window: 1h}\n"
    )
    assert errors(text)[0].startswith(
        "r.yaml:5:23: rule 'R'.condition.increase.field: 'temperature_gpu' is a gauge"
    )


def test_bad_value_unit() -> None:
    text = one_rule(
        "severity: page\ncondition:\n  threshold: {field: sm_clock, op: '<', value: 1980MB}\n"
    )
    assert errors(text)[0].startswith(
        "r.yaml:5:50: rule 'R'.condition.threshold.value: unknown unit 'MB'"
    )
    (rule,) = parse_rules(
        one_rule(
            OK_RULE.replace("value: 85", "value: 1980MHz").replace("temperature_gpu", "sm_clock")
        ),
        "r.yaml",
    )
    assert rule.condition.value == 1.98e9  # type: ignore[union-attr]


def test_unknown_xid_code_bucket_and_severity() -> None:
    text = one_rule(
        "severity: page\ncondition:\n  xid:\n"
        "    codes: [79, 999]\n    buckets: [RESET_GPUS, WORKFLOW_XID_13]\n"
        "    severities: [fatal]\n"
    )
    assert errors(text) == [
        "r.yaml:6:19: rule 'R'.condition.xid.codes: XID 999 is not in NVIDIA's XID catalog "
        "(nearest known: 170, 171, 172)",
        "r.yaml:7:17: rule 'R'.condition.xid.buckets: 'RESET_GPUS' is not an immediate "
        "resolution bucket of the XID catalog (did you mean 'RESET_GPU'?) (one of: "
        "CHECK_MECHANICALS, CHECK_UVM, CONTACT_SUPPORT, IGNORE, RESET_GPU, RESTART_APP, "
        "RESTART_BM, RESTART_VM, UPDATE_SWFW, WORKFLOW_NVLINK5_ERR, WORKFLOW_NVLINK_ERR, "
        "WORKFLOW_XID_45, WORKFLOW_XID_48, XID_154)",
        "r.yaml:7:29: rule 'R'.condition.xid.buckets: 'WORKFLOW_XID_13' is only an "
        "investigatory bucket; buckets match the catalog's immediate resolution (one of: "
        "CHECK_MECHANICALS, CHECK_UVM, CONTACT_SUPPORT, IGNORE, RESET_GPU, RESTART_APP, "
        "RESTART_BM, RESTART_VM, UPDATE_SWFW, WORKFLOW_NVLINK5_ERR, WORKFLOW_NVLINK_ERR, "
        "WORKFLOW_XID_45, WORKFLOW_XID_48, XID_154)",
        "r.yaml:8:20: rule 'R'.condition.xid.severities: 'fatal' is not a catalog severity "
        "(one of critical, warning, info, unknown)",
    ]


def test_unknown_throttle_reason() -> None:
    text = one_rule("severity: page\ncondition:\n  throttle: {reasons: [hw_thermal]}\n")
    assert errors(text) == [
        "r.yaml:5:26: rule 'R'.condition.throttle.reasons: unknown clock-event reason "
        "'hw_thermal' (did you mean 'hw_thermal_slowdown'?) (one of "
        + ", ".join(CLOCK_EVENT_REASON_BITS)
        + ")"
    ]


def test_annotation_placeholders_are_checked_at_load() -> None:
    text = one_rule(
        OK_RULE
        + "annotations:\n"
        + "  a: '{gpuu}'\n"
        + "  b: '{gpu.__class__}'\n"
        + "  c: '{value:.x}'\n"
        + "  d: '{xid}'\n"
        + "  e: '{uuid!r}'\n"
        + "  f: 'unbalanced {'\n"
    )
    lines = errors(text)
    assert lines[0].startswith(
        "r.yaml:7:8: rule 'R'.annotations.a: unknown placeholder {gpuu} (did you mean {gpu}?)"
    )
    assert lines[1].startswith(
        "r.yaml:8:8: rule 'R'.annotations.b: placeholder {gpu.__class__} is not allowed"
    )
    assert lines[2].startswith(
        "r.yaml:9:8: rule 'R'.annotations.c: placeholder {value:.x}: bad format spec for a number"
    )
    assert lines[3].startswith("r.yaml:10:8: rule 'R'.annotations.d: unknown placeholder {xid}")
    assert lines[4] == (
        "r.yaml:11:8: rule 'R'.annotations.e: placeholder {uuid!r}: conversions are not allowed"
    )
    assert lines[5].startswith("r.yaml:12:8: rule 'R'.annotations.f: bad template")


def test_reserved_and_bad_labels() -> None:
    text = one_rule(OK_RULE + "labels: {gpu: '1', 2bad: x, team: 3}\n")
    assert errors(text) == [
        "r.yaml:6:12: rule 'R'.labels: 'gpu' is set by gpuwatchd (reserved: alertname, gpu, "
        "link, model, node, pci_bus_id, rule, severity, uuid, xid)",
        "r.yaml:6:22: rule 'R'.labels: '2bad' is not a label name ([A-Za-z_][A-Za-z0-9_]*)",
        "r.yaml:6:37: rule 'R'.labels.team: expected a string, got number",
    ]


def test_missing_required_keys_and_bad_name() -> None:
    assert errors("rules:\n- name: 9lives\n  condition: {gpu_count: {}}\n") == [
        "r.yaml:2:3: rules[0]: missing required key 'severity'",
        "r.yaml:2:9: rules[0].name: '9lives' is not a rule name (a letter, then letters, "
        "digits or '_', at most 100 characters, e.g. GpuTemperatureHigh)",
    ]
    assert errors("alerts: []\n") == [
        "r.yaml:1:1: rule file: unknown key 'alerts'",
        "r.yaml:1:1: rule file: missing required key 'rules'",
    ]


def test_options_that_do_not_fit_the_condition() -> None:
    text = one_rule(
        "severity: page\nfor: 1m\nkeep_firing_for: 1m\nwhen: {field: power, op: '>', value: 1}\n"
        "condition:\n  xid: {codes: [79]}\n"
    )
    assert errors(text) == [
        "r.yaml:4:8: rule 'R'.for: an xid rule fires on the event itself; use "
        "condition.xid.count and window to ask for repeats",
        "r.yaml:5:20: rule 'R'.keep_firing_for: an xid rule resolves after "
        "condition.xid.quiet; set that instead",
        "r.yaml:6:9: rule 'R'.when: not available for xid rules (it needs the GPU's latest "
        "sample, which a lost GPU does not have)",
    ]
    text = one_rule(
        "severity: page\ncondition:\n  trend: {field: ecc_corrected_volatile, slices: 4, "
        "min_slices: 5}\n"
    )
    assert errors(text) == [
        "r.yaml:5:67: rule 'R'.condition.trend.min_slices: 5 is more than slices (4)"
    ]
    text = one_rule(
        "severity: page\ncondition:\n  peer_outlier: {field: sm_clock, direction: below, "
        "ratio: 2}\n"
    )
    assert errors(text)[0].startswith(
        "r.yaml:5:62: rule 'R'.condition.peer_outlier.ratio: for direction 'below' the ratio "
        "must be <= 1"
    )


def test_duplicate_rule_names_across_files(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(one_rule(OK_RULE))
    b.write_text("# another file\n" + one_rule(OK_RULE))
    with pytest.raises(ConfigError) as info:
        load_rule_set([str(a), str(b)], defaults=False)
    assert info.value.lines() == [f"{b}:3:9: rules[0].name: rule 'R' is already defined at {a}:2:9"]


def test_every_problem_in_every_file_is_reported_at_once(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text(one_rule("severity: pager\ncondition: {gpu_count: {}}\n"))
    b.write_text("rules: [")
    with pytest.raises(ConfigError) as info:
        load_rule_set([str(tmp_path / "*.yaml")], defaults=False)
    lines = info.value.lines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{a}:3:13: rule 'R'.severity: 'pager' is not one of")
    # at the end of the input: its last column (PyYAML) or the next line (libyaml)
    assert lines[1].startswith((f"{b}:1:9: YAML syntax error", f"{b}:2:1: YAML syntax error"))


def test_yaml_alias_bomb_is_refused_in_linear_time() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [" + ", ".join([f"*{chr(96 + i)}"] * 10) + "]")
    lines.append("rules: []")
    text = "\n".join(lines) + "\n"
    msg = errors(text)
    assert len(msg) == 1
    assert f"document too large after alias expansion (more than {MAX_NODES} nodes)" in msg[0]
    assert msg[0].startswith("r.yaml:6:")  # where the expansion crossed the limit


def test_recursive_alias_is_refused() -> None:
    assert errors("rules: &r\n- *r\n") == [
        "r.yaml:2:3: recursive YAML alias *r (it refers to a node that contains it)"
    ]


def test_oversized_file_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (4 * 1024 * 1024) + "\nrules: []\n")
    with pytest.raises(ConfigError) as info:
        load_rule_set([str(big)], defaults=False)
    assert info.value.lines() == [f"{big}:1:1: file too large (more than 4 MiB)"]


def test_empty_file_and_empty_rules_list_are_fine(tmp_path: Path) -> None:
    assert parse_rules("# nothing yet\n", "r.yaml") == []
    assert parse_rules("rules: []\n", "r.yaml") == []


# -- the config's rules section -------------------------------------------------------------------
def test_config_rules_section(tmp_path: Path) -> None:
    (tmp_path / "rules.d").mkdir()
    (tmp_path / "rules.d" / "site.yaml").write_text(
        one_rule(OK_RULE).replace("name: R", "name: SiteHot")
    )
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(
        "rules:\n  files: [rules.d/*.yaml]\n  defaults: true\n"
        "  disable: [GpuTemperatureHigh, NvlinkLinkDown]\n"
    )
    config = load_config(str(cfg), must_exist=True, environ={})
    assert config.rules.files == (str(tmp_path / "rules.d" / "*.yaml"),)
    ruleset = rules_from_settings(for_rules(config))
    names = ruleset.names()
    assert "SiteHot" in names and "GpuXidFatal" in names
    assert "GpuTemperatureHigh" not in names and "NvlinkLinkDown" not in names
    no_defaults = load_config(str(cfg), must_exist=True, environ={})
    cfg.write_text("rules:\n  files: [rules.d/*.yaml]\n  defaults: false\n")
    no_defaults = load_config(str(cfg), must_exist=True, environ={})
    assert rules_from_settings(for_rules(no_defaults)).names() == ["SiteHot"]


def test_config_rules_errors_point_into_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text("rules:\n  files: [missing.yaml]\n  disable: [GpuTemperatureHihg]\n")
    config = load_config(str(cfg), must_exist=True, environ={})
    with pytest.raises(ConfigError) as info:
        rules_from_settings(for_rules(config))
    assert info.value.lines() == [
        f"{cfg}:2:11: rules.files: '{tmp_path}/missing.yaml' does not exist"
    ]
    cfg.write_text("rules:\n  disable: [GpuTemperatureHihg]\n")
    config = load_config(str(cfg), must_exist=True, environ={})
    with pytest.raises(ConfigError) as info:
        rules_from_settings(for_rules(config))
    assert info.value.lines() == [
        f"{cfg}:2:13: rules.disable: no rule named 'GpuTemperatureHihg' "
        "(did you mean 'GpuTemperatureHigh'?)"
    ]
    cfg.write_text("rules:\n  files: /etc/x.yaml\n  defaults: yes please\n  dsable: []\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(cfg), must_exist=True, environ={})
    assert info.value.lines() == [
        f"{cfg}:2:10: rules.files: expected a list, got string",
        f"{cfg}:3:13: rules.defaults: expected true or false, got string",
        f"{cfg}:4:3: rules: unknown key 'dsable' (did you mean 'disable'?)",
    ]


def test_config_rules_no_drain_keeps_the_alert_and_drops_the_drain(tmp_path: Path) -> None:
    """Issue 22: a fatal SXid drains by default; a site can keep the page without it."""
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text("node_name: n\n")
    default = rules_from_settings(for_rules(load_config(str(cfg), must_exist=True, environ={})))
    rule = default.get("NvswitchSxidFatal")
    assert rule is not None and rule.drain and rule.severity.value == "page"
    cfg.write_text("rules:\n  no_drain: [NvswitchSxidFatal, GpuXidFatal]\n")
    config = load_config(str(cfg), must_exist=True, environ={})
    assert config.rules.no_drain == ("NvswitchSxidFatal", "GpuXidFatal")
    ruleset = rules_from_settings(for_rules(config))
    for name in ("NvswitchSxidFatal", "GpuXidFatal"):
        rule = ruleset.get(name)
        assert rule is not None and not rule.drain and rule.severity.value == "page"
    other = ruleset.get("GpuRecoveryActionRequired")
    assert other is not None and other.drain
    cfg.write_text("rules:\n  no_drain: [NvswitchSxidFatl]\n")
    config = load_config(str(cfg), must_exist=True, environ={})
    with pytest.raises(ConfigError) as info:
        rules_from_settings(for_rules(config))
    assert info.value.lines() == [
        f"{cfg}:2:14: rules.no_drain: no rule named 'NvswitchSxidFatl' "
        "(did you mean 'NvswitchSxidFatal'?)"
    ]


# -- the shipped rules ----------------------------------------------------------------------------
def test_shipped_rules_are_the_package_defaults() -> None:
    assert [os.path.basename(p) for p in default_rule_files()] == [
        os.path.basename(p) for p in SHIPPED
    ]
    assert os.path.realpath(default_rule_files()[0]) == os.path.realpath(SHIPPED[0])


@pytest.mark.parametrize("path", SHIPPED + PROFILES, ids=os.path.basename)
def test_shipped_rule_file_loads_and_is_canonical(path: str) -> None:
    text = Path(path).read_text()
    rules = parse_rules(text, path)
    assert rules
    assert canonical_text(text, path) == text, f"run: gpuwatchd rules fmt --write {path}"
    for rule in rules:
        assert rule.description, rule.name
        assert {"summary", "action"} <= set(rule.annotations), rule.name


@pytest.mark.parametrize("path", SHIPPED + PROFILES, ids=os.path.basename)
def test_shipped_rule_file_validates_against_the_schema(path: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(yaml.safe_load(Path(path).read_text()), schema)


def test_schema_knows_every_key_the_loader_knows() -> None:
    schema = json.loads(SCHEMA.read_text())
    rule = schema["$defs"]["rule"]["properties"]
    assert list(rule) == list(RULE_KEYS)
    conditions = schema["$defs"]["condition"]["properties"]
    assert list(conditions) == list(CONDITION_KEYS)
    for kind, keys in CONDITION_KEYS.items():
        body = conditions[kind]
        body = next(b for b in body.get("oneOf", [body]) if b.get("type") == "object")
        assert list(body["properties"]) == list(keys), kind


def test_schema_rejects_what_the_loader_rejects() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads(SCHEMA.read_text())
    for bad in (
        one_rule(OK_RULE + "anotations: {}\n"),
        one_rule("severity: pager\ncondition: {gpu_count: {}}\n"),
        one_rule("severity: page\nfor: 5 mins\ncondition: {gpu_count: {}}\n"),
        one_rule("severity: page\ncondition: {throttle: {reasons: [hw_thermal]}}\n"),
        one_rule("severity: page\ncondition: {gpu_count: {}, gpu_status: {status: [lost]}}\n"),
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(bad), schema)


def test_octal_looking_xid_codes_are_refused() -> None:
    """Issue 15 item 9, failed on main: ``codes: [013, 031]`` silently meant XIDs 11 and 25."""
    text = one_rule("severity: page\ncondition:\n  xid:\n    codes: [013, 031]\n")
    assert errors(text) == [
        "r.yaml:6:15: number '013' has a leading zero, which YAML 1.1 reads as octal "
        "(or as a string): write 13 for the number, or quote it for a string"
    ]
    big = one_rule("severity: page\ncondition:\n  xid:\n    codes: [1000000]\n")
    assert "r.yaml:6:15: rule 'R'.condition.xid.codes: must be <= 999999, got 1000000" in (
        errors(big)
    )


def test_format_spec_bombs_are_refused_at_load() -> None:
    """Issue 15 item 6, failed on main: ``{gpu:>200000000}`` passed check-config, then every
    evaluation of the rule failed with MemoryError and XID 79 was never paged."""
    for spec, problem in (
        (">200000000", "width 200000000 is more than 64"),
        (".999999999f", "precision 999999999 is more than 12"),
        (">\u0665\u0665\u0665\u0665", "only the fill character may be non-ASCII"),
    ):
        text = one_rule(OK_RULE + f"annotations: {{summary: 'x {{gpu:{spec}}}'}}\n")
        (line,) = errors(text)
        assert line.startswith("r.yaml:6:26: rule 'R'.annotations.summary: placeholder"), line
        assert f"format spec refused: {problem}" in line, line
    (rule,) = parse_rules(one_rule(OK_RULE + "annotations: {summary: '{gpu:*>64}'}\n"), "r.yaml")
    assert rule.annotations["summary"].render({"gpu": 3}) == "*" * 63 + "3"


def test_rendered_annotations_are_bounded() -> None:
    from gpuwatchd.rules.templates import MAX_RENDERED, compile_template

    template = compile_template("{process:>64}" * 200, ["process"])
    assert not isinstance(template, str)
    assert len(template.render({"process": "p"})) == MAX_RENDERED


def test_a_linked_private_file_is_never_quoted(tmp_path: Path) -> None:
    """Issue 15 item 15, failed on main: a rule file linked to /etc/shadow (here a copy
    with its mode) had every line quoted in check-config's errors."""
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$y$j9T$SECRETHASH:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n")
    shadow.chmod(0o640)
    link = tmp_path / "rules.yaml"
    link.symlink_to(shadow)
    with pytest.raises(ConfigError) as info:
        load_rule_set([str(link)], defaults=False)
    lines = info.value.lines()
    assert [line.split(": ", 1)[0] for line in lines] == [f"{link}:1:1", f"{link}:2:1"]
    assert not any("SECRETHASH" in line or "daemon" in line for line in lines), lines
    # the same file named directly, or readable by all, is the administrator's: quoted
    for path, mode in ((shadow, 0o640), (link, 0o644)):
        shadow.chmod(mode)
        with pytest.raises(ConfigError) as info:
            load_rule_set([str(path)], defaults=False)
        assert "SECRETHASH" in "\n".join(info.value.lines())


def test_a_fifo_rule_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """Issue 15 item 15, failed on main: check-config hung on a FIFO rule file."""
    import threading

    fifo = tmp_path / "rules.yaml"
    os.mkfifo(fifo)
    box: list[list[str]] = []

    def load() -> None:
        try:
            load_rule_set([str(fifo)], defaults=False)
        except ConfigError as exc:
            box.append(exc.lines())

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "blocked on the FIFO"
    assert box == [[f"{fifo}:1:1: cannot read file: refusing {fifo}: a file that is a FIFO "
                    "(only regular files are read)"]]  # fmt: skip
