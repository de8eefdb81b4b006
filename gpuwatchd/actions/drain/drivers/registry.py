"""Every drain driver kind (``drain.mode``), by mode.

Adding one: write ``drivers/<name>.py`` (its ``Driver``, its own section ``drain.<mode>``
as a ``DriverSection`` subclass with its reader, and a ``KIND`` with ``mode``, ``reader``
and ``build``; see ``base.DriverKind``) and add its ``KIND`` here. The config loader
(``configfile/loader.py``, above every stage) reads ``drain`` through ``READERS``, so the
new mode and its section are accepted with no other change. ``none`` is no driver: the
drain stage is not built at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.actions.drain.drivers import command, kubernetes, slurm
from gpuwatchd.actions.drain.drivers.base import DrainError, Driver, DriverKind
from gpuwatchd.config.actions import DrainConfig, DriverSectionReader
from gpuwatchd.core.clock import Clock

KINDS: tuple[DriverKind, ...] = (command.KIND, slurm.KIND, kubernetes.KIND)

BY_MODE: Mapping[str, DriverKind] = MappingProxyType({k.mode: k for k in KINDS})
READERS: Mapping[str, DriverSectionReader] = MappingProxyType({k.mode: k.reader for k in KINDS})


def build_driver(cfg: DrainConfig, node: str, clock: Clock) -> Driver:
    """The driver ``drain.mode`` names (``DrainError`` when it cannot be made)."""
    kind = BY_MODE.get(cfg.mode)
    if kind is None:
        raise DrainError(f"drain.mode {cfg.mode!r} has no driver")
    return kind.build(cfg, node, clock)
