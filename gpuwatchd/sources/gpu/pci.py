"""NVIDIA GPUs on the PCI bus, counted independently of NVML.

NVML only knows the GPUs the driver initialised. A GPU that fell off the bus at boot, or
that the driver refused, is simply absent from ``nvmlDeviceGetCount``; the PCI bus still
shows it (or shows it gone). ``PciWatcher`` counts NVIDIA display/3D controllers (vendor
0x10de, PCI base class 0x03: 0x0300 VGA, 0x0302 3D; NVSwitches are bridges, 0x0680, and
the GPUs' HDMI audio functions 0x0403, neither counts) at start and keeps the count up to
date from udev's netlink monitor (PCI ``add``/``remove`` events). The rule engine compares
it with ``gpus.expected`` (the ``gpu_count`` condition).

Everything external is injectable: ``sysfs_root`` (default ``/sys``, like node_exporter's
``--path.sysfs``), the pyudev ``context`` and ``monitor``. pyudev is imported only here and
only when used; without it (or without udev, as in containers and on the lent GPU
machines) the watcher reads sysfs directly and re-reads it every ``rescan`` seconds, and
says so in its source health (``gpuwatchd_source_up{source="pci"}``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

NVIDIA_VENDOR = 0x10DE
DISPLAY_BASE_CLASS = 0x03
RESCAN_SECONDS = 60.0


@dataclass(frozen=True)
class PciDevice:
    address: str  # sysfs form: 0000:3b:00.0
    vendor: int
    device: int
    pci_class: int  # 24 bits: base, sub, prog-if

    @property
    def is_nvidia_gpu(self) -> bool:
        return is_nvidia_gpu(self.vendor, self.pci_class)


def is_nvidia_gpu(vendor: int, pci_class: int) -> bool:
    return vendor == NVIDIA_VENDOR and (pci_class >> 16) == DISPLAY_BASE_CLASS


def _hex(text: str | bytes | None) -> int | None:
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("ascii", "replace")
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def read_sysfs(sysfs_root: str = "/sys") -> list[PciDevice]:
    """Every PCI function under ``<root>/bus/pci/devices``, read from sysfs files."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out: list[PciDevice] = []
    for name in names:
        values: dict[str, int | None] = {}
        for attr in ("vendor", "device", "class"):
            try:
                with open(os.path.join(base, name, attr), encoding="ascii") as fh:
                    values[attr] = _hex(fh.read())
            except OSError:
                values[attr] = None
        vendor, device, cls = values["vendor"], values["device"], values["class"]
        if vendor is None or cls is None:
            continue
        out.append(PciDevice(name, vendor, device or 0, cls))
    return out


def _udev_device(dev: Any) -> PciDevice | None:
    """A pyudev Device as a ``PciDevice``, from its uevent properties (present on remove
    events too, when the sysfs attributes are already gone)."""
    props = dev.properties
    pci_id = props.get("PCI_ID")  # "10DE:2330"
    cls = _hex(props.get("PCI_CLASS"))
    address = props.get("PCI_SLOT_NAME") or getattr(dev, "sys_name", "")
    vendor = device = None
    if pci_id and ":" in pci_id:
        v, _, d = pci_id.partition(":")
        vendor, device = _hex(v), _hex(d)
    if vendor is None or cls is None:
        attrs = getattr(dev, "attributes", None)
        if attrs is not None:
            try:
                vendor = vendor if vendor is not None else _hex(attrs.get("vendor"))
                cls = cls if cls is not None else _hex(attrs.get("class"))
            except Exception:  # an attribute that vanished with the device
                pass
    if vendor is None or cls is None:
        return None
    return PciDevice(str(address), vendor, device or 0, cls)


def read_udev(context: Any) -> list[PciDevice]:
    """Every PCI device udev (libudev over sysfs) knows."""
    out: list[PciDevice] = []
    for dev in context.list_devices(subsystem="pci"):
        found = _udev_device(dev)
        if found is not None:
            out.append(found)
    return out


class Monitor(Protocol):
    """What the watcher needs of ``pyudev.Monitor``."""

    def poll(self, timeout: float | None = None) -> Any: ...


class PciWatcher:
    """Counts NVIDIA GPUs on the PCI bus and reports changes through ``on_count``."""

    def __init__(
        self,
        on_count: Callable[[int], None],
        *,
        sysfs_root: str = "/sys",
        context: Any = None,
        monitor: Monitor | None = None,
        use_udev: bool = True,
        rescan: float = RESCAN_SECONDS,
        on_status: Callable[[str, bool, str], None] | None = None,
    ) -> None:
        self.on_count = on_count
        self.sysfs_root = sysfs_root
        self.context = context
        self.monitor = monitor
        self.use_udev = use_udev
        self.rescan = rescan
        self.on_status = on_status or (lambda name, up, detail: None)
        self.gpus: set[str] = set()
        self.mode = "none"
        self.events = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._wake: tuple[int, int] | None = None  # (read, write) while the thread runs

    # -- enumeration --------------------------------------------------------------------
    def _udev_context(self) -> Any:
        if self.context is not None or not self.use_udev:
            return self.context
        try:
            import pyudev

            self.context = pyudev.Context()
        except Exception as exc:  # no pyudev or no libudev: sysfs is enough
            log.info("pci: pyudev unavailable (%s): reading sysfs", exc)
            self.context = None
            self.use_udev = False  # once: not retried (and logged) at every rescan
        return self.context

    def enumerate(self) -> int:
        """Count the GPUs now (udev if possible, else sysfs) and report the count."""
        context = self._udev_context()
        devices: Iterable[PciDevice]
        if context is not None and self.sysfs_root == "/sys":
            try:
                devices = read_udev(context)
                source = "udev"
            except Exception as exc:
                log.warning("pci: udev enumeration failed (%s): reading sysfs", exc)
                devices, source = read_sysfs(self.sysfs_root), "sysfs"
        else:
            devices, source = read_sysfs(self.sysfs_root), "sysfs"
        with self._lock:
            self.gpus = {d.address for d in devices if d.is_nvidia_gpu}
            count = len(self.gpus)
        if self.mode == "none":
            self.mode = source
        self.on_count(count)
        return count

    def handle(self, dev: Any) -> None:
        """One udev event (``add``/``remove``/...) for a PCI device."""
        action = getattr(dev, "action", None)
        found = _udev_device(dev)
        if found is None or not found.is_nvidia_gpu:
            return
        with self._lock:
            before = len(self.gpus)
            if action == "add":
                self.gpus.add(found.address)
            elif action == "remove":
                self.gpus.discard(found.address)
            else:
                return
            count = len(self.gpus)
            self.events += 1
        log.log(
            logging.WARNING if action == "remove" else logging.INFO,
            "pci: NVIDIA GPU %s %s (%d -> %d on the bus)",
            found.address,
            "removed" if action == "remove" else "added",
            before,
            count,
        )
        self.on_count(count)

    # -- watching -----------------------------------------------------------------------
    def _open_monitor(self) -> Monitor | None:
        if self.monitor is not None:
            return self.monitor
        context = self._udev_context()
        if context is None:
            return None
        try:
            import pyudev

            source = "udev" if os.path.exists("/run/udev/control") else "kernel"
            udev_monitor = pyudev.Monitor.from_netlink(context, source=source)
            udev_monitor.filter_by(subsystem="pci")
            udev_monitor.start()
            monitor: Monitor = udev_monitor
            self.monitor = monitor
            self.mode = f"{self.mode}+netlink:{source}"
            return monitor
        except Exception as exc:
            log.info("pci: no udev monitor (%s): re-reading sysfs every %gs", exc, self.rescan)
            return None

    def start(self) -> None:
        try:
            count = self.enumerate()
        except Exception as exc:  # never fatal: the rule only loses a cross-check
            log.warning("pci: cannot enumerate PCI devices: %s", exc)
            self.on_status("pci", False, f"cannot enumerate: {exc}")
            return
        monitor = self._open_monitor()
        detail = f"{count} NVIDIA GPU(s) on the bus via {self.mode}"
        if monitor is None:
            detail += f"; no hotplug monitor, re-reading sysfs every {self.rescan:g}s"
        self.on_status("pci", True, detail)
        self._wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(
            target=self._run, args=(monitor,), name="pci-watch", daemon=True
        )
        self._thread.start()

    def _run(self, monitor: Monitor | None) -> None:
        while not self._stop.is_set():
            if monitor is None:
                if self._stop.wait(self.rescan):
                    return
                try:
                    self.enumerate()
                except Exception as exc:
                    log.warning("pci: re-reading sysfs failed: %s", exc)
                continue
            try:
                dev = self._next_event(monitor)
            except Exception as exc:
                log.warning("pci: udev monitor failed (%s): re-reading sysfs instead", exc)
                self.on_status("pci", True, f"udev monitor failed ({exc}); re-reading sysfs")
                monitor = None
                continue
            if dev is not None:
                self.handle(dev)

    def _next_event(self, monitor: Monitor) -> Any:
        """The next udev event, or None after a while. A monitor with a file descriptor
        (pyudev's) is waited on with no timeout: an idle watcher sleeps until a device
        comes or goes, or ``stop`` writes to the wake pipe."""
        fileno = getattr(monitor, "fileno", None)
        if fileno is None or self._wake is None:
            return monitor.poll(timeout=1.0)
        readable, _, _ = select.select([fileno(), self._wake[0]], [], [])
        if self._wake[0] in readable:
            return None
        return monitor.poll(timeout=0)

    def stop(self) -> None:
        self._stop.set()
        wake, self._wake = self._wake, None
        if wake is not None:
            with contextlib.suppress(OSError):
                os.write(wake[1], b"x")
        if self._thread is not None:
            self._thread.join(2.0)
        if wake is not None and not (self._thread is not None and self._thread.is_alive()):
            for fd in wake:
                os.close(fd)
