"""Every drain driver kind (``drain.mode``), by mode.

Adding one: write ``drivers/<name>.py`` (its ``Driver`` and a ``KIND`` with ``mode`` and
``build``; see ``base.DriverKind``) and add its ``KIND`` here. ``none`` is no driver: the
drain stage is not built at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.actions.drain.drivers import command, kubernetes, slurm
from gpuwatchd.actions.drain.drivers.base import DrainError, Driver, DriverKind
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.clock import Clock

KINDS: tuple[DriverKind, ...] = (command.KIND, slurm.KIND, kubernetes.KIND)

BY_MODE: Mapping[str, DriverKind] = MappingProxyType({k.mode: k for k in KINDS})


def build_driver(cfg: DrainConfig, node: str, clock: Clock) -> Driver:
    """The driver ``drain.mode`` names (``DrainError`` when it cannot be made)."""
    kind = BY_MODE.get(cfg.mode)
    if kind is None:
        raise DrainError(f"drain.mode {cfg.mode!r} has no driver")
    return kind.build(cfg, node, clock)
