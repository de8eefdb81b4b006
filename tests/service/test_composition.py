"""One composition root for run, demo, simulate and rule tests; sources never wait for rules.

- the same scenario through the threaded daemon (sped-up clock) and through simulate
  (virtual clock) gives the same alert transitions, ``gpus.ignore`` included;
- ``status`` lists firing alerts whatever receivers exist (the demo's summary lists them:
  tests/harness/test_demo.py);
- a rule that takes seconds per evaluation leaves every GPU fresh and the scrape fast;
- the demo on a busy port runs one daemon on a free port (no lines printed twice).
"""

from __future__ import annotations

import dataclasses
import io
import socket
import threading
import time
import urllib.request
from pathlib import Path

from gpuwatchd.configfile.loader import Config, GpusConfig, ListenAddress, default_config
from gpuwatchd.core.alerts import AlertState, AlertTransition
from gpuwatchd.core.clock import ScaledClock, SystemClock
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DeviceEvent, GpuSample, GpuStatus, XidEvent
from gpuwatchd.harness.demo import default_demo_config, run_demo
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.backend import ScenarioBackend
from gpuwatchd.scenario.model import (
    Scenario,
    bundled_scenario_path,
    load_scenario,
    parse_scenario,
)
from gpuwatchd.service.assembly import Wiring
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.service.handoff import Handoff
from gpuwatchd.testing.fake_backend import FakeBackend

# GPU 1 overheats for 6 minutes (a page after 5 min over 85 C); GPU 3 falls off the bus,
# but the config ignores GPU 3: neither run may page for it.
SCENARIO = """
name: composition
duration: 12m
step: 10s
gpus: {count: 4, model: NVIDIA H100 80GB HBM3}
timeline:
  - at: 0s
    set: {temperature_gpu: 60, utilization_gpu: 0.9}
  - at: 1m
    gpu: 1
    set: {temperature_gpu: 91}
  - at: 7m
    gpu: 1
    set: {temperature_gpu: 65}
  - at: 2m
    gpu: 3
    nvml_xid: 79
    lose: true
  - at: 2m
    kernel_log: "NVRM: Xid (PCI:0000:{bus3}:00): 79, pid='<unknown>', name=<unknown>, {rest}"
"""


def scenario() -> Scenario:
    text = SCENARIO.replace("{rest}", "GPU has fallen off the bus.")
    base = parse_scenario(text.replace("{bus3}", "00"), "composition.yaml")
    bus3 = base.gpu_infos()[3].pci_bus_id.split(":")[1].lower()
    return parse_scenario(text.replace("{bus3}", bus3), "composition.yaml")


def config(tmp_path: Path, sc: Scenario) -> Config:
    cfg = default_config({})
    ignored = sc.gpu_infos()[3].pci_bus_id
    poll = dataclasses.replace(cfg.poll, interval=sc.step, call_timeout=sc.step)
    return dataclasses.replace(
        cfg,
        state_dir=str(tmp_path / "state"),
        gpus=GpusConfig(ignore=(ignored,)),
        poll=poll,
        listen=ListenAddress("127.0.0.1", 0),
    )


def key(t: AlertTransition) -> tuple[str, str, str]:
    return (t.rule, t.state.value, t.labels.get("gpu", ""))


def decided(transitions: list[AlertTransition]) -> set[tuple[str, str, str]]:
    return {key(t) for t in transitions if t.state in (AlertState.FIRING, AlertState.RESOLVED)}


def test_run_and_simulate_give_the_same_transitions_with_gpus_ignore(tmp_path: Path) -> None:
    sc = scenario()
    cfg = config(tmp_path, sc)
    sim = Simulation(sc, cfg)
    simulated: list[AlertTransition] = []
    sim.pipeline.on_transition = simulated.append
    sim.run()
    expected = decided(simulated)
    assert ("GpuTemperatureHigh", "firing", "1") in expected, expected
    assert not [k for k in expected if k[2] == "3"], "GPU 3 is ignored, yet simulate paged"
    assert not [k for k in expected if k[0] in ("GpuLost", "GpuXidFatal")]

    factor = 120.0  # 12 min of node time in 6 s
    clock = ScaledClock(factor)
    daemon = Daemon(cfg, ScenarioBackend(sc, clock), clock, serve_http=False)
    ran: list[AlertTransition] = []
    daemon.pipeline.on_transition = ran.append
    daemon.start()
    try:
        deadline = time.monotonic() + sc.duration / factor + 10.0
        while time.monotonic() < deadline and decided(ran) != expected:
            time.sleep(0.1)
    finally:
        daemon.stop()
    assert decided(ran) == expected
    assert [g.info.index for g in daemon.state.view().gpus] == [0, 1, 2]


def test_status_lists_firing_alerts_without_any_receiver(tmp_path: Path) -> None:
    sc = scenario()
    cfg = dataclasses.replace(config(tmp_path, sc), gpus=GpusConfig())
    assert not cfg.receivers and cfg.drain.mode == "none"
    sim = Simulation(sc, cfg)
    sim.run()
    firing = {(a["rule"], a["labels"]["gpu"]) for a in sim.node.status()["alerts"]}
    assert ("GpuLost", "3") in firing and ("GpuXidFatal", "3") in firing


def test_demo_on_a_busy_port_runs_one_daemon_on_a_free_port() -> None:
    demo = load_scenario(bundled_scenario_path("demo"))
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        busy = squatter.getsockname()[1]
        base = dataclasses.replace(default_demo_config(), listen=ListenAddress("127.0.0.1", busy))
        out = io.StringIO()
        assert run_demo(demo, base, seconds=4.0, out=out, color=False) == 0
    text = out.getvalue()
    assert text.count("gpuwatchd demo:") == 1
    notes = [line for line in text.splitlines() if "scenario: " in line]
    assert len(notes) == len(set(notes)) == len(demo.notes)
    assert f":{busy}/metrics" not in text
    assert "Metrics: http://127.0.0.1:" in text  # served on a free port, not "(no HTTP)"


class SlowRule:
    """A stage that takes seconds to evaluate, as a pathological rule would."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.evaluations = 0

    def observe(self, record: GpuSample | DeviceEvent | XidEvent) -> None:
        return None

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        self.evaluations += 1
        time.sleep(self.seconds)
        return []

    def families(self, view: NodeView, fams: Families) -> None:
        return None

    def close(self) -> None:
        return None


def test_a_slow_rule_never_makes_a_gpu_stale_or_a_scrape_slow(tmp_path: Path) -> None:
    cfg = default_config({})
    cfg = dataclasses.replace(
        cfg,
        state_dir=str(tmp_path),
        poll=dataclasses.replace(cfg.poll, interval=0.2, call_timeout=0.5),
    )
    slow = SlowRule(2.0)
    backend = FakeBackend(count=4)
    daemon = Daemon(
        cfg,
        backend,
        SystemClock(),
        wiring=Wiring(extra_stages=(slow,)),
        listen=("127.0.0.1", 0),
    )
    daemon.start()
    try:
        assert daemon.http is not None
        url = daemon.http.url + "/metrics"
        scrapes = []
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            started = time.monotonic()
            with urllib.request.urlopen(url, timeout=5) as resp:
                assert resp.status == 200
                resp.read()
            scrapes.append(time.monotonic() - started)
            view = daemon.state.view()
            assert all(g.status is GpuStatus.OK for g in view.gpus), [
                (g.info.index, g.status) for g in view.gpus
            ]
            time.sleep(0.1)
        polls = [g.polls for g in daemon.state.view().gpus]
    finally:
        daemon.stop()
    assert slow.evaluations >= 2  # the slow rule really ran, for seconds at a time
    assert min(polls) >= 15, polls  # ~25 polls in 5 s at 0.2 s, none held up by the rule
    scrapes.sort()
    # the slow rule holds the evaluator 2 s at a time: a scrape that waited for it would
    # take that long; the bounds hold on a loaded 2-core machine (bench/ has the numbers)
    assert scrapes[len(scrapes) // 2] < 0.5 and scrapes[-1] < 1.5, scrapes


def test_handoff_coalesces_samples_bounds_events_and_wakes_on_urgent_records() -> None:
    h = Handoff(max_events=3)
    for t in range(5):
        h.put(GpuSample(gpu=0, uuid="GPU-0", timestamp=float(t)))
    assert not h.wakeup.is_set()
    taken = h.take()
    assert [r.timestamp for r in taken] == [4.0]  # the latest sample of GPU 0 only
    for t in range(5):
        h.put(XidEvent(float(t), "kmsg", 31, pci_bus_id="00000000:18:00.0", gpu=0))
    assert h.wakeup.is_set() and h.dropped == 2
    assert [r.timestamp for r in h.take()] == [2.0, 3.0, 4.0]
    assert not h.wakeup.is_set()
    woke = threading.Event()

    def waiter() -> None:
        if h.wakeup.wait(5.0):
            woke.set()

    thread = threading.Thread(target=waiter)
    thread.start()
    h.put(XidEvent(9.0, "nvml", 79, pci_bus_id="00000000:18:00.0", gpu=0))
    thread.join(5.0)
    assert woke.is_set()


def test_simulate_judges_an_xid_at_its_own_time_not_at_the_next_step(tmp_path: Path) -> None:
    """The virtual clock stops at every scripted event: XID 79 at 2m3s pages at 2m3s with
    10 s steps (the daemon pages the moment it reads the line), and only once although
    the kernel line and the NVML event both report it."""
    text = SCENARIO.replace("at: 2m\n", "at: 2m3s\n").replace("{rest}", "fallen off the bus.")
    base = parse_scenario(text.replace("{bus3}", "00"), "x.yaml")
    bus3 = base.gpu_infos()[3].pci_bus_id.split(":")[1].lower()
    sc = parse_scenario(text.replace("{bus3}", bus3), "x.yaml")
    cfg = dataclasses.replace(config(tmp_path, sc), gpus=GpusConfig())
    records: list[dict[str, object]] = []
    sim = Simulation(sc, cfg, on_record=records.append)
    sim.run()
    fired = [r for r in records if r.get("rule") == "GpuXidFatal" and r.get("state") == "firing"]
    assert len(fired) == 1 and fired[0]["t"] == "2m3s", fired
    xids = [r for r in records if r.get("record") == "xid"]
    assert [bool(r.get("enriches")) for r in xids] == [False, True]


def test_nvml_events_count_as_up_from_the_start_so_a_first_fault_merges(tmp_path: Path) -> None:
    """Before the fix the NVML event path counted as up only when its first wait returned
    (a poll interval later): a fault in the first seconds paged twice, kernel line first,
    then its NVML event as a new incident."""
    sc = scenario()
    cfg = dataclasses.replace(config(tmp_path, sc), gpus=GpusConfig())
    clock = ScaledClock(1.0)
    daemon = Daemon(cfg, ScenarioBackend(sc, clock), clock, serve_http=False)
    assert daemon.xids.events is not None
    daemon.start()
    try:
        assert daemon.state.view().sources["nvml_events"].up
    finally:
        daemon.stop()


def test_sighup_applies_new_receivers_to_the_running_daemon(tmp_path: Path) -> None:
    """Daemon.reload (SIGHUP) asks the actions beside the rules: the new receivers replace
    the old ones; a change only a restart applies is refused, loudly, for its section."""
    path = tmp_path / "gpuwatchd.yaml"
    head = f"state_dir: {tmp_path / 'state'}\n"
    path.write_text(
        head + "receivers:\n  - {name: old, type: webhook, url: 'http://127.0.0.1:9/'}\n"
    )
    from gpuwatchd.configfile.loader import load_config

    config = load_config(str(path), must_exist=True)
    daemon = Daemon(config, FakeBackend(count=1), SystemClock(), serve_http=False)
    try:
        names = [r["name"] for r in daemon.status()["deliveries"]["receivers"]]
        assert names == ["old"]
        path.write_text(
            head + "receivers:\n  - {name: new, type: webhook, url: 'http://127.0.0.1:9/'}\n"
        )
        assert daemon.reload()
        names = [r["name"] for r in daemon.status()["deliveries"]["receivers"]]
        assert names == ["new"]
        path.write_text(
            head
            + "receivers:\n  - {name: new, type: webhook, url: 'http://127.0.0.1:9/'}\n"
            + "drain: {mode: exec, exec: {command: [/bin/true]}}\n"
        )
        assert daemon.reload()  # taken, but turning the drain on takes a restart
        status = daemon.status()
        assert "none -> exec takes a restart" in status["config"]["restart_required"]["drain"]
        assert daemon.config.drain.mode == "none"
        names = [r["name"] for r in status["deliveries"]["receivers"]]
        assert names == ["new"]
    finally:
        daemon.stop()
