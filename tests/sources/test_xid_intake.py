"""The XID intake: one module owns the kernel-log reader, the NVML event reader and the
merger, reads each path's health from the node state and hands incidents to its outlet at
once; no module on the XID road keeps a callback given to its constructor."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from conftest import ROOT

from gpuwatchd.configfile.loader import default_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.intake import XidIntake
from gpuwatchd.sources.kernel.kmsg import KmsgSection
from gpuwatchd.testing.fake_backend import make_infos

ROAD = (
    "sources/intake.py",
    "sources/incidents.py",
    "sources/kernel/linehandler.py",
    "sources/gpu/xid_events.py",
)
LINE = "NVRM: Xid (PCI:0000:3a:00): 79, pid=1234, name=python3, GPU has fallen off the bus."


class Outlet:
    def __init__(self) -> None:
        self.records: list[XidEvent] = []

    def emit(self, record: XidEvent) -> None:
        self.records.append(record)


def _intake(tmp_path: Path) -> tuple[XidIntake, NodeState, Outlet]:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sources = dataclasses.replace(
        default_config().sources,
        kernel_log="kmsg",
        kinds={"kmsg": KmsgSection(str(kmsg))},
        merge_window=3.0,
    )
    clock = SystemClock()
    state = NodeState("n1", clock.now())
    state.set_gpus(make_infos(8), clock.now())
    out = Outlet()
    intake = XidIntake(sources, 1.0, None, object(), clock, state, out)
    intake.set_gpus(make_infos(8))
    return intake, state, out


def _callable_params(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            for arg in node.args.args + node.args.kwonlyargs:
                if arg.annotation is not None and "Callable" in ast.unparse(arg.annotation):
                    found.append(f"{path.name}: {arg.arg}")
    return found


def test_no_constructor_on_the_xid_road_takes_a_callback() -> None:
    """Collaborators are objects with a narrow protocol, or results are returned."""
    found = [p for rel in ROAD for p in _callable_params(ROOT / "gpuwatchd" / rel)]
    assert found == []


def test_a_kernel_line_leaves_the_intake_at_once_and_is_counted(tmp_path: Path) -> None:
    intake, state, out = _intake(tmp_path)
    assert intake.handler is not None
    intake.handler.handle(LINE, 100.0, True)  # the reader's call: no thread, no timer
    assert [(e.xid, e.gpu, e.source, e.enriches) for e in out.records] == [(79, 2, "kmsg", False)]
    assert state.view().xid_counts == {(2, 79): 1}


def test_each_paths_health_is_read_from_the_node_state(tmp_path: Path) -> None:
    """An NVML event waits for its kernel partner only while the node state says the
    kernel-log source is up; a mismatch is counted only then."""
    intake, state, out = _intake(tmp_path)
    nvml = XidEvent(100.0, "nvml", 48, pci_bus_id="00000000:3A:00.0")
    intake.nvml_event(nvml)  # the kmsg source never reported: no partner expected
    assert intake.merger.pending() == 0 and len(out.records) == 1
    state.source("kmsg", up=True, now=100.0)
    intake.nvml_event(dataclasses.replace(nvml, timestamp=101.0))
    assert intake.merger.pending() == 1 and len(out.records) == 2  # first sight goes out
    assert out.records[1].gpu == 2  # resolved to its GPU by the PCI address
    intake.flush()
    assert intake.merger.mismatch == {"kernel": 1, "nvml": 0}
    assert len(out.records) == 2  # the partner that never came emits nothing


class Flaky:
    """A backend whose event wait fails once, then returns one event."""

    def __init__(self) -> None:
        self.calls = 0

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        from gpuwatchd.core.errors import BackendError

        self.calls += 1
        if self.calls == 1:
            raise BackendError("event set gone")
        return [XidEvent(200.0, "nvml", 31, pci_bus_id="00000000:3A:00.0")]


def test_the_nvml_event_path_keeps_its_health_only_on_the_node_state(tmp_path: Path) -> None:
    """No flag of the reader's own: what the node state says is what the merger reads."""
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sources = dataclasses.replace(
        default_config().sources,
        kernel_log="kmsg",
        kinds={"kmsg": KmsgSection(str(kmsg))},
        nvml_events=True,
    )
    clock = SystemClock()
    state = NodeState("n1", clock.now())
    out = Outlet()
    intake = XidIntake(sources, 0.0, None, Flaky(), clock, state, out)
    intake.set_gpus(make_infos(8))
    events = intake.events
    assert events is not None and not hasattr(events, "up")
    state.source("kmsg", up=True, now=clock.now())  # so the NVML sighting awaits its line
    events.step(0.0)
    down = state.view().sources["nvml_events"]
    assert not down.up and down.detail == "event set gone"
    events.step(0.0)
    assert state.source_up("nvml_events")
    assert [(e.xid, e.gpu) for e in out.records] == [(31, 2)]
    # a kernel line of the same fault now finds its partner: the pair enriches
    assert intake.handler is not None
    intake.handler.handle("NVRM: Xid (PCI:0000:3a:00): 31, pid=7, name=a, MMU Fault", 200.1, True)
    assert [(e.source, e.enriches) for e in out.records[1:]] == [("kmsg+nvml", True)]
