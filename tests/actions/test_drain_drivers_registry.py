"""Issue 24 item 3: one module per drain driver under ``actions/drain/drivers/`` and a
registry by ``drain.mode``, as rule conditions have; the sink builds its driver through the
registry, not an if-chain."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from actions_support import make_config

from gpuwatchd.actions.drain.drivers.base import DrainError
from gpuwatchd.actions.drain.drivers.command import ExecDrainConfig, ExecDriver
from gpuwatchd.actions.drain.drivers.registry import BY_MODE, KINDS, READERS, build_driver
from gpuwatchd.actions.drain.drivers.slurm import SlurmDrainConfig, SlurmDriver
from gpuwatchd.config import yamlsrc
from gpuwatchd.config.actions import (
    DriverSection,
    DriverSectionReader,
    read_drain,
    read_driver_section,
    read_program,
)
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.errors import ConfigError


def test_every_drain_mode_but_none_has_one_driver_kind() -> None:
    assert sorted(BY_MODE) == sorted(READERS) == ["exec", "kubernetes", "slurm"]
    assert len(KINDS) == len(BY_MODE)


def test_the_registry_builds_the_configured_driver(tmp_path: Path) -> None:
    config = make_config(
        tmp_path,
        """drain:
  mode: slurm
  timeout: 7s
  slurm: {scontrol: /opt/slurm/bin/scontrol, sinfo: /opt/slurm/bin/sinfo}
""",
    )
    clock = VirtualClock()
    driver = build_driver(config.drain, "gpu-17", clock)
    assert isinstance(driver, SlurmDriver)
    assert (driver.node, driver.timeout, driver.scontrol, driver.sinfo) == (
        "gpu-17",
        7.0,
        "/opt/slurm/bin/scontrol",
        "/opt/slurm/bin/sinfo",
    )
    exec_cfg = dataclasses.replace(
        config.drain,
        mode="exec",
        drivers={**config.drain.drivers, "exec": ExecDrainConfig(command=("/x",))},
    )
    driver = build_driver(exec_cfg, "gpu-17", clock)
    assert isinstance(driver, ExecDriver) and driver.command == ["/x"]
    assert driver.sinfo == "/opt/slurm/bin/sinfo"
    with pytest.raises(DrainError, match=r"drain\.mode 'none' has no driver"):
        build_driver(dataclasses.replace(config.drain, mode="none"), "gpu-17", clock)


@dataclasses.dataclass(frozen=True)
class _PbsSection(DriverSection):
    pbsnodes: str = "pbsnodes"


def _read_pbs(r: Reader, node: Node, what: str) -> _PbsSection:
    def value(r: Reader, key: str, node: Node, where: str) -> Any:
        return read_program(r, node, where)

    return read_driver_section(r, node, _PbsSection, what, value)


def test_a_new_driver_section_is_read_through_its_reader_alone() -> None:
    """Adding a driver = its module and a registry line: ``config/`` learns its mode and its
    section ``drain.<mode>`` from the readers it is handed, and reports its bad values at
    their file, line and key."""
    readers = {**READERS, "pbs": DriverSectionReader(_PbsSection, _read_pbs)}
    r = Reader()
    text = "mode: pbs\npbs: {pbsnodes: /opt/pbs/bin/pbsnodes}\n"
    drain = read_drain(r, yamlsrc.parse(text, "cfg.yaml"), readers)
    r.raise_if_any()
    assert drain.mode == "pbs"
    assert drain.section("pbs", _PbsSection).pbsnodes == "/opt/pbs/bin/pbsnodes"
    assert drain.section("slurm", SlurmDrainConfig) == SlurmDrainConfig()
    bad = Reader()
    text = "mode: pbs\npbs: {pbsnodes: 'sudo pbsnodes'}\n"
    read_drain(bad, yamlsrc.parse(text, "c.yaml"), readers)
    with pytest.raises(ConfigError, match=r"c\.yaml:2:17: drain\.pbs\.pbsnodes: 'sudo pbsnodes' "):
        bad.raise_if_any()
    unknown = Reader()
    read_drain(unknown, yamlsrc.parse("mode: pbs\n", "c.yaml"), READERS)
    with pytest.raises(ConfigError, match=r"c\.yaml:1:7: drain\.mode: 'pbs' is not one of"):
        unknown.raise_if_any()
