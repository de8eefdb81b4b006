"""NVML in a supervised worker process (issue 21): a crash or a hang inside libnvidia-ml
never stops kernel-log paging, /metrics or the outbox; the worker is restarted and its
restarts are counted. The stand-in for libnvidia-ml is ``gpuwatchd.testing.nvml_standin``
over the shipped fake pynvml."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from actions_support import HttpReceiver
from conftest import free_port
from fault_support import Daemon, KmsgFile, metric, report, wait_until

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import CallTimeout
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


def _daemon(tmp_path: Path, behaviour: str, rx: HttpReceiver, kmsg: Path) -> Daemon:
    config = f"""node_name: worker-node
state_dir: {tmp_path / "state"}
backend: nvml
poll: {{interval: 1s, call_timeout: 800ms, worker_hang_timeout: 3s}}
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
