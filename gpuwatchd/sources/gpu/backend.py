"""The NVML seam: what the poller asks of a GPU backend.

Two implementations ship: ``nvml`` (real GPUs through nvidia-ml-py) and ``scenario``
(a scripted timeline, for tests, ``simulate``, ``demo`` and drills). Both are selected
through ``gpuwatchd.service.backends.open_backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from gpuwatchd.core.families import Families
from gpuwatchd.core.records import GpuInfo, GpuSample, XidEvent


class Backend(Protocol):
    """A source of GPU samples.

    ``open`` initialises and reads the static facts of every GPU. ``sample`` polls one GPU
    and returns what it answered; a field that fails alone is left out of
    ``GpuSample.fields`` (and remembered when NOT_SUPPORTED). A failure of the whole GPU
    raises ``GpuLost``, ``ResetRequired`` or ``BackendError``; a stalled call simply does
    not return, and the poller, not the backend, bounds it in time. ``sample`` must be
    safe to call from one thread per GPU at the same time.
    """

    name: str

    def open(self) -> list[GpuInfo]: ...

    def sample(self, index: int) -> GpuSample: ...

    def close(self) -> None: ...


@runtime_checkable
class XidEventSource(Protocol):
    """Backends that can deliver NVML XID events (``nvmlEventSetWait``)."""

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]: ...


@runtime_checkable
class SupervisedBackend(Protocol):
    """Backends that run in a supervised worker process (``sources.gpu.worker``): they
    report the worker's state as a source, render its metrics and show in ``status``."""

    def set_status(self, status: Callable[[str, bool, str], None]) -> None: ...

    def families(self, fams: Families) -> None: ...

    def health(self) -> dict[str, Any]: ...


BackendFactory = Callable[[], Backend]
