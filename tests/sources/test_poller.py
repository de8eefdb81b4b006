"""The poller keeps every healthy GPU fresh while one is lost or stalled."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

from gpuwatchd.configfile.loader import default_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import DeviceEvent, DeviceEventKind, GpuInfo, GpuStatus
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.sources.gpu.backend import RoundResult, SampleResult
from gpuwatchd.sources.gpu.poller import Poller, Record
from gpuwatchd.testing.fake_backend import FakeBackend


def _poller(
    backend: FakeBackend, interval: float, timeout: float, records: list[Record]
) -> tuple[Poller, NodeState]:
    clock = SystemClock()
    state = NodeState("n1", clock.now())
    infos = backend.open()
    state.set_gpus(infos, clock.now())
    return Poller(backend, infos, state, clock, interval, timeout, records.append), state


def _events(records: list[Record]) -> list[tuple[DeviceEventKind, int]]:
    return [(r.kind, r.gpu) for r in records if isinstance(r, DeviceEvent)]


def test_lost_gpu_is_a_record_and_others_keep_reporting() -> None:
    backend = FakeBackend(count=8)
    records: list[Record] = []
    poller, state = _poller(backend, 1.0, 1.0, records)
    poller.poll_once_sync()
    backend.lost.add(3)
    poller.poll_once_sync()
    poller.poll_once_sync()
    view = state.view()
    assert [g.status for g in view.gpus].count(GpuStatus.OK) == 7
    assert view.gpus[3].status is GpuStatus.LOST
    assert all(g.polls == 3 for g in view.gpus)
    backend.lost.discard(3)
    poller.poll_once_sync()
    assert _events(records) == [(DeviceEventKind.LOST, 3), (DeviceEventKind.RECOVERED, 3)]
    assert state.view().gpus[3].status is GpuStatus.OK


def _until(what: str, check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_stalled_gpu_goes_stale_without_delaying_the_others() -> None:
    backend = FakeBackend(count=8)
    records: list[Record] = []
    poller, state = _poller(backend, 0.1, 0.15, records)
    gate = backend.block(5)
    poller.start()
    try:
        _until("GPU 5 stale", lambda: state.view().gpus[5].status is GpuStatus.STALE)
        view = state.view()
        stale_event = next(
            r for r in records if isinstance(r, DeviceEvent) and r.kind is DeviceEventKind.STALE
        )
        # stale from the stalled call's deadline (interval + call timeout), not from a later
        # round; the bound is generous so a loaded machine's scheduling cannot fail it
        assert stale_event.timestamp - view.started_at < 0.1 + 0.15 + 1.0
        # the other seven keep polling at their interval while GPU 5 hangs
        first = {g.info.index: g.polls for g in view.gpus}
        _until(
            "the other GPUs polling on",
            lambda: all(
                g.polls >= first[g.info.index] + 3 and g.status is GpuStatus.OK
                for g in state.view().gpus
                if g.info.index != 5
            ),
        )
        assert state.view().gpus[5].status is GpuStatus.STALE
        assert backend.calls[5] == 1  # a stuck GPU is not given more work
        gate.set()
        _until("GPU 5 fresh again", lambda: state.view().gpus[5].status is GpuStatus.OK)
        assert (DeviceEventKind.FRESH, 5) in _events(records)
    finally:
        poller.stop()


def test_scrapes_answer_fast_while_a_gpu_hangs() -> None:
    import dataclasses

    config = default_config()
    config = dataclasses.replace(
        config, poll=dataclasses.replace(config.poll, interval=0.1, call_timeout=0.2)
    )
    backend = FakeBackend(count=8)
    gate = backend.block(2)
    daemon = Daemon(config, backend, SystemClock(), listen=("127.0.0.1", 0))
    daemon.start()
    try:
        assert daemon.http is not None
        url = daemon.http.url
        time.sleep(0.4)
        worst = 0.0
        for _ in range(30):
            start = time.perf_counter()
            with urllib.request.urlopen(url + "/metrics", timeout=2) as resp:
                body = resp.read().decode()
            worst = max(worst, time.perf_counter() - start)
        # GPU 2 never answers: a scrape that waited for it would time out (2 s)
        assert worst < 1.0, f"slowest scrape {worst * 1000:.1f} ms"
        assert 'gpuwatchd_gpu_status{gpu="2",' in body
        assert 'status="stale"} 1.0' in body
        with urllib.request.urlopen(url + "/healthz", timeout=2) as resp:
            assert resp.status == 200
            assert "2:stale" in resp.read().decode()
    finally:
        gate.set()
        daemon.stop()


def test_backend_that_fails_to_open_is_retried_and_polling_starts() -> None:
    """No driver at start (or mid-upgrade): the daemon serves, reports nvml down, and starts
    polling once the backend opens."""
    import dataclasses

    from gpuwatchd.core.clock import ScaledClock
    from gpuwatchd.core.errors import BackendUnavailable

    class LateDriver(FakeBackend):
        attempts = 0

        def open(self) -> list[GpuInfo]:
            self.attempts += 1
            if self.attempts < 3:
                raise BackendUnavailable("NVML unavailable: driver not loaded (test)")
            return super().open()

    config = default_config()
    config = dataclasses.replace(
        config, poll=dataclasses.replace(config.poll, interval=5.0, call_timeout=2.0)
    )
    clock = ScaledClock(300.0)  # the 30 s retry period passes in 0.1 s
    backend = LateDriver(count=2, clock=clock)
    daemon = Daemon(config, backend, clock, listen=("127.0.0.1", 0))
    daemon.start()
    try:
        assert daemon.poller is None
        assert daemon.state.view().sources["nvml"].up is False
        deadline = time.monotonic() + 5
        while not (
            daemon.poller is not None
            and daemon.state.view().gpus
            and all(g.polls for g in daemon.state.view().gpus)
        ):
            assert time.monotonic() < deadline, "polling never started"
            time.sleep(0.02)
        assert backend.attempts == 3
        assert daemon.state.view().sources["nvml"].up is True
    finally:
        daemon.stop()


class _AsyncBackend(FakeBackend):
    """An ``AsyncSampler``: polls are queued and answered when the test says so, as the
    NVML worker's reader thread answers them."""

    def __init__(self, count: int) -> None:
        super().__init__(count=count)
        self.asked: list[tuple[int, Callable[[SampleResult], None]]] = []
        self.asked_lock = threading.Lock()

    def sample_async(self, index: int, done: Callable[[SampleResult], None]) -> None:
        with self.asked_lock:
            self.asked.append((index, done))

    def answer(self, skip: int | None = None) -> int:
        with self.asked_lock:
            asked, self.asked = self.asked, []
        for index, done in asked:
            if index == skip:
                continue
            done(lambda index=index: self.sample(index))  # type: ignore[misc]
        return len(asked)


def test_an_async_backend_is_polled_without_gpu_threads_and_a_silent_gpu_goes_stale() -> None:
    backend = _AsyncBackend(count=3)
    records: list[Record] = []
    poller, state = _poller(backend, 0.2, 0.3, records)
    poller.start()
    try:
        assert not [t for t in threading.enumerate() if t.name.startswith("poll-gpu")]
        deadline = time.monotonic() + 20
        while min(g.polls for g in state.view().gpus) < 3:  # answered on "our" thread
            assert time.monotonic() < deadline, "async answers never stored"
            backend.answer()
            time.sleep(0.05)
        while state.view().gpus[1].status is not GpuStatus.STALE:  # GPU 1 stops answering
            assert time.monotonic() < deadline, "a GPU that never answers is not stale"
            backend.answer(skip=1)
            time.sleep(0.05)
        first = state.view().gpus[0].polls
        while state.view().gpus[0].polls < first + 3:  # the others go on
            assert time.monotonic() < deadline, "the answering GPUs stopped with GPU 1"
            backend.answer(skip=1)
            time.sleep(0.05)
        assert (DeviceEventKind.STALE, 1) in _events(records)
        assert state.view().gpus[0].status is GpuStatus.OK
    finally:
        poller.stop()


class _RoundBackend(FakeBackend):
    """A ``RoundSampler``: the test hands over rounds, as the NVML worker's reader thread
    does; the poller only gets the cadence."""

    def __init__(self, count: int) -> None:
        super().__init__(count=count)
        self.cadence: tuple[float, float] | None = None
        self.done: Callable[[RoundResult], None] | None = None

    def start_rounds(
        self, interval_s: float, call_timeout_s: float, done: Callable[[RoundResult], None]
    ) -> None:
        self.cadence = (interval_s, call_timeout_s)
        self.done = done

    def round(self, skip: int | None = None) -> None:
        assert self.done is not None
        self.done(
            {
                i: (lambda i=i: self.sample(i))  # type: ignore[misc]
                for i in range(len(self.infos))
                if i != skip
            }
        )


def test_a_round_backend_owns_the_cadence_and_a_gpu_missing_from_rounds_goes_stale() -> None:
    backend = _RoundBackend(count=3)
    records: list[Record] = []
    poller, state = _poller(backend, 0.2, 0.3, records)
    poller.start()
    try:
        assert backend.cadence == (0.2, 0.3)  # told once, at start
        assert not [t for t in threading.enumerate() if t.name.startswith("poll-gpu")]
        cycles = poller.cycles
        backend.round()
        assert [g.polls for g in state.view().gpus] == [1, 1, 1]  # stored on "our" thread
        assert poller.cycles == cycles + 1
        deadline = time.monotonic() + 20
        while state.view().gpus[1].status is not GpuStatus.STALE:  # GPU 1 left out
            assert time.monotonic() < deadline, "a GPU missing from rounds is not stale"
            backend.round(skip=1)
            time.sleep(0.05)
        assert (DeviceEventKind.STALE, 1) in _events(records)
        backend.round(skip=1)
        assert state.view().gpus[0].status is GpuStatus.OK
        backend.round()
        assert state.view().gpus[1].status is GpuStatus.OK  # back in a round: fresh
        # no rounds at all (a dead worker): every GPU goes stale, the liveness count moves
        cycles = poller.cycles
        while not all(g.status is GpuStatus.STALE for g in state.view().gpus):
            assert time.monotonic() < deadline, "GPUs without rounds are not stale"
            time.sleep(0.05)
        wait_end = time.monotonic() + 20
        while poller.cycles <= cycles:
            assert time.monotonic() < wait_end, "the liveness count stood still"
            time.sleep(0.05)
    finally:
        poller.stop()
