"""``drain.fleet`` and the other drain keys added with it: read as documented, and bad
input answered with file, line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuwatchd.actions.drain.drivers.kubernetes import KubernetesDrainConfig
from gpuwatchd.actions.fleet import FleetDrain, correlated, counted, limit_for
from gpuwatchd.config.actions import FleetDrainConfig
from gpuwatchd.configfile.loader import ConfigError, load_config


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    return load_config(str(path), must_exist=True, environ={})


def errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return [line.removeprefix(str(tmp_path) + "/") for line in info.value.lines()]


def test_fleet_section_is_read(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """drain:
  mode: slurm
  hold_interval: 45s
  fleet: {max_nodes: 20, max_percent: 5, partition: gpu, window: 2h, recheck: 30s}
  kubernetes: {events: false, event_namespace: ops, budget_namespace: gpu-health}
""",
    )
    drain = cfg.drain  # type: ignore[attr-defined]
    assert drain.hold_interval == 45.0
    assert drain.fleet == FleetDrainConfig(
        max_nodes=20, max_percent=5.0, partition="gpu", window=7200.0, recheck=30.0
    )
    assert drain.fleet.enabled
    k = drain.section("kubernetes", KubernetesDrainConfig)
    assert (k.events, k.event_namespace, k.budget_namespace) == (False, "ops", "gpu-health")
    assert not load(tmp_path, "drain: {mode: slurm}\n").drain.fleet.enabled  # type: ignore[attr-defined]


def test_bad_fleet_values_name_file_line_and_key(tmp_path: Path) -> None:
    got = errors(
        tmp_path,
        """drain:
  mode: slurm
  fleet:
    max_nodes: 0
    max_percent: 120
    partition: "gpu; rm -rf /"
    selector: "a=b\\n"
    recheck: soon
    budget: 3
""",
    )
    text = "\n".join(got)
    assert "cfg.yaml:4:" in text and "drain.fleet.max_nodes: must be >= 1" in text
    assert "cfg.yaml:5:" in text and "drain.fleet.max_percent: must be <= 100" in text
    assert "cfg.yaml:6:" in text and "is not a Slurm partition name" in text
    assert "cfg.yaml:7:" in text and "is not a Kubernetes label selector" in text
    assert "cfg.yaml:8:" in text and "drain.fleet.recheck" in text
    assert "cfg.yaml:9:" in text and "budget" in text


def test_the_secure_setup_has_the_budget(tmp_path: Path) -> None:
    """Issue 28 item 4: drain.mode exec (the root drain helper, docs/install.md) with a
    fleet budget was refused (\"set drain.fleet.census: slurm\"); now it loads, counting with
    sinfo while the helper writes the claims."""
    cfg = load(
        tmp_path,
        """drain:
  mode: exec
  exec: {command: [/usr/bin/gpuwatchd, drain-helper, request]}
  fleet: {max_nodes: 3}
""",
    )
    assert cfg.drain.fleet.census == "slurm"  # type: ignore[attr-defined]
    # with exec, the daemon counts with sinfo (issue 26: the root drain helper drains)
    ok = """drain:
  mode: exec
  exec: {command: [/bin/true]}
  fleet: {max_nodes: 3, census: slurm}
"""
    assert load(tmp_path, ok).drain.fleet.census == "slurm"  # type: ignore[attr-defined]
    got = errors(tmp_path, ok.replace("exec: {command: [/bin/true]}", "").replace("exec", "slurm"))
    assert any("drain.fleet.census: only for drain.mode exec" in line for line in got), got
    got = errors(tmp_path, ok.replace("census: slurm", "census: pbs"))
    assert any("drain.fleet.census: 'pbs' is not one of: slurm" in line for line in got), got


def test_limit_and_order() -> None:
    assert limit_for(FleetDrainConfig(max_nodes=5), 51) == 5
    assert limit_for(FleetDrainConfig(max_percent=10), 51) == 5
    assert limit_for(FleetDrainConfig(max_percent=10), 5) == 1  # never below one
    assert limit_for(FleetDrainConfig(max_nodes=3, max_percent=50), 100) == 3
    cfg = FleetDrainConfig(max_nodes=2, window=600.0)
    drains = [
        FleetDrain("b", 1000.0, "gpuwatchd: XID 79 GPU 1"),
        FleetDrain("a", 1000.0, "gpuwatchd: XID 79 GPU 0"),
        FleetDrain("c", 999.0, "gpuwatchd: XID 48 GPU 2"),
        FleetDrain("old", 10.0, "gpuwatchd: XID 79 GPU 2"),  # outside the window
    ]
    assert [d.node for d in counted(drains, cfg, 1200.0)] == ["c", "a", "b"]
    assert correlated(drains, cfg, 1200.0) == []
    assert correlated(drains, cfg, 1200.0, ["d|79"]) == [("79", 3)]
