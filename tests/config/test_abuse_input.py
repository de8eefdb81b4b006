"""Bad input everywhere else: hostile YAML (alias bombs, merge-key bombs, recursive
aliases, deep nesting, huge files, Python tags, binary junk) is refused within limits by
the config, rule and scenario loaders, each with a located ``ConfigError``; and random
rule files (hypothesis) never raise anything else. (tests/xid/test_properties.py covers the
XID parser, kmsg records, the config and scenario loaders; tests/exposition/test_abuse_http.py the
HTTP endpoints.)"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.rules.loader import load_rule_set, parse_rules
from gpuwatchd.scenario.model import load_scenario


def alias_bomb(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 12) -> str:
    lines = ["m0: &m0 {k0: 1, k1: 2, k2: 3, k3: 4, k4: 5, k5: 6, k6: 7, k7: 8}"]
    for i in range(1, levels):
        refs = ", ".join([f"*m{i - 1}"] * 8)
        lines.append(f"m{i}: &m{i} {{<<: [*m{i - 1}], x{i}: [{refs}]}}")
    return "\n".join(lines) + "\n"


HOSTILE: dict[str, tuple[bytes, str]] = {  # name -> (file content, what the error says)
    "alias bomb": (alias_bomb().encode(), "too large after alias expansion"),
    "merge-key bomb": (merge_bomb().encode(), "too large after alias expansion"),
    # one reader for every YAML file (config/yamlsrc): the same clear message everywhere
    "recursive alias": (b"a: &a [1, *a]\n", "recursive YAML alias *a"),
    # libyaml stops at its own depth limit first, PyYAML's parser reaches ours
    "deep nesting": (b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nest"),
    "deep mappings": (b"a: " + b"{b: " * 200 + b"1" + b"}" * 200 + b"\n", "nested too deeply"),
    "huge file": (b"# padding\n" * 500_000, "file too large"),
    "python tag": (b"a: !!python/object/apply:os.system ['touch /tmp/pwned']\n", ""),
    "binary junk": (bytes(range(256)) * 64, ""),
    "NUL bytes": (b"poll:\n  interval: 5s\x00\x00\n", ""),
    "many documents": (b"a: 1\n---\nb: 2\n", ""),
    "huge scalar": (b"node_name: " + b"x" * 3_000_000 + b"\n", ""),
}


def _config(path: Path) -> None:
    load_config(str(path), must_exist=True, environ={})


def _rules(path: Path) -> None:
    load_rule_set([str(path)], defaults=False)


def _scenario(path: Path) -> None:
    load_scenario(str(path))


LOADERS: dict[str, Callable[[Path], None]] = {
    "config": _config,
    "rules": _rules,
    "scenario": _scenario,
}


@pytest.mark.parametrize("loader", sorted(LOADERS))
def test_hostile_yaml_is_refused_within_limits(tmp_path: Path, loader: str) -> None:
    slowest = 0.0
    for name, (content, message) in HOSTILE.items():
        path = tmp_path / f"{name.replace(' ', '-')}.yaml"
        path.write_bytes(content)
        # CPU time of this thread: the bound (linear-time refusal, where a bomb took 25 s)
        # holds however loaded the machine is, as wall time on a shared 2-core box does not
        start = time.thread_time()
        with pytest.raises(ConfigError) as err:
            LOADERS[loader](path)
        took = time.thread_time() - start
        slowest = max(slowest, took)
        assert took < 5.0, f"{loader}: {name} took {took:.1f}s"
        lines = err.value.lines()
        assert all(line.startswith(str(path) + ":") for line in lines), (name, lines)
        assert message in str(err.value), (loader, name, str(err.value)[:300])
        assert not Path("/tmp/pwned").exists()
    print(
        f"RELIABILITY hostile_yaml loader={loader} documents={len(HOSTILE)} slowest_s={slowest:.2f}"
    )


# -- random rule files ----------------------------------------------------------------------
RULE_TOKENS = st.sampled_from(
    [
        "rules:\n",
        "- name: ",
        "GpuX",
        "  severity: ",
        "page",
        "ticket",
        "  for: ",
        "5m",
        "-1s",
        "  condition:\n",
        "    xid: {codes: [79, 48]}\n",
        "    xid: {buckets: [RESET_GPU], count: 3, window: 10m, quiet: 0s}\n",
        "    threshold: {field: temperature_gpu, op: '>', value: 85}\n",
        "    threshold: {field: nvlink_crc_errors, op: '=~', value: 1e999}\n",
        "    rate: {field: pcie_replay, window: 10m, op: '>', value: 5}\n",
        "    gpu_status: {status: [lost]}\n",
        "  annotations: {summary: '{gpu} {nope} {value:.0f} {{'}\n",
        "  drain: true\n",
        "  labels: {node: x}\n",
        "  routes: [nobody]\n",
        "  select: {gpus: [GPU-x]}\n",
        "&a ",
        "*a",
        "\n",
        "  ",
        ": ",
        "[",
        "{",
        "'",
    ]
)
RULE_SOUP = st.lists(st.one_of(RULE_TOKENS, st.text(max_size=10)), max_size=30).map("".join)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**20), 10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["5m", "85", "page", "temperature_gpu", ">", "RESET_GPU", "lost", "{gpu}"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
RULE_KEYS = st.sampled_from(
    ["name", "description", "severity", "for", "keep_firing_for", "select", "when",
     "condition", "labels", "annotations", "drain", "routes", "escalate", "bogus"]
)  # fmt: skip
CONDITIONS = st.dictionaries(
    st.sampled_from(
        ["xid", "threshold", "increase", "rate", "throttle", "gpu_status", "gpu_count", "x"]
    ),
    st.dictionaries(
        st.sampled_from(
            ["codes", "buckets", "count", "window", "quiet", "field", "op", "value", "reasons",
             "status", "by_code", "link", "accel"]
        ),
        VALUES,
        max_size=4,
    ),
    max_size=2,
)  # fmt: skip
RULES = st.fixed_dictionaries(
    {
        "rules": st.lists(
            st.dictionaries(RULE_KEYS, VALUES, max_size=6).flatmap(
                lambda d: CONDITIONS.map(lambda c: {**d, "condition": c})
            ),
            max_size=3,
        )
    }
)


@settings(max_examples=300, deadline=None)
@given(RULE_SOUP)
def test_rule_loader_raises_only_config_error_on_text(text: str) -> None:
    try:
        parse_rules(text, "fuzz.yaml")
    except ConfigError as exc:
        assert all(line.startswith("fuzz.yaml:") for line in exc.lines())


@settings(max_examples=300, deadline=None)
@given(RULES)
def test_rule_loader_raises_only_config_error_on_structure(doc: dict[str, object]) -> None:
    text = yaml.safe_dump(doc, allow_unicode=True)
    try:
        parse_rules(text, "fuzz.yaml")
    except ConfigError as exc:
        assert all(line.startswith("fuzz.yaml:") for line in exc.lines())
