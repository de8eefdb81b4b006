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


SampleResult = Callable[[], GpuSample]  # returns the sample or raises what ``sample`` would


@runtime_checkable
class AsyncSampler(Protocol):
    """Backends that can take a poll without a thread waiting on it (the NVML worker: the
    request is one pipe write and the answer comes on its reader thread). ``done`` is
    called once, from another thread, with a function that returns the sample or raises
    as ``sample`` would; a poll that never answers never calls it (the poller's
    ``call_timeout`` still marks the GPU stale)."""

    def sample_async(self, index: int, done: Callable[[SampleResult], None]) -> None: ...


RoundResult = dict[int, SampleResult]  # one poll round: GPU index -> its result


@runtime_checkable
class RoundSampler(Protocol):
    """Backends that own the poll cadence (the NVML worker: it reads every GPU each
    ``interval_s`` and sends one frame per round). ``done`` is called from another thread
    once per round with a result for each GPU in it; a GPU stuck in a call past
    ``call_timeout_s`` is in it with a result that raises ``CallTimeout``; a dead worker
    gives one round of results that raise. A GPU missing from rounds for longer than the
    poller allows is marked stale by the poller. Calling it again changes the cadence."""

    def start_rounds(
        self, interval_s: float, call_timeout_s: float, done: Callable[[RoundResult], None]
    ) -> None: ...


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
