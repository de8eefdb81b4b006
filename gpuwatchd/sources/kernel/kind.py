"""What a kernel-log source kind is: one module per kind (``journald``, ``kmsg``,
``scenario``), each ending in a ``KIND`` that ``registry.KINDS`` lists.

A kind reads its own keys of the ``sources`` section (``section``, their type, and
``options``, their readers: the config loader asks the registry for them, so their errors
name file, line and key like every other) and says
whether it can serve this host (``available``: for ``sources.kernel_log:
auto``, tried in the registry's order) and builds its reader (``build``) from a
``KernelLogSetup``: the trusted-line handler it feeds, the clock, the ``sources`` section,
where its resume position lives and how it reports its health. A reader starts and stops
its own thread; one that resumes from a saved position exposes it as ``position`` and
beats a ``heartbeat`` the daemon watches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpuwatchd.config.sections import KindSection, SourceOptionReader, SourcesConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.heartbeat import Heartbeat
from gpuwatchd.sources.kernel.cursor import PositionFile
from gpuwatchd.sources.kernel.linehandler import KernelLineHandler

StatusFn = Callable[[bool, str], None]  # (up, detail)


class KernelLogReader(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self) -> None: ...


@runtime_checkable
class FollowingReader(Protocol):
    """A reader that follows a live log: it resumes from a saved position and beats a
    heartbeat once per turn of its read loop."""

    position: PositionFile
    heartbeat: Heartbeat | None

    def start(self) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class KernelLogSetup:
    handler: KernelLineHandler
    clock: Clock
    sources: SourcesConfig
    backend: object  # the GPU backend (the scenario backend scripts kernel-log lines)
    position_path: Callable[[str], str | None]  # a file name -> its path (None: memory)
    status: StatusFn


@dataclass(frozen=True)
class KernelLogKind:
    name: str
    available: Callable[[SourcesConfig, object], bool]  # (sources, backend)
    build: Callable[[KernelLogSetup], KernelLogReader]
    # its own keys of the ``sources`` section: their type (``SourcesConfig.section(name,
    # section)`` gives them) and each key's reader (``journal_dir``)
    section: type[KindSection] = KindSection
    options: Mapping[str, SourceOptionReader] = field(default_factory=dict)
    # its lines are scripted, there from the start: the XID merger expects a kernel line
    # for every NVML event at once, before the reader reports itself up
    scripted: bool = False
