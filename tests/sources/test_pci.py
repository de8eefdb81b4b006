"""Counting NVIDIA GPUs on the PCI bus: sysfs fixtures, udev events, and the real host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuwatchd.sources.gpu.pci import PciWatcher, is_nvidia_gpu, read_sysfs, read_udev

# An HGX H100 board as sysfs shows it: 8 GPUs (3D controller 0x030200), 4 NVSwitches
# (bridge 0x068000), the GPUs' audio-less siblings absent; plus a host bridge and a NIC.
DEVICES = [
    ("0000:00:00.0", "0x8086", "0x09a2", "0x060000"),
    ("0000:17:00.0", "0x15b3", "0x1021", "0x020000"),
    *[
        (f"0000:{bus}:00.0", "0x10de", "0x2330", "0x030200")
        for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
    ],
    *[(f"0000:{bus}:00.0", "0x10de", "0x22a3", "0x068000") for bus in ("05", "06", "07", "08")],
    ("0000:c1:00.1", "0x10de", "0x22ba", "0x040300"),  # an HDMI audio function: not a GPU
    ("0000:c1:00.0", "0x10de", "0x2684", "0x030000"),  # a VGA-class GeForce: a GPU
]


def make_sysfs(root: Path, devices: list[tuple[str, str, str, str]]) -> Path:
    base = root / "bus" / "pci" / "devices"
    base.mkdir(parents=True)
    for address, vendor, device, cls in devices:
        d = base / address
        d.mkdir()
        (d / "vendor").write_text(vendor + "\n")
        (d / "device").write_text(device + "\n")
        (d / "class").write_text(cls + "\n")
    return root


def test_classification() -> None:
    assert is_nvidia_gpu(0x10DE, 0x030200) and is_nvidia_gpu(0x10DE, 0x030000)
    assert not is_nvidia_gpu(0x10DE, 0x068000)  # NVSwitch
    assert not is_nvidia_gpu(0x10DE, 0x040300)  # audio
    assert not is_nvidia_gpu(0x1002, 0x030000)  # another vendor's GPU


def test_sysfs_enumeration(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, DEVICES)
    found = read_sysfs(str(root))
    assert len(found) == len(DEVICES)
    assert sum(d.is_nvidia_gpu for d in found) == 9
    assert read_sysfs(str(tmp_path / "missing")) == []


class FakeDevice:
    def __init__(self, action: str, address: str, pci_id: str, pci_class: str) -> None:
        self.action = action
        self.sys_name = address
        self.properties = {"PCI_ID": pci_id, "PCI_CLASS": pci_class, "PCI_SLOT_NAME": address}


class FakeMonitor:
    """Hands out queued udev events, like ``pyudev.Monitor.poll``."""

    def __init__(self, events: list[FakeDevice]) -> None:
        self.events = list(events)

    def poll(self, timeout: float | None = None) -> FakeDevice | None:
        if self.events:
            return self.events.pop(0)
        time.sleep(0.01)
        return None


def test_watcher_counts_and_follows_udev_events(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, DEVICES)
    counts: list[int] = []
    statuses: list[tuple[str, bool, str]] = []
    events = [
        FakeDevice("remove", "0000:5d:00.0", "10DE:2330", "30200"),  # a GPU falls off
        FakeDevice("remove", "0000:05:00.0", "10DE:22A3", "68000"),  # an NVSwitch: ignored
        FakeDevice("bind", "0000:18:00.0", "10DE:2330", "30200"),  # not add/remove
        FakeDevice("add", "0000:5d:00.0", "10DE:2330", "30200"),  # and comes back
    ]
    w = PciWatcher(
        counts.append,
        sysfs_root=str(root),
        monitor=FakeMonitor(events),
        on_status=lambda *s: statuses.append(s),
    )
    w.start()
    deadline = time.monotonic() + 5
    while len(counts) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert counts == [9, 8, 9]
    assert statuses == [("pci", True, "9 NVIDIA GPU(s) on the bus via sysfs")]
    assert w.events == 2


def test_watcher_without_monitor_rescans_sysfs(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, DEVICES)
    counts: list[int] = []
    w = PciWatcher(counts.append, sysfs_root=str(root), use_udev=False, rescan=0.05)
    w.start()
    import shutil

    shutil.rmtree(root / "bus" / "pci" / "devices" / "0000:9a:00.0")
    deadline = time.monotonic() + 5
    while (not counts or counts[-1] != 8) and time.monotonic() < deadline:
        time.sleep(0.01)
    w.stop()
    assert counts[0] == 9 and counts[-1] == 8


def test_missing_pyudev_is_noted_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Without pyudev the watcher reads sysfs every rescan; it says so once, not every
    minute (seen on a GPU host without pyudev: the same line at every rescan)."""
    import sys

    monkeypatch.setitem(sys.modules, "pyudev", None)  # import pyudev raises ImportError
    root = make_sysfs(tmp_path, DEVICES)
    counts: list[int] = []
    w = PciWatcher(counts.append, sysfs_root=str(root))
    with caplog.at_level("INFO", logger="gpuwatchd.sources.gpu.pci"):
        for _ in range(3):
            w.enumerate()
    assert counts == [9, 9, 9]
    assert sum("pyudev unavailable" in r.getMessage() for r in caplog.records) == 1


@pytest.fixture
def udev_context() -> Iterator[Any]:
    pyudev = pytest.importorskip("pyudev")
    yield pyudev.Context()


def test_real_udev_enumeration_matches_sysfs(udev_context: Any) -> None:
    """On this host, with the real libudev: the same devices as a plain sysfs read."""
    via_udev = {d.address: d for d in read_udev(udev_context)}
    via_sysfs = {d.address: d for d in read_sysfs("/sys")}
    assert via_udev.keys() == via_sysfs.keys()
    assert {a: d.is_nvidia_gpu for a, d in via_udev.items()} == {
        a: d.is_nvidia_gpu for a, d in via_sysfs.items()
    }


def test_real_watcher_starts_and_stops(udev_context: Any) -> None:
    counts: list[int] = []
    statuses: list[tuple[str, bool, str]] = []
    w = PciWatcher(counts.append, context=udev_context, on_status=lambda *s: statuses.append(s))
    w.start()
    w.stop()
    expected = sum(d.is_nvidia_gpu for d in read_sysfs("/sys"))
    assert counts == [expected]
    assert statuses[0][:2] == ("pci", True)
    assert "udev" in statuses[0][2]
