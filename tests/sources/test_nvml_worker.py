"""NVML in a supervised worker process (issue 21): a crash or a hang inside libnvidia-ml
never stops kernel-log paging, /metrics or the outbox; the worker is restarted and its
restarts are counted. The stand-in for libnvidia-ml is ``gpuwatchd.testing.nvml_standin``
over the shipped fake pynvml."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from actions_support import HttpReceiver
from conftest import free_port
from fault_support import Daemon, KmsgFile, metric, report, wait_until

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import BackendError, CallTimeout
from gpuwatchd.core.records import GpuSample
from gpuwatchd.sources.gpu.backend import RoundResult
from gpuwatchd.sources.gpu.worker import WorkerBackend, WorkerDown, WorkerSettings

XID79_GPU1 = (
    "NVRM: Xid (PCI:0000:29:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
)


def _settings(hang_s: float = 30.0) -> WorkerSettings:
    return WorkerSettings(slow_interval_s=120.0, link_interval_s=600.0, hang_s=hang_s)


def _env(monkeypatch: pytest.MonkeyPatch, behaviour: str) -> None:
    monkeypatch.setenv("GPUWATCHD_NVML_MODULE", "gpuwatchd.testing.nvml_standin")
    monkeypatch.setenv("GPUWATCHD_STANDIN", behaviour)


def test_worker_samples_every_gpu_with_its_links(monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "ok")
    backend = WorkerBackend(SystemClock(), _settings())
    try:
        infos = backend.open()
        assert [i.pci_bus_id for i in infos] == ["00000000:18:00.0", "00000000:29:00.0"]
        s = backend.sample(1)
        assert s.gpu == 1 and s.uuid == infos[1].uuid
        assert s.fields["temperature_gpu"] == 33.0
        assert len(s.links) == 18 and s.links[17].fields["nvlink_up"] == 1.0
        assert backend.health()["up"] is True and backend.restarts == 0
    finally:
        backend.close()


class _Rounds:
    """Collects the rounds a ``WorkerBackend`` hands over: one call per round frame."""

    def __init__(self) -> None:
        self.rounds: list[dict[int, GpuSample | BackendError]] = []
        self.lock = threading.Lock()

    def __call__(self, results: RoundResult) -> None:
        got: dict[int, GpuSample | BackendError] = {}
        for index, result in results.items():
            try:
                got[index] = result()
            except BackendError as exc:
                got[index] = exc
        with self.lock:
            self.rounds.append(got)

    def since(self, n: int) -> list[dict[int, GpuSample | BackendError]]:
        with self.lock:
            return list(self.rounds[n:])


def test_the_worker_owns_the_cadence_one_frame_per_round_with_every_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env(monkeypatch, "ok")
    backend = WorkerBackend(SystemClock(), _settings())
    rounds = _Rounds()
    try:
        backend.open()
        backend.start_rounds(0.2, 1.0, rounds)
        wait_until(lambda: len(rounds.since(0)) >= 5, 20, "five rounds")
        for got in rounds.since(0):  # every round carries every GPU's sample
            assert sorted(got) == [0, 1]
            assert all(isinstance(v, GpuSample) for v in got.values())
        first = rounds.since(0)[0]
        assert isinstance(first[1], GpuSample) and len(first[1].links) == 18
        # a new cadence replaces the old one: fewer rounds from now on
        backend.start_rounds(5.0, 1.0, rounds)
        time.sleep(0.5)  # a round already under way may still come
        n = len(rounds.since(0))
        time.sleep(2.0)
        assert len(rounds.since(0)) - n <= 1
    finally:
        backend.close()


@pytest.mark.parametrize("hang_s", [1.5, 2.5])  # under and over the worker's first beat
def test_rounds_slower_than_the_hang_timeout_are_not_a_hang(
    monkeypatch: pytest.MonkeyPatch, hang_s: float
) -> None:
    """A poll interval longer than the hang timeout (60 s polls, the 30 s default): every
    GPU is in every round, so none is "left out" between rounds, the worker beats often
    enough for a hang timeout under its default 2 s beat, and it lives."""
    _env(monkeypatch, "ok")
    backend = WorkerBackend(SystemClock(), _settings(hang_s=hang_s))
    rounds = _Rounds()
    try:
        backend.open()
        backend.start_rounds(4.0, 0.5, rounds)
        wait_until(lambda: len(rounds.since(0)) >= 3, 30, "three rounds")
        assert backend.restarts == 0, backend.health()["last_exit"]
        assert all(isinstance(v, GpuSample) for got in rounds.since(0) for v in got.values())
    finally:
        backend.close()


def test_a_gpu_stuck_in_a_call_is_left_out_of_rounds_and_the_others_go_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env(monkeypatch, "hang-gpu1:1")
    backend = WorkerBackend(SystemClock(), _settings())
    rounds = _Rounds()
    try:
        backend.open()
        backend.start_rounds(0.2, 0.5, rounds)

        def stuck_at() -> int | None:
            for n, got in enumerate(rounds.since(0)):
                if isinstance(got.get(1), CallTimeout):
                    return n
            return None

        wait_until(lambda: stuck_at() is not None, 20, "GPU 1 reported stuck")
        n = stuck_at()
        assert n is not None
        wait_until(lambda: len(rounds.since(n)) >= 6, 20, "rounds after GPU 1 stuck")
        later = rounds.since(n + 1)
        # GPU 0 is read every round; GPU 1 is named stuck, never read again while stuck
        assert all(isinstance(got.get(0), GpuSample) for got in later)
        assert all(not isinstance(got.get(1), GpuSample) for got in later)
        assert "poll has not returned" in str(rounds.since(n)[0][1])
        assert backend.health()["up"] is True and backend.restarts == 0
    finally:
        backend.close()


def test_a_dead_worker_fails_every_gpu_of_its_rounds_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env(monkeypatch, "abort:1.5")
    backend = WorkerBackend(SystemClock(), _settings())
    rounds = _Rounds()
    try:
        backend.open()
        backend.start_rounds(0.2, 1.0, rounds)

        def down() -> bool:
            return any(
                all(isinstance(v, WorkerDown) for v in got.values()) and sorted(got) == [0, 1]
                for got in rounds.since(0)
            )

        wait_until(down, 30, "a round of WorkerDown")
        n = len(rounds.since(0))
        # the restarted worker polls at the same cadence, unasked
        wait_until(
            lambda: any(isinstance(got.get(0), GpuSample) for got in rounds.since(n)),
            30,
            "rounds from the restarted worker",
        )
        assert backend.restarts >= 1
    finally:
        backend.close()


def test_a_dead_worker_fails_pending_polls_at_once_and_is_restarted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _env(monkeypatch, "abort:1.5")
    seen: list[tuple[str, bool]] = []
    backend = WorkerBackend(
        SystemClock(), _settings(), status=lambda name, up, detail: seen.append((name, up))
    )
    try:
        backend.open()
        pid = backend.pid
        down_at = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                backend.sample(0)
            except WorkerDown:
                down_at = time.monotonic()
                break
            time.sleep(0.05)
        assert down_at is not None, "the aborting worker was never seen down"
        assert isinstance(WorkerDown("x"), CallTimeout)  # the poller's STALE path
        wait_until(lambda: backend.health()["up"] and backend.pid != pid, 30, "restart")
        assert backend.restarts >= 1 and "SIGABRT" in backend.health()["last_exit"]
        assert ("nvml_worker", False) in seen and seen[-1] == ("nvml_worker", True)
    finally:
        backend.close()


@pytest.mark.parametrize("behaviour", ["hang:1", "hang-gil:1"])
def test_a_hung_worker_is_killed_not_leaked(
    monkeypatch: pytest.MonkeyPatch, behaviour: str
) -> None:
    _env(monkeypatch, behaviour)
    backend = WorkerBackend(SystemClock(), _settings(hang_s=2.0))
    try:
        backend.open()
        first = backend.pid
        time.sleep(1.2)
        with pytest.raises(WorkerDown):
            backend.sample(0)  # stuck until the supervisor kills the worker
        wait_until(lambda: backend.restarts >= 1, 30, "a restart after the kill")
        last_exit = backend.health()["last_exit"]
        assert "hung (" in last_exit and "SIGKILL" in last_exit, last_exit  # why, and how
        assert backend.pid != first
    finally:
        backend.close()


def _daemon(
    tmp_path: Path, behaviour: str, rx: HttpReceiver, kmsg: Path, hang: str = "3s"
) -> Daemon:
    config = f"""node_name: worker-node
state_dir: {tmp_path / "state"}
backend: nvml
poll: {{interval: 1s, call_timeout: 800ms, worker_hang_timeout: {hang}}}
sources: {{kernel_log: kmsg, kmsg_path: {kmsg}, nvml_events: true}}
web: {{rate_limit: 0}}
receivers:
  - {{name: ops, type: webhook, url: "{rx.url}/hook"}}
routing: {{group_wait: 0s, group_by: [node, gpu, alertname]}}
"""
    env = {
        "GPUWATCHD_NVML_MODULE": "gpuwatchd.testing.nvml_standin",
        "GPUWATCHD_STANDIN": behaviour,
    }
    return Daemon(tmp_path, config, None, env=env)


@pytest.mark.parametrize("behaviour", ["abort:2", "hang:2"])
def test_kernel_xids_page_and_metrics_answer_while_nvml_crashes_or_hangs(
    tmp_path: Path, behaviour: str
) -> None:
    rx = HttpReceiver(free_port()).start()
    kmsg = KmsgFile(tmp_path / "kmsg")
    d = _daemon(tmp_path, behaviour, rx, kmsg.path)
    try:
        d.start()
        wait_until(lambda: metric(d.metrics(), "gpuwatchd_nvml_worker_up") == 1, 20, "worker up")
        # the worker dies (or wedges and is killed) and is restarted, over and over
        wait_until(
            lambda: metric(d.metrics(), "gpuwatchd_nvml_worker_restarts_total") >= 1,
            40,
            "a worker restart",
        )
        text = d.metrics()
        assert metric(text, "gpuwatchd_source_up", source="kmsg") == 1
        # a kernel XID still pages at once, whatever the worker is doing
        sent = time.monotonic()
        kmsg.append(XID79_GPU1)
        wait_until(
            lambda: any(
                a["labels"].get("alertname") == "GpuXidFatal" and a["labels"].get("gpu") == "1"
                for r in rx.requests
                for a in r.json()["alerts"]
            ),
            10,
            "the XID 79 page",
            step=0.01,
        )
        latency = time.monotonic() - sent
        assert latency < 2.5, f"kernel line -> page took {latency:.2f}s"
        status = d.status()
        assert status["nvml_worker"]["restarts"] >= 1
        assert d.proc is not None and d.proc.poll() is None  # the daemon itself lives on
        report(
            f"nvml_worker_{behaviour.split(':')[0]}",
            line_to_page_ms=round(latency * 1000, 1),
            restarts=status["nvml_worker"]["restarts"],
        )
    finally:
        d.stop()
        rx.stop()


def test_a_daemon_marks_the_stuck_gpu_stale_and_keeps_the_other_fresh(tmp_path: Path) -> None:
    """``gpuwatchd run`` with the worker owning the cadence: GPU 1 wedges in a call, the
    worker's rounds go on without it; the daemon shows GPU 1 stale, GPU 0 ok and polled."""
    rx = HttpReceiver(free_port()).start()
    kmsg = KmsgFile(tmp_path / "kmsg")
    d = _daemon(tmp_path, "hang-gpu1:2", rx, kmsg.path, hang="2m")
    try:
        d.start()

        def gpus() -> dict[int, dict[str, object]]:
            return {g["index"]: g for g in d.status()["gpus"]}

        wait_until(lambda: gpus()[1]["status"] == "stale", 30, "GPU 1 stale")
        assert gpus()[0]["status"] == "ok"
        name = "gpuwatchd_gpu_last_sample_timestamp_seconds"
        last = metric(d.metrics(), name, gpu="0")
        wait_until(lambda: metric(d.metrics(), name, gpu="0") >= last + 2, 30, "GPU 0 polled on")
        assert gpus()[0]["status"] == "ok" and gpus()[1]["status"] == "stale"
        assert d.status()["nvml_worker"]["restarts"] == 0
    finally:
        d.stop()
        rx.stop()
