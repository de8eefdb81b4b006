"""Config loading: defaults, every kind of mistake with its exact location, shipped file."""

from __future__ import annotations

import dataclasses
import re
import socket
from pathlib import Path

import pytest
import yaml

from gpuwatchd.configfile import loader as config
from gpuwatchd.configfile.loader import (
    BackendSpec,
    Config,
    ConfigError,
    GpusConfig,
    ListenAddress,
    MetricsConfig,
    PollConfig,
    load_config,
)

ROOT = Path(__file__).resolve().parent.parent.parent
SHIPPED = ROOT / "packaging" / "gpuwatchd.yaml"
DOCS = ROOT / "docs" / "config.md"
NO_ENV: dict[str, str] = {}


def write(tmp_path: Path, text: str, name: str = "cfg.yaml") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def errors(tmp_path: Path, text: str) -> list[str]:
    """The error lines for a config text, with the temp directory cut off the path."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, must_exist=True, environ=NO_ENV)
    prefix = str(tmp_path) + "/"
    return [line.removeprefix(prefix) for line in info.value.lines()]


# -- defaults ------------------------------------------------------------------------------
def expected_defaults(state_dir: str = "/var/lib/gpuwatchd") -> Config:
    return Config(
        node_name=socket.gethostname().partition(".")[0],
        listen=ListenAddress("127.0.0.1", 9835),
        backend=BackendSpec("nvml"),
        state_dir=state_dir,
        log_level="info",
        poll=PollConfig(interval=5.0, call_timeout=2.0, nvlink=True, processes=True),
        gpus=GpusConfig(expected=None, ignore=()),
        metrics=MetricsConfig(dcgm_compat=False, hostname_label=True, per_link=True),
    )


def test_defaults_with_no_file() -> None:
    cfg = load_config(None, must_exist=False, environ=NO_ENV)
    assert cfg == expected_defaults()
    assert cfg.source is None
    assert config.default_config(NO_ENV) == cfg


def test_missing_default_path_gives_defaults(tmp_path: Path) -> None:
    cfg = load_config(str(tmp_path / "absent.yaml"), must_exist=False, environ=NO_ENV)
    assert cfg == expected_defaults()


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    path = str(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError) as info:
        load_config(path, must_exist=True, environ=NO_ENV)
    assert info.value.lines() == [f"{path}:1:1: cannot read file: No such file or directory"]


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_file_gives_defaults(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    cfg = load_config(path, must_exist=True, environ=NO_ENV)
    assert cfg == expected_defaults()
    assert cfg.source == path


def test_empty_sections_give_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "poll:\ngpus:\n  ignore:\nmetrics: {}\n")
    assert load_config(path, must_exist=True, environ=NO_ENV) == expected_defaults()


def test_state_directory_env_is_the_default(tmp_path: Path) -> None:
    env = {"STATE_DIRECTORY": "/run/state/gpuwatchd"}
    assert load_config(None, must_exist=False, environ=env).state_dir == "/run/state/gpuwatchd"
    # systemd joins several StateDirectory= entries with ':'; ours is the first.
    env = {"STATE_DIRECTORY": "/var/lib/gpuwatchd:/var/lib/other"}
    assert load_config(None, must_exist=False, environ=env).state_dir == "/var/lib/gpuwatchd"
    # An explicit setting wins over the environment.
    path = write(tmp_path, "state_dir: /srv/gpuwatchd/\n")
    assert load_config(path, must_exist=True, environ=env).state_dir == "/srv/gpuwatchd"


def test_every_setting_is_read(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
node_name: gpu-a17
listen: "[::1]:19835"
backend: scenario:scen/ecc.yaml
state_dir: /srv/gw
log_level: DEBUG
poll:
  interval: 1s500ms
  call_timeout: 0.75
  nvlink: false
  processes: false
gpus:
  expected: 8
  ignore:
    - GPU-5D9E3C52-0A8C-4F1E-9B61-3F6C2F6E7A10
    - 0000:3b:00.0
    - 1:C1:00.1
metrics:
  dcgm_compat: true
  hostname_label: false
  per_link: false
""",
    )
    cfg = load_config(path, must_exist=True, environ=NO_ENV)
    assert cfg == Config(
        node_name="gpu-a17",
        listen=ListenAddress("::1", 19835),
        backend=BackendSpec("scenario", str(tmp_path / "scen" / "ecc.yaml")),
        state_dir="/srv/gw",
        log_level="debug",
        poll=PollConfig(interval=1.5, call_timeout=0.75, nvlink=False, processes=False),
        gpus=GpusConfig(
            expected=8,
            ignore=(
                "GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a10",
                "00000000:3B:00.0",
                "00000001:C1:00.1",
            ),
        ),
        metrics=MetricsConfig(dcgm_compat=True, hostname_label=False, per_link=False),
    )
    assert str(cfg.listen) == "[::1]:19835"


# -- one test per kind of mistake ----------------------------------------------------------
DURATION_HELP = (
    "(use a number and a unit with no space: 250ms, 30s, 5m, 2h, 1d, 1w; combined like 1h30m)"
)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    assert errors(tmp_path, "log_level: info\nlisen: 127.0.0.1:9835\n") == [
        "cfg.yaml:2:1: config: unknown key 'lisen' (did you mean 'listen'?)"
    ]


def test_unknown_section_key(tmp_path: Path) -> None:
    assert errors(tmp_path, "poll:\n  nvlink: true\n  intervall: 5s\n") == [
        "cfg.yaml:3:3: poll: unknown key 'intervall' (did you mean 'interval'?)"
    ]


def test_unknown_key_without_close_match(tmp_path: Path) -> None:
    assert errors(tmp_path, "metrics:\n  colour: blue\n") == [
        "cfg.yaml:2:3: metrics: unknown key 'colour'"
    ]


def test_wrong_type(tmp_path: Path) -> None:
    text = 'poll:\n  nvlink: "yes please"\ngpus: [0, 1]\nnode_name: 17\n'
    assert errors(tmp_path, text) == [
        "cfg.yaml:2:11: poll.nvlink: expected true or false, got string",
        "cfg.yaml:3:7: gpus: expected a mapping, got list",
        "cfg.yaml:4:12: node_name: expected a string, got number",
    ]


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    assert errors(tmp_path, "- poll\n") == ["cfg.yaml:1:1: config: expected a mapping, got list"]


def test_bad_duration(tmp_path: Path) -> None:
    assert errors(tmp_path, "poll:\n  interval: 5 mins\n") == [
        f"cfg.yaml:2:13: poll.interval: '5 mins' is not a duration {DURATION_HELP}"
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("localhost", "listen: 'localhost' is not an address of the form HOST:PORT"),
        ('"gpu-a:9835"', "listen: 'gpu-a' is not an IP address (or 'localhost')"),
        ('"127.0.0.1:70000"', "listen: port 70000 is out of range 0-65535"),
        ("9835", "listen: expected 'HOST:PORT', got number"),
    ],
    ids=["no-port", "hostname", "port-range", "number"],
)
def test_bad_address(tmp_path: Path, value: str, message: str) -> None:
    assert errors(tmp_path, f"listen: {value}\n") == [f"cfg.yaml:1:9: {message}"]


def test_out_of_range_numbers(tmp_path: Path) -> None:
    text = "poll:\n  interval: 50ms\n  call_timeout: 0\ngpus:\n  expected: -1\n"
    assert errors(tmp_path, text) == [
        "cfg.yaml:2:13: poll.interval: must be at least 100ms, got '50ms'",
        "cfg.yaml:3:17: poll.call_timeout: must be more than 0s, got 0",
        "cfg.yaml:5:13: gpus.expected: must be >= 0, got -1",
    ]


def test_infinite_duration(tmp_path: Path) -> None:
    assert errors(tmp_path, "poll:\n  interval: .inf\n  call_timeout: .nan\n") == [
        "cfg.yaml:2:13: poll.interval: must be a finite duration, got inf",
        "cfg.yaml:3:17: poll.call_timeout: must be a finite duration, got nan",
    ]


def test_call_timeout_must_be_below_ten_intervals(tmp_path: Path) -> None:
    assert errors(tmp_path, "poll:\n  interval: 1s\n  call_timeout: 10s\n") == [
        "cfg.yaml:3:17: poll.call_timeout: must be less than 10 x poll.interval (10s), got '10s'"
    ]
    # Against the default interval (5s) when interval is not set.
    assert errors(tmp_path, "poll:\n  call_timeout: 1m\n") == [
        "cfg.yaml:2:17: poll.call_timeout: must be less than 10 x poll.interval (50s), got '1m'"
    ]


def test_non_integer_count(tmp_path: Path) -> None:
    assert errors(tmp_path, "gpus:\n  expected: 2.5\n") == [
        "cfg.yaml:2:13: gpus.expected: expected an integer, got 2.5"
    ]


def test_wrong_choice(tmp_path: Path) -> None:
    assert errors(tmp_path, "log_level: warn\n") == [
        "cfg.yaml:1:12: log_level: 'warn' is not one of debug, info, warning, error "
        "(did you mean 'warning'?)"
    ]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nvm", "'nvm' is not a backend: use 'nvml' or 'scenario:PATH' (did you mean 'nvml'?)"),
        ('"scenario:"', "'scenario:' needs a path to a scenario file: scenario:PATH"),
    ],
    ids=["unknown", "no-path"],
)
def test_bad_backend(tmp_path: Path, value: str, message: str) -> None:
    assert errors(tmp_path, f"backend: {value}\n") == [f"cfg.yaml:1:10: backend: {message}"]


def test_bad_gpu_ids(tmp_path: Path) -> None:
    text = 'gpus:\n  ignore:\n    - 0\n    - GPU-1\n    - "0000:3b:00.0"\n    - 3B:00.0\n'
    assert errors(tmp_path, text) == [
        "cfg.yaml:3:7: gpus.ignore: 0 looks like a GPU index, which can change across reboots; "
        "use the GPU UUID (GPU-...) or PCI bus id (00000000:3B:00.0)",
        "cfg.yaml:4:7: gpus.ignore: 'GPU-1' is neither a GPU UUID "
        "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) nor a PCI bus id (00000000:3B:00.0)",
        "cfg.yaml:6:7: gpus.ignore: '3B:00.0' is listed twice",
    ]


def test_bad_paths_and_names(tmp_path: Path) -> None:
    assert errors(tmp_path, 'state_dir: var/lib/gw\nnode_name: "gpu a"\n') == [
        "cfg.yaml:1:12: state_dir: 'var/lib/gw' is not an absolute path",
        "cfg.yaml:2:12: node_name: 'gpu a' is not a node name "
        "(1-253 characters, no spaces or control characters)",
    ]


def test_yaml_syntax_error_location(tmp_path: Path) -> None:
    (line,) = errors(tmp_path, "poll:\n  interval: 5s\n   nvlink: true\n")
    # "... not allowed here" (PyYAML) or "... not allowed in this context" (libyaml)
    assert line.startswith("cfg.yaml:3:10: YAML syntax error: mapping values are not allowed")


def test_duplicate_key(tmp_path: Path) -> None:
    assert errors(tmp_path, "log_level: info\nlog_level: debug\n") == [
        "cfg.yaml:2:1: duplicate key 'log_level'"
    ]


def test_every_problem_is_reported_sorted_by_line(tmp_path: Path) -> None:
    text = "metrics:\n  per_lnk: false\nlisten: nowhere\npoll:\n  interval: 5 mins\n"
    lines = errors(tmp_path, text)
    assert lines == [
        "cfg.yaml:2:3: metrics: unknown key 'per_lnk' (did you mean 'per_link'?)",
        "cfg.yaml:3:9: listen: 'nowhere' is not an address of the form HOST:PORT",
        f"cfg.yaml:5:13: poll.interval: '5 mins' is not a duration {DURATION_HELP}",
    ]


# -- output and structure ------------------------------------------------------------------
def test_as_dict_round_trips(tmp_path: Path) -> None:
    cfg = load_config(None, must_exist=False, environ=NO_ENV)
    plain = cfg.as_dict()
    assert plain["listen"] == "127.0.0.1:9835"
    assert plain["backend"] == "nvml"
    assert plain["poll"] == {
        "interval": 5.0,
        "call_timeout": 2.0,
        "nvlink": True,
        "processes": True,
        "worker": True,
        "worker_hang_timeout": 30.0,
        "slow_interval": 120.0,
        "nvlink_counters_interval": 600.0,
        "state_interval": 15.0,
    }
    assert "source" not in plain
    path = write(tmp_path, yaml.safe_dump(plain))
    assert load_config(path, must_exist=True, environ=NO_ENV) == cfg


def test_as_plain_hides_secrets() -> None:
    @dataclasses.dataclass(frozen=True)
    class Receiver:
        name: str
        url: str | None = dataclasses.field(default=None, metadata={"secret": True})

    assert config.as_plain(Receiver("pager", "https://hooks.example/T0/abc")) == {
        "name": "pager",
        "url": config.SECRET_PLACEHOLDER,
    }
    assert config.as_plain(Receiver("pager")) == {"name": "pager", "url": None}


def test_section_table_matches_config_fields() -> None:
    fields = [f.name for f in dataclasses.fields(Config) if not f.metadata.get("internal")]
    assert list(config._ENTRIES) == fields


def test_backend_spec_parse() -> None:
    assert BackendSpec.parse("nvml") == BackendSpec("nvml")
    assert BackendSpec.parse("scenario:a.yaml") == BackendSpec("scenario", "a.yaml")
    assert BackendSpec.parse("scenario:a.yaml", "/etc/gw") == BackendSpec(
        "scenario", "/etc/gw/a.yaml"
    )
    assert str(BackendSpec("scenario", "/x.yaml")) == "scenario:/x.yaml"
    with pytest.raises(ValueError, match="not a backend"):
        BackendSpec.parse("dcgm")


# -- the shipped file and the docs stay in step with the schema -----------------------------
def test_shipped_config_equals_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUWATCHD_CONFIG_DIR")  # the shipped file names /etc/gpuwatchd
    cfg = load_config(str(SHIPPED), must_exist=True, environ=NO_ENV)
    assert cfg == load_config(None, must_exist=False, environ=NO_ENV)
    env = {"STATE_DIRECTORY": "/var/lib/private/gpuwatchd"}
    assert cfg.state_dir == "/var/lib/gpuwatchd"
    assert (
        load_config(str(SHIPPED), must_exist=True, environ=env).state_dir == env["STATE_DIRECTORY"]
    )


def test_shipped_config_shows_every_key(tmp_path: Path) -> None:
    text = SHIPPED.read_text(encoding="utf-8")
    for key in config.config_keys():
        leaf = key.rpartition(".")[2]
        assert re.search(rf"^\s*#?{leaf}:", text, re.MULTILINE), f"{key} missing from {SHIPPED}"
    # The commented-out examples are valid too.
    uncommented = re.sub(r"^#(\w+:)", r"\1", text, flags=re.MULTILINE)
    cfg = load_config(write(tmp_path, uncommented), must_exist=True, environ=NO_ENV)
    assert cfg.node_name == "gpu-node-01"


def test_docs_describe_every_key() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for key in config.config_keys():
        assert f"`{key}`" in text, f"{key} is not documented in {DOCS}"


def test_site_config_dir_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Site rules and the default config file come from $GPUWATCHD_CONFIG_DIR when set (the
    test suite points it away from the host's /etc/gpuwatchd), else /etc/gpuwatchd."""
    from gpuwatchd.config.paths import default_config_path, default_rule_files

    monkeypatch.setenv("GPUWATCHD_CONFIG_DIR", str(tmp_path))
    assert default_config_path() == str(tmp_path / "gpuwatchd.yaml")
    assert config.default_config({}).rules.files == (str(tmp_path / "rules.d" / "*.yaml"),)
    monkeypatch.delenv("GPUWATCHD_CONFIG_DIR")
    assert default_rule_files() == ("/etc/gpuwatchd/rules.d/*.yaml",)


# -- YAML 1.1 number traps and ranges (issue 15 items 9 and 10) ----------------------------
def test_leading_zero_numbers_are_refused(tmp_path: Path) -> None:
    """Failed on main: ``063`` silently overrode XID 51 (octal)."""
    assert errors(tmp_path, "xid:\n  overrides:\n    063: {severity: info}\n") == [
        "cfg.yaml:3:5: number '063' has a leading zero, which YAML 1.1 reads as octal "
        "(or as a string): write 63 for the number, or quote it for a string"
    ]
    assert errors(tmp_path, "gpus: {expected: 08}\n") == [
        "cfg.yaml:1:18: number '08' has a leading zero, which YAML 1.1 reads as octal "
        "(or as a string): write 8 for the number, or quote it for a string"
    ]
    (line,) = errors(tmp_path, "web: {rate_limit: 1:30}\n")
    assert "cfg.yaml:1:19: '1:30' is a base-60 number in YAML 1.1 (90)" in line
    # quoted, a leading zero is a string, and a string where a number belongs says so
    (line,) = errors(tmp_path, "gpus: {expected: '08'}\n")
    assert "gpus.expected: expected an integer, got string" in line


def test_override_keys_are_ascii_and_bounded(tmp_path: Path) -> None:
    """Failed on main: a fullwidth-digit key overrode XID 79; a 1000-digit key was taken."""
    for key in ("\uff17\uff19", "\u0667\u0669", "9" * 1000):
        (line,) = errors(tmp_path, f'xid:\n  overrides:\n    "{key}": {{severity: info}}\n')
        assert line.startswith("cfg.yaml:3:5: xid.overrides: "), line
        assert "is not an XID number (1 to 6 ASCII digits)" in line


def test_huge_numbers_and_durations_are_refused(tmp_path: Path) -> None:
    """Failed on main: ``poll.interval: 99999999999999999999w`` passed check-config and
    killed worker threads with OverflowError; a 5000-digit number raised ValueError."""
    (line,) = errors(tmp_path, "poll: {interval: 99999999999999999999w}\n")
    assert line.startswith("cfg.yaml:1:18: poll.interval: must be at most"), line
    (line,) = errors(tmp_path, "poll: {interval: 2h}\n")
    assert line == "cfg.yaml:1:18: poll.interval: must be at most 3600s, got '2h'"
    (line,) = errors(tmp_path, "sources: {backfill: 400d}\n")
    assert "sources.backfill: must be at most" in line
    (line,) = errors(tmp_path, "gpus: {expected: " + "9" * 5000 + "}\n")
    assert line == "cfg.yaml:1:18: number too long (5000 characters; at most 64)"
    (line,) = errors(tmp_path, "web: {max_request_bytes: 100000000000000000000}\n")
    assert "web.max_request_bytes: must be" in line
    (line,) = errors(tmp_path, "web: {rate_limit: 1.0e+300}\n")
    assert "web.rate_limit: must be between -2^53 and 2^53" in line


def test_nul_in_a_path_is_a_config_error(tmp_path: Path) -> None:
    """Issue 15 item 15, failed on main: ``state_dir: "/var/lib/x\\0y"`` gave a traceback."""
    assert errors(tmp_path, 'state_dir: "/var/lib/x\\0y"\n') == [
        "cfg.yaml:1:12: a NUL character (\\0) is not allowed in a value"
    ]
