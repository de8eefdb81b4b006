"""Polls every GPU on its own worker thread, so one slow or lost GPU never delays another.

NVML calls cannot be cancelled from Python, so the time bound is enforced around them:
each GPU has one worker thread; the scheduler hands it a poll at every interval only when
it is idle. A backend that answers asynchronously (``AsyncSampler``: the NVML worker
process, whose own per-GPU threads make the calls) gets the polls directly from the
scheduler, and its answers are stored on the thread that receives them: no thread here
waits on a GPU. A backend that owns the cadence (``RoundSampler``: the NVML worker reads
every GPU each interval and sends one frame per round) is told the interval once, and
each round is stored on the thread that receives it. The worker itself names a GPU stuck
in a call past ``call_timeout`` (the poller marks it stale); the scheduler then only wakes
to mark a GPU stale whose sample is late (none for ``interval + 3 x call_timeout``: a
wedged worker) and to keep the liveness count moving while no round comes. Otherwise, a
worker thread whose poll has not returned after ``call_timeout`` marks its GPU stale
(and is not given new work until the stuck call returns). Scrapes read the
``NodeState`` and never wait for a worker.

``poll_once_sync`` runs the same logic inline for ``simulate`` on a virtual clock, where a
stall is signalled by the backend raising ``CallTimeout``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendError, CallTimeout, GpuLost, ResetRequired
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import (
    DeviceEvent,
    DeviceEventKind,
    GpuInfo,
    GpuSample,
    GpuStatus,
    XidEvent,
)
from gpuwatchd.sources.gpu.backend import (
    AsyncSampler,
    Backend,
    RoundResult,
    RoundSampler,
    SampleResult,
)

log = logging.getLogger(__name__)

Record = GpuSample | DeviceEvent | XidEvent
Emit = Callable[[Record], None]

_TRANSITIONS: dict[GpuStatus, DeviceEventKind] = {
    GpuStatus.LOST: DeviceEventKind.LOST,
    GpuStatus.STALE: DeviceEventKind.STALE,
    GpuStatus.ERROR: DeviceEventKind.ERROR,
}


def _failed_sample(info: GpuInfo, now: float, status: GpuStatus, error: str) -> GpuSample:
    return GpuSample(gpu=info.index, uuid=info.uuid, timestamp=now, status=status, error=error)


def poll_gpu(backend: Backend, info: GpuInfo, clock: Clock) -> GpuSample:
    """One poll of one GPU, with every backend failure turned into a sample status."""
    return _guarded(lambda: backend.sample(info.index), info, clock)


def _guarded(result: SampleResult, info: GpuInfo, clock: Clock) -> GpuSample:
    """``result()``, with every backend failure turned into a sample status."""
    try:
        return result()
    except GpuLost as exc:
        return _failed_sample(info, clock.now(), GpuStatus.LOST, str(exc) or "GPU is lost")
    except CallTimeout as exc:
        return _failed_sample(info, clock.now(), GpuStatus.STALE, str(exc) or "call timed out")
    except ResetRequired as exc:
        return _failed_sample(info, clock.now(), GpuStatus.ERROR, f"reset required: {exc}")
    except BackendError as exc:
        return _failed_sample(info, clock.now(), GpuStatus.ERROR, str(exc))
    except Exception as exc:  # a bug in one GPU's path must not stop the others
        log.exception("unexpected error polling GPU %d", info.index)
        return _failed_sample(info, clock.now(), GpuStatus.ERROR, f"internal error: {exc!r}")


def _device_event(info: GpuInfo, kind: DeviceEventKind, now: float, detail: str) -> DeviceEvent:
    return DeviceEvent(kind, info.index, info.uuid, info.pci_bus_id, now, detail)


@dataclass
class _Worker:
    info: GpuInfo
    go: threading.Event
    thread: threading.Thread | None = None
    busy_since: float | None = None  # monotonic, clock's seconds
    stale_reported: bool = False
    ok: bool = True  # its last poll answered (or none has ended yet)
    last_duration: float | None = None  # of its last poll, when that answered


class Poller:
    def __init__(
        self,
        backend: Backend,
        infos: list[GpuInfo],
        state: NodeState,
        clock: Clock,
        interval: float,
        call_timeout: float,
        emit: Emit | None = None,
    ) -> None:
        self.backend = backend
        self.infos = infos
        self.state = state
        self.clock = clock
        self.interval = interval
        self.call_timeout = call_timeout
        self.emit: Emit = emit or (lambda record: None)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._workers = {i.index: _Worker(i, threading.Event()) for i in infos}
        self._scheduler: threading.Thread | None = None
        self._async: AsyncSampler | None = None  # set by start() for such a backend
        self._rounds: RoundSampler | None = None  # likewise
        # how long past its due time a GPU's sample may be before it is stale; with rounds,
        # the worker reports a stuck GPU itself at call_timeout, this is the backstop
        self._late_after = call_timeout
        self.cycles = 0  # completed scheduler ticks (a liveness signal for the watchdog)

    # -- shared bookkeeping ------------------------------------------------------------
    def _store(self, info: GpuInfo, sample: GpuSample) -> None:
        previous = self.state.record_sample(sample)
        self.emit(sample)
        if previous is None:
            return
        now = sample.timestamp
        if sample.status is GpuStatus.OK:
            kind = (
                DeviceEventKind.RECOVERED
                if previous is not GpuStatus.STALE
                else (DeviceEventKind.FRESH)
            )
            self.emit(_device_event(info, kind, now, f"was {previous.value}"))
        else:
            self.emit(_device_event(info, _TRANSITIONS[sample.status], now, sample.error or ""))
        log.log(
            logging.INFO if sample.status is GpuStatus.OK else logging.WARNING,
            "GPU %d %s: %s -> %s %s",
            info.index,
            info.pci_bus_id,
            previous.value,
            sample.status.value,
            sample.error or "",
        )

    def _source_health(self, durations: list[float], answered: int | None = None) -> None:
        now = self.clock.now()
        total = len(self.infos)
        if answered is None:
            answered = sum(1 for g in self.state.view().gpus if g.status is GpuStatus.OK)
        self.state.source(
            "nvml",
            up=answered > 0 or not total,
            now=now,
            duration=max(durations) if durations else None,
            detail=f"{answered}/{total} GPUs answering",
        )

    # -- synchronous (simulate) ------------------------------------------------------
    def poll_once_sync(self) -> None:
        durations = []
        answered = 0
        for info in self.infos:
            sample = poll_gpu(self.backend, info, self.clock)
            durations.append(sample.duration_seconds)
            answered += sample.status is GpuStatus.OK
            self._store(info, sample)
        self.cycles += 1
        self._source_health(durations, answered)

    # -- threaded (run, demo) --------------------------------------------------------
    def start(self) -> None:
        if isinstance(self.backend, RoundSampler):
            self._start_rounds(self.backend)
            return
        if isinstance(self.backend, AsyncSampler):
            self._async = self.backend  # answers arrive on the backend's own thread
        for worker in self._workers.values():
            if self._async is not None:
                continue
            worker.thread = threading.Thread(
                target=self._work,
                args=(worker,),
                name=f"poll-gpu{worker.info.index}",
                daemon=True,
            )
            worker.thread.start()
        self._scheduler = threading.Thread(
            target=self._schedule, name="poll-scheduler", daemon=True
        )
        self._scheduler.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        for worker in self._workers.values():
            worker.go.set()
        if self._scheduler is not None:
            self._scheduler.join(timeout)
        for worker in self._workers.values():
            if worker.thread is not None:
                worker.thread.join(timeout=0.2)  # a thread stuck in NVML is left behind

    def _work(self, worker: _Worker) -> None:
        while True:
            worker.go.wait()
            worker.go.clear()
            if self._stop.is_set():
                return
            self._answered(worker, poll_gpu(self.backend, worker.info, self.clock))

    def _answered(self, worker: _Worker, sample: GpuSample) -> None:
        if self._stop.is_set():
            return
        with self._lock:
            worker.busy_since = None
            worker.stale_reported = False
            worker.ok = sample.status is GpuStatus.OK
            worker.last_duration = sample.duration_seconds if worker.ok else None
        self._store(worker.info, sample)

    def _dispatch(self, worker: _Worker) -> None:
        """Start one poll: wake the GPU's thread, or hand it to an ``AsyncSampler``."""
        if self._async is None:
            worker.go.set()
            return
        info = worker.info

        def done(result: SampleResult) -> None:
            self._answered(worker, _guarded(result, info, self.clock))

        self._async.sample_async(info.index, done)

    def _schedule(self) -> None:
        next_tick = self.clock.monotonic()
        while not self._stop.is_set():
            now_m = self.clock.monotonic()
            if now_m >= next_tick:
                self._tick(now_m)
                next_tick += self.interval
                if next_tick < now_m:  # fell behind (suspend, overload): don't burst
                    next_tick = now_m + self.interval
            deadline = next_tick
            with self._lock:
                for worker in self._workers.values():
                    if worker.busy_since is not None and not worker.stale_reported:
                        deadline = min(deadline, worker.busy_since + self.call_timeout)
            self._check_stale(self.clock.monotonic())
            self.clock.wait(self._wake, max(0.0, deadline - self.clock.monotonic()))
            self._wake.clear()

    def _tick(self, now_m: float) -> None:
        starting = []
        with self._lock:
            for worker in self._workers.values():
                if worker.busy_since is None:
                    worker.busy_since = now_m
                    starting.append(worker)
            answered = sum(w.ok for w in self._workers.values())
            durations = [
                w.last_duration for w in self._workers.values() if w.last_duration is not None
            ]
        for worker in starting:
            self._dispatch(worker)
        self.cycles += 1
        self._source_health(durations, answered)

    def _check_stale(self, now_m: float) -> None:
        stale: list[_Worker] = []
        with self._lock:
            for worker in self._workers.values():
                if (
                    worker.busy_since is not None
                    and not worker.stale_reported
                    and now_m - worker.busy_since >= self._late_after
                ):
                    worker.stale_reported = True
                    worker.ok = False
                    worker.last_duration = None
                    stale.append(worker)
        now = self.clock.now()
        for worker in stale:
            detail = f"poll has not returned after {self._late_after:g}s"
            if self.state.set_status(worker.info.index, GpuStatus.STALE, now) is not None:
                self.emit(_device_event(worker.info, DeviceEventKind.STALE, now, detail))
                log.warning(
                    "GPU %d %s is stale: %s", worker.info.index, worker.info.pci_bus_id, detail
                )

    # -- rounds: the backend owns the cadence --------------------------------------------
    def _start_rounds(self, backend: RoundSampler) -> None:
        self._rounds = backend
        self._late_after = 3 * self.call_timeout
        now_m = self.clock.monotonic()
        with self._lock:
            for worker in self._workers.values():
                worker.busy_since = now_m  # the first round is due now
        backend.start_rounds(self.interval, self.call_timeout, self._round)
        self._scheduler = threading.Thread(
            target=self._watch_rounds, name="poll-scheduler", daemon=True
        )
        self._scheduler.start()

    def _round(self, results: RoundResult) -> None:
        """One round from the backend (on its thread): store every GPU's sample."""
        if self._stop.is_set():
            return
        for index, result in results.items():
            worker = self._workers.get(index)
            if worker is None:
                continue
            self._answered(worker, _guarded(result, worker.info, self.clock))
        now_m = self.clock.monotonic()
        with self._lock:
            for index in results:
                worker = self._workers.get(index)
                if worker is not None:
                    worker.busy_since = now_m + self.interval  # when the next is due
            answered = sum(w.ok for w in self._workers.values())
            durations = [
                w.last_duration for w in self._workers.values() if w.last_duration is not None
            ]
        self.cycles += 1
        self._source_health(durations, answered)

    def _watch_rounds(self) -> None:
        """Wake only when a GPU's sample is late, and every two intervals: if no round came
        since (a dead or restarting worker), the liveness count and the source health
        still move. A round arriving on time wakes nothing here."""
        seen = self.cycles
        idle_until = self.clock.monotonic() + 2 * self.interval
        while not self._stop.is_set():
            now_m = self.clock.monotonic()
            if now_m >= idle_until:
                if self.cycles == seen:  # no round for two intervals
                    self.cycles += 1
                    self._source_health([])
                seen = self.cycles
                idle_until = now_m + 2 * self.interval
            self._check_stale(now_m)
            deadline = idle_until
            with self._lock:
                for worker in self._workers.values():
                    if worker.busy_since is not None and not worker.stale_reported:
                        deadline = min(deadline, worker.busy_since + self._late_after)
            self.clock.wait(self._wake, max(0.0, deadline - self.clock.monotonic()))
            self._wake.clear()
