"""One incident per fault: NVML events and kernel lines merged, mismatches reported."""

from __future__ import annotations

from typing import Any

from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.incidents import IncidentMerger

PCI = "00000000:3A:00.0"


def kernel(t: float, xid: int = 31, pci: str = PCI) -> XidEvent:
    return XidEvent(
        t, "kmsg", xid, pci_bus_id=pci, gpu=2, pid=77, process="python3", message="MMU Fault"
    )


def nvml(t: float, xid: int = 31, pci: str = PCI) -> XidEvent:
    return XidEvent(t, "nvml", xid, pci_bus_id=pci, gpu=2, uuid="GPU-x")


class Collected:
    """An ``IncidentMerger`` driven as the intake drives it: what it returns is collected."""

    def __init__(
        self,
        m: IncidentMerger,
        out: list[XidEvent],
        kernel_up: bool,
        nvml_up: bool,
        mismatches: list[tuple[int, str]] | None,
    ) -> None:
        self.m, self.out, self.mismatches = m, out, mismatches
        self.kernel_up, self.nvml_up = kernel_up, nvml_up

    def submit(self, event: XidEvent, now: float) -> None:
        got = self.m.submit(event, now, kernel_up=self.kernel_up, nvml_up=self.nvml_up)
        if got is not None:
            self.out.append(got)

    def expire(self, now: float) -> None:
        for late in self.m.expire(now):
            if late.emit:
                self.out.append(late.event)
            if self.mismatches is not None:
                self.mismatches.append((late.event.xid, late.missing))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)


class Outlet:
    def __init__(self) -> None:
        self.records: list[XidEvent] = []

    def emit(self, record: XidEvent) -> None:
        self.records.append(record)


def merger(
    out: list[XidEvent],
    kernel_up: bool = True,
    nvml_up: bool = True,
    mismatches: list[tuple[int, str]] | None = None,
) -> Collected:
    return Collected(IncidentMerger(3.0), out, kernel_up, nvml_up, mismatches)


def test_first_sight_is_the_incident_and_its_partner_enriches_it() -> None:
    out: list[XidEvent] = []
    m = merger(out)
    m.submit(nvml(100.0), 100.0)
    assert [(e.source, e.enriches) for e in out] == [("nvml", False)]  # no waiting
    m.submit(kernel(100.4), 100.4)
    assert len(out) == 2
    e = out[1]
    assert e.enriches and e.source == "kmsg+nvml" and e.timestamp == 100.0
    assert (e.pid, e.process, e.uuid, e.gpu) == (77, "python3", "GPU-x", 2)
    m.expire(200.0)
    assert len(out) == 2 and m.merged == 1 and m.mismatch == {"kernel": 0, "nvml": 0}


def test_kernel_first_then_nvml_also_merges() -> None:
    out: list[XidEvent] = []
    m = merger(out)
    m.submit(kernel(5.0), 5.0)
    m.submit(nvml(5.1), 5.1)
    assert [(e.source, e.enriches) for e in out] == [("kmsg", False), ("kmsg+nvml", True)]


def test_missing_partner_is_counted_after_the_window_without_a_second_event() -> None:
    out: list[XidEvent] = []
    mismatches: list[tuple[int, str]] = []
    m = merger(out, mismatches=mismatches)
    m.submit(nvml(10.0), 10.0)
    assert [e.source for e in out] == ["nvml"]
    m.expire(12.9)
    assert mismatches == []
    m.expire(13.0)
    assert [e.source for e in out] == ["nvml"]
    assert mismatches == [(31, "kernel")] and m.mismatch == {"kernel": 1, "nvml": 0}
    m.submit(kernel(14.0), 14.0)  # too late to be the partner: a new incident
    assert [(e.source, e.enriches) for e in out] == [("nvml", False), ("kmsg", False)]


def test_single_path_emits_immediately() -> None:
    out: list[XidEvent] = []
    m = merger(out, kernel_up=False)
    m.submit(nvml(1.0), 1.0)
    assert [e.source for e in out] == ["nvml"]
    out2: list[XidEvent] = []
    m2 = merger(out2, nvml_up=False)
    m2.submit(kernel(1.0), 1.0)
    assert [e.source for e in out2] == ["kmsg"]


def test_different_gpus_or_codes_do_not_merge() -> None:
    out: list[XidEvent] = []
    m = merger(out)
    m.submit(nvml(1.0, xid=31), 1.0)
    m.submit(kernel(1.1, xid=43), 1.1)
    m.submit(kernel(1.2, pci="00000000:18:00.0"), 1.2)
    assert [e.enriches for e in out] == [False, False, False]
    m.expire(10.0)
    assert len(out) == 3 and m.mismatch == {"kernel": 1, "nvml": 2}


def test_storm_pairs_first_in_first_out() -> None:
    out: list[XidEvent] = []
    m = merger(out)
    for i in range(5):
        m.submit(nvml(float(i)), float(i))
    for i in range(5):
        m.submit(kernel(i + 0.5), i + 0.5)
    assert [e.timestamp for e in out if not e.enriches] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert [e.timestamp for e in out if e.enriches] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert m.pending() == 0


def test_bus_loss_reported_twice_by_the_driver_is_one_incident() -> None:
    out: list[XidEvent] = []
    m = merger(out, nvml_up=False)
    m.submit(kernel(1.0, xid=79), 1.0)
    fallen = XidEvent(1.1, "kmsg", 79, kind="fallen_off_bus", pci_bus_id=PCI, gpu=2)
    m.submit(fallen, 1.1)
    assert len(out) == 1 and m.duplicates == 1
    m.submit(kernel(100.0, xid=79), 100.0)  # a later loss (after a reset) is new
    assert len(out) == 2


def test_next_expiry_is_the_oldest_first_sighting_plus_the_window() -> None:
    out: list[XidEvent] = []
    m = merger(out)
    assert m.next_expiry() is None and not m.new_pending.is_set()
    m.submit(nvml(100.0), 100.0)
    m.submit(nvml(101.0, xid=13), 101.0)
    assert m.next_expiry() == 103.0 and m.new_pending.is_set()
    m.expire(103.0)
    assert m.next_expiry() == 104.0


def test_the_expirer_thread_reports_a_mismatch_at_the_window_end_without_ticking() -> None:
    """The expirer sleeps until a pending sighting's window ends (no 4-per-second tick),
    and still counts a partner that never came, on the real clock."""
    import dataclasses
    import time

    from gpuwatchd.configfile.loader import default_config
    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.core.nodestate import NodeState
    from gpuwatchd.sources.intake import XidIntake
    from gpuwatchd.sources.kernel.kmsg import KmsgSection

    base = default_config()
    # a kmsg reader that is never started: its path only has to be named
    sources = dataclasses.replace(
        base.sources,
        kernel_log="kmsg",
        kinds={"kmsg": KmsgSection("/nonexistent/kmsg")},
        merge_window=0.3,
    )
    out = Outlet()
    clock = SystemClock()
    state = NodeState("n1", clock.now())
    intake = XidIntake(sources, 1.0, None, object(), clock, state, out)
    intake.start()
    try:
        # a kernel path that says it is up but misses this fault
        state.source("kmsg", up=True, now=clock.now())
        intake.nvml_event(nvml(time.time()))
        deadline = time.monotonic() + 3.0
        while intake.merger.mismatch["kernel"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert intake.merger.mismatch == {"kernel": 1, "nvml": 0}
        assert len(out.records) == 1  # the first sighting went out at once, alone
    finally:
        started = time.monotonic()
        intake.stop()
        assert time.monotonic() - started < 3.0  # stop wakes the idle expirer (5 s idle)
