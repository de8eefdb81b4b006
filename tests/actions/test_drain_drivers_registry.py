"""Issue 24 item 3: one module per drain driver under ``actions/drain/drivers/`` and a
registry by ``drain.mode``, as rule conditions have; the sink builds its driver through the
registry, not an if-chain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from actions_support import make_config

from gpuwatchd.actions.drain.drivers.base import DrainError
from gpuwatchd.actions.drain.drivers.command import ExecDriver
from gpuwatchd.actions.drain.drivers.registry import BY_MODE, KINDS, build_driver
from gpuwatchd.actions.drain.drivers.slurm import SlurmDriver
from gpuwatchd.config.actions import DRAIN_MODES
from gpuwatchd.core.clock import VirtualClock


def test_every_drain_mode_but_none_has_one_driver_kind() -> None:
    assert sorted(BY_MODE) == sorted(m for m in DRAIN_MODES if m != "none")
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
        config.drain, mode="exec", exec=dataclasses.replace(config.drain.exec, command=("/x",))
    )
    driver = build_driver(exec_cfg, "gpu-17", clock)
    assert isinstance(driver, ExecDriver) and driver.command == ["/x"]
    assert driver.sinfo == "/opt/slurm/bin/sinfo"
    with pytest.raises(DrainError, match=r"drain\.mode 'none' has no driver"):
        build_driver(dataclasses.replace(config.drain, mode="none"), "gpu-17", clock)
