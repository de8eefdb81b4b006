"""A fake ``pynvml`` module: the subset of nvidia-ml-py that gpuwatchd's NVML backend uses.

It stands in for the module object (``NvmlBackend(clock, nvml=FakeNvml(...))``), never for
the C library, and it is built from the real pynvml pieces so that the backend's decoding
code runs for real:

- failures raise the real ``pynvml.NVMLError(code)`` (which maps to the ``NVMLError_*``
  subclasses),
- ``nvmlDeviceGetFieldValues`` returns a real ``pynvml.c_nvmlFieldValue_t`` array with a
  per-entry ``nvmlReturn``, ``valueType`` and value union,
- structs are the real ones (``nvmlPciInfo_t``, ``c_nvmlMemory_t``, ``c_nvmlEventData_t``,
  ...) and device handles are real ``c_nvmlDevice_t`` pointers.

The default device behaves like an H100 80GB HBM3 on driver 580 as probed on a real card
(see docs/real-gpu.md): retired-page fields NOT_SUPPORTED, row remapping supported, and
either no NVLink (every NVLink query NOT_SUPPORTED, as on a single-GPU machine) or 18
links. Faults can be injected per GPU (GPU_IS_LOST, any code on any call or field), and
every call is counted so tests can assert what was asked and how often.
"""

from __future__ import annotations

import ctypes
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml as _pynvml

NVMLError = _pynvml.NVMLError

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16

VT_UINT = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
VT_ULL = 3  # NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
VT_SINT = 5  # NVML_VALUE_TYPE_SIGNED_INT
_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

# Field ids this fake's driver "knows"; anything at or above is INVALID_ARGUMENT (as the
# 580 driver answers ids from a newer header).
DRIVER_FIELD_MAX = 303
LINK_FIELD_IDS = frozenset({161, 162, 163, 164, 165, 166})
HOPPER_NOT_SUPPORTED = frozenset({29, 30, 31, 92, 93, 38, 45, 52, 59, 160})
# An H100 on driver 580.159.04 also answered NOT_SUPPORTED for the per-location ECC field
# ids 7-20 (device memory 11/12 among them) while nvmlDeviceGetMemoryErrorCounter by
# location answered (tests/sources/test_gpu_fields.py, docs/real-gpu.md). ``h100_580()`` models it.
PER_LOCATION_ECC_FIELDS = frozenset(range(7, 21))


@dataclass
class FakeGpu:
    """One fake GPU. Change attributes between polls to script a test."""

    uuid: str
    pci_bus_id: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1654923012345"
    vbios: str = "96.00.99.00.01"
    nvlink_count: int = 0
    ecc_mode: tuple[int, int] = (1, 1)
    temperature: int = 33
    power_mw: int = 71_234
    energy_mj: int = 123_456_789
    sm_mhz: int = 345
    mem_mhz: int = 2619
    util_gpu: int = 0
    util_mem: int = 0
    memory_total: int = 81559 * MIB
    memory_used: int = 0
    memory_reserved: int = 616 * MIB
    violation_power_ns: int = 0
    violation_thermal_ns: int = 0
    clock_reasons: int = 0x1  # GpuIdle
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    thresholds: dict[int, int] = field(default_factory=lambda: {0: 95, 1: 89, 2: 95, 3: 87})
    margin_temperature: int = 54  # nvidia-smi showed 52-56 on an idle H100 and H200
    # Row-remapper histogram: banks with max, high, partial, low, none spare rows (an
    # H200 answered 3072 banks at max; docs/real-gpu.md).
    remap_histogram: tuple[int, int, int, int, int] = (3072, 0, 0, 0, 0)
    processes: list[tuple[int, int]] = field(default_factory=list)
    # (fieldId, scopeId) -> (valueType, value); scope 0 for GPU-wide fields.
    field_values: dict[tuple[int, int], tuple[int, float]] = field(default_factory=dict)
    not_supported_fields: set[int] = field(default_factory=lambda: set(HOPPER_NOT_SUPPORTED))
    field_errors: dict[int, int] = field(default_factory=dict)  # fieldId -> entry nvmlReturn
    call_errors: dict[str, int] = field(default_factory=dict)  # function -> code raised
    unsupported_calls: set[str] = field(default_factory=set)
    lost: bool = False
    xid_events_supported: bool = True
    # The NVLink fabric registration (NVSwitch systems) as NVML's nvmlGpuFabricInfo_t holds
    # it: (state, status); None answers NOT_SUPPORTED, as a GPU without an NVSwitch fabric
    # (PCIe, a single board) does.
    fabric: tuple[int, int] | None = None
    # link -> PCI bus id at its far end (an NVSwitch, NVML form); other links answer
    # NOT_SUPPORTED to nvmlDeviceGetNvLinkRemotePciInfo.
    nvlink_remote: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        defaults: dict[tuple[int, int], tuple[int, float]] = {
            (1, 0): (VT_UINT, self.ecc_mode[0]),
            (2, 0): (VT_UINT, self.ecc_mode[1]),
            (3, 0): (VT_ULL, 0),
            (4, 0): (VT_ULL, 0),
            (5, 0): (VT_ULL, 0),
            (6, 0): (VT_ULL, 0),
            (11, 0): (VT_ULL, 0),
            (12, 0): (VT_ULL, 0),
            (82, 0): (VT_UINT, 37),
            (83, 0): (VT_ULL, self.energy_mj),
            (94, 0): (VT_UINT, 0),
            (142, 0): (VT_UINT, 0),
            (143, 0): (VT_UINT, 0),
            (144, 0): (VT_UINT, 0),
            (145, 0): (VT_UINT, 0),
            (193, 0): (VT_SINT, -8),
            (194, 0): (VT_SINT, -2),
            (195, 0): (VT_SINT, 0),
            (196, 0): (VT_SINT, 0),
            (230, 0): (VT_UINT, 0),
        }
        if self.nvlink_count:
            defaults[(91, 0)] = (VT_UINT, self.nvlink_count)
            for link in range(self.nvlink_count):
                for fid in (161, 162, 163):
                    defaults[(fid, link)] = (VT_ULL, 0)
                defaults[(164, link)] = (VT_UINT, 26562)
                defaults[(165, link)] = (VT_UINT, 1)
                defaults[(166, link)] = (VT_UINT, 6)
        for key, value in defaults.items():
            self.field_values.setdefault(key, value)

    def set_field(
        self, field_id: int, value: float, scope: int = 0, value_type: int = VT_ULL
    ) -> None:
        self.field_values[(field_id, scope)] = (value_type, value)


def h100(index: int = 0, nvlink: bool = False, **kwargs: Any) -> FakeGpu:
    """An H100 80GB HBM3 like the probed one; ``nvlink`` gives it 18 links."""
    return FakeGpu(
        uuid=f"GPU-857ffced-0000-4000-8000-{index:012x}",
        pci_bus_id=f"00000000:{0x18 + 0x11 * index:02X}:00.0",
        nvlink_count=18 if nvlink else 0,
        **kwargs,
    )


class FakeNvml:
    """Module-like object: pass it as ``nvml=`` where the real ``pynvml`` would be used."""

    NVMLError = _pynvml.NVMLError
    nvmlMemory_v2 = _pynvml.nvmlMemory_v2

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        driver: str = "580.159.04",
        init_error: int | None = None,
        missing_functions: set[str] | frozenset[str] = frozenset(),
    ) -> None:
        self.gpus: list[FakeGpu] = gpus if gpus is not None else [h100(0)]
        self.driver = driver
        self.init_error = init_error
        self.missing_functions = set(missing_functions)
        self.calls: Counter[str] = Counter()
        # (gpu index, requested [(fieldId, scopeId), ...]) per nvmlDeviceGetFieldValues call
        self.field_requests: list[tuple[int, list[tuple[int, int]]]] = []
        self.initialised = 0
        self.wait_error: int | None = None  # code nvmlEventSetWait raises instead of waiting
        self._lock = threading.Lock()
        self._xid_arrived = threading.Condition(self._lock)  # wakes nvmlEventSetWait
        self._structs: list[Any] = []  # keeps handle targets alive
        self._handles: dict[int, tuple[int, Any]] = {}  # address -> (gpu index, handle)
        self._current: list[Any] = [self._new_handle(i) for i in range(len(self.gpus))]
        self._registered: dict[int, set[int]] = {}  # event set address -> gpu indexes
        self._event_sets: list[Any] = []
        self._xids: list[tuple[int, int]] = []  # (gpu index, xid)

    # -- attributes of the real module: constants and exception classes only ------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith(
            ("NVML_", "NVMLError_", "nvmlEventType", "nvmlClocks", "c_", "nvmlPciInfo")
        ):
            return getattr(_pynvml, name)
        raise AttributeError(name)

    # -- test controls -------------------------------------------------------------------

    def handle_of(self, index: int) -> Any:
        return self._current[index]

    def lose(self, index: int) -> None:
        """The GPU falls off the bus: every call about it answers GPU_IS_LOST."""
        self.gpus[index].lost = True

    def recover(self, index: int) -> None:
        """The GPU comes back after a reset, under a NEW handle; the old one stays dead."""
        self.gpus[index].lost = False
        self._current[index] = self._new_handle(index)

    def inject_xid(self, index: int, xid: int) -> None:
        with self._lock:
            self._xids.append((index, xid))
            self._xid_arrived.notify_all()

    def reset_counts(self) -> None:
        with self._lock:
            self.calls.clear()
            self.field_requests.clear()

    def field_value_calls(self, index: int | None = None) -> int:
        return sum(1 for i, _ in self.field_requests if index is None or i == index)

    def times_field_requested(self, field_id: int, index: int | None = None) -> int:
        return sum(
            1
            for i, ids in self.field_requests
            if index is None or i == index
            for fid, _ in ids
            if fid == field_id
        )

    # -- internals -----------------------------------------------------------------------

    def _new_handle(self, index: int) -> Any:
        target = _pynvml.struct_c_nvmlDevice_t()
        self._structs.append(target)
        handle = ctypes.pointer(target)
        self._handles[ctypes.addressof(target)] = (index, handle)
        return handle

    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] += 1

    def _check_name(self, name: str) -> None:
        self._count(name)
        if name in self.missing_functions:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if self.initialised <= 0:
            raise NVMLError(1)  # UNINITIALIZED

    def _gpu(self, name: str, handle: Any) -> tuple[int, FakeGpu]:
        self._check_name(name)
        try:
            address = ctypes.cast(handle, ctypes.c_void_p).value
        except (TypeError, ctypes.ArgumentError):
            address = None
        if address is None or address not in self._handles:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        index, _ = self._handles[address]
        gpu = self.gpus[index]
        if gpu.lost or self._current[index] is not self._handles[address][1]:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if name in gpu.call_errors:
            raise NVMLError(gpu.call_errors[name])
        if name in gpu.unsupported_calls:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return index, gpu

    def _nvlink(self, gpu: FakeGpu, link: int) -> None:
        if gpu.nvlink_count == 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_count:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)

    # -- library ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._check_name("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_name("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check_name("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check_name("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        return self._current[index]

    def _by(self, name: str, match: Any) -> Any:
        self._check_name(name)
        for i, gpu in enumerate(self.gpus):
            if match(gpu):
                if name in gpu.call_errors:
                    raise NVMLError(gpu.call_errors[name])
                if gpu.lost:
                    raise NVMLError(NVML_ERROR_GPU_IS_LOST)
                return self._current[i]
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> Any:
        return self._by("nvmlDeviceGetHandleByUUID", lambda g: g.uuid == uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> Any:
        return self._by(
            "nvmlDeviceGetHandleByPciBusId", lambda g: g.pci_bus_id.upper() == bus_id.upper()
        )

    # -- static ---------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle)[1].uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle)[1].name

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetSerial", handle)[1].serial

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetVbiosVersion", handle)[1].vbios

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)[1]
        info = _pynvml.nvmlPciInfo_t()
        domain, bus, device = gpu.pci_bus_id.split(":")
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{device}".encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(device.split(".")[0], 16)
        info.pciDeviceId = 0x233010DE
        return info

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        return list(self._gpu("nvmlDeviceGetEccMode", handle)[1].ecc_mode)

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperatureThreshold", handle)[1]
        if threshold not in gpu.thresholds:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return gpu.thresholds[threshold]

    # -- field values ---------------------------------------------------------------------

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        index, gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        requested = [(f[0], f[1]) if isinstance(f, tuple) else (int(f), 0) for f in field_ids]
        with self._lock:
            self.field_requests.append((index, requested))
        values = (_pynvml.c_nvmlFieldValue_t * len(requested))()
        for entry, (fid, scope) in zip(values, requested, strict=True):
            entry.fieldId = fid
            entry.scopeId = scope
            entry.timestamp = 1_767_225_600_000_000
            entry.latencyUsec = 0
            entry.nvmlReturn = self._field_return(gpu, fid, scope)
            if entry.nvmlReturn == NVML_SUCCESS:
                vtype, value = gpu.field_values[(fid, scope)]
                entry.valueType = vtype
                setattr(entry.value, _MEMBER[vtype], value)
        return values

    def _field_return(self, gpu: FakeGpu, fid: int, scope: int) -> int:
        if fid in gpu.field_errors:
            return gpu.field_errors[fid]
        if fid >= DRIVER_FIELD_MAX or fid <= 0:
            return NVML_ERROR_INVALID_ARGUMENT
        if fid in gpu.not_supported_fields:
            return NVML_ERROR_NOT_SUPPORTED
        if fid in LINK_FIELD_IDS or fid == 91:
            if gpu.nvlink_count == 0:
                return NVML_ERROR_NOT_SUPPORTED
            if fid != 91 and not 0 <= scope < gpu.nvlink_count:
                return NVML_ERROR_INVALID_ARGUMENT
        if (fid, scope) in gpu.field_values:
            return NVML_SUCCESS
        if (fid, 0) in gpu.field_values and fid not in LINK_FIELD_IDS:
            gpu.field_values[(fid, scope)] = gpu.field_values[(fid, 0)]
            return NVML_SUCCESS
        return NVML_ERROR_NOT_SUPPORTED

    # -- per-poll getters -----------------------------------------------------------------

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        return self._gpu("nvmlDeviceGetTemperature", handle)[1].temperature

    def nvmlDeviceGetTemperatureV(self, handle: Any, sensor: int, version: int = 0) -> int:
        return self._gpu("nvmlDeviceGetTemperatureV", handle)[1].temperature

    def nvmlDeviceGetMarginTemperature(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMarginTemperature", handle)[1].margin_temperature

    def nvmlDeviceGetRowRemapperHistogram(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetRowRemapperHistogram", handle)[1]
        return _pynvml.c_nvmlRowRemapperHistogramValues(*gpu.remap_histogram)

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle)[1].power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)[1].energy_mj

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)[1]
        return {1: gpu.sm_mhz, 2: gpu.mem_mhz}.get(clock_type, gpu.sm_mhz)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)[1]
        util = _pynvml.c_nvmlUtilization_t()
        util.gpu = gpu.util_gpu
        util.memory = gpu.util_mem
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        """v1 counts driver-reserved memory as used; v2 reports it apart (as on a real 580)."""
        name = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        gpu = self._gpu(name, handle)[1]
        if version:
            if version != _pynvml.nvmlMemory_v2:
                raise NVMLError(25)  # ARGUMENT_VERSION_MISMATCH
            mem = _pynvml.c_nvmlMemory_v2_t()
            mem.version = version
            mem.reserved = gpu.memory_reserved
            mem.used = gpu.memory_used
        else:
            mem = _pynvml.c_nvmlMemory_t()
            mem.used = gpu.memory_used + gpu.memory_reserved
        mem.total = gpu.memory_total
        mem.free = gpu.memory_total - gpu.memory_used - gpu.memory_reserved
        return mem

    def nvmlDeviceGetViolationStatus(self, handle: Any, policy: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetViolationStatus", handle)[1]
        out = _pynvml.c_nvmlViolationTime_t()
        out.referenceTime = 1_767_225_600_000_000
        out.violationTime = gpu.violation_power_ns if policy == 0 else gpu.violation_thermal_ns
        return out

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)[1].clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle)[1].clock_reasons

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle)[1].pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle)[1].pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle)[1].pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle)[1].pcie_width_max

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)[1]
        out = []
        for pid, used in gpu.processes:
            info = _pynvml.c_nvmlProcessInfo_v3_t()
            info.pid = pid
            info.usedGpuMemory = used
            info.gpuInstanceId = 0xFFFFFFFF
            info.computeInstanceId = 0xFFFFFFFF
            out.append(_pynvml.nvmlStructToFriendlyObject(info))
        return out

    # -- what a plain per-field loop uses (bench/poll_cpu.py) -----------------------------

    def _field_getter(self, name: str, handle: Any, fid: int, scope: int = 0) -> float:
        gpu = self._gpu(name, handle)[1]
        ret = self._field_return(gpu, fid, scope)
        if ret != NVML_SUCCESS:
            raise NVMLError(ret)
        return gpu.field_values[(fid, scope)][1]

    def nvmlDeviceGetMemoryErrorCounter(
        self, handle: Any, error_type: int, counter_type: int, location: int
    ) -> int:
        """Device memory (location 2) answers from the HBM fields' values, whether or not the
        field ids themselves are supported; other locations are not supported."""
        gpu = self._gpu("nvmlDeviceGetMemoryErrorCounter", handle)[1]
        if location != 2 or counter_type != 0:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return int(gpu.field_values[(11 + error_type, 0)][1])

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        fid = 3 + error_type + 2 * counter_type
        return int(self._field_getter("nvmlDeviceGetTotalEccErrors", handle, fid))

    def nvmlDeviceGetRetiredPages(self, handle: Any, cause: int) -> list[int]:
        self._field_getter("nvmlDeviceGetRetiredPages", handle, 29 + cause)
        return []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        return int(self._field_getter("nvmlDeviceGetRetiredPagesPendingStatus", handle, 31))

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        gpu = self._gpu("nvmlDeviceGetRemappedRows", handle)[1]
        return tuple(  # type: ignore[return-value]
            int(gpu.field_values[(fid, 0)][1]) for fid in (142, 143, 144, 145)
        )

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(self._field_getter("nvmlDeviceGetPcieReplayCounter", handle, 94))

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", handle)[1]
        self._nvlink(gpu, link)
        return 1 if gpu.field_values[(165, link)][1] == 1 else 0

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkErrorCounter", handle)[1]
        self._nvlink(gpu, link)
        fid = {0: 161, 1: 162, 2: 163}.get(counter)
        if fid is None:
            return 7  # CRC_DATA / ECC_DATA: non-zero on healthy Hopper links
        return int(gpu.field_values[(fid, link)][1])

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: Any, link: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetNvLinkRemotePciInfo", handle)[1]
        self._nvlink(gpu, link)
        bus_id = gpu.nvlink_remote.get(link)
        if bus_id is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = _pynvml.nvmlPciInfo_t()
        info.busId = bus_id.encode()
        return info

    def _fabric(self, name: str, handle: Any, ref: Any) -> int:
        gpu = self._gpu(name, handle)[1]
        if gpu.fabric is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        info = ref._obj  # the real pynvml passes ctypes.byref(struct) through to C
        info.state, info.status = gpu.fabric
        return NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfo", handle, info)

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", handle, info)

    # -- events ---------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._check_name("nvmlEventSetCreate")
        target = _pynvml.struct_c_nvmlEventSet_t()
        self._event_sets.append(target)
        self._registered[ctypes.addressof(target)] = set()
        return ctypes.pointer(target)

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        index, gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if not gpu.xid_events_supported:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if event_types & _pynvml.nvmlEventTypeXidCriticalError:
            self._registered[ctypes.addressof(event_set.contents)].add(index)

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        self._check_name("nvmlEventSetWait")
        if self.wait_error is not None:
            raise NVMLError(self.wait_error)
        registered = self._registered.get(ctypes.addressof(event_set.contents), set())
        with self._lock:  # blocks like the driver: until an XID comes or the timeout
            self._xid_arrived.wait_for(
                lambda: any(index in registered for index, _ in self._xids),
                max(0, timeout_ms) / 1000.0,
            )
            pending = [i for i, (index, _) in enumerate(self._xids) if index in registered]
            if not pending:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            index, xid = self._xids.pop(pending[0])
        data = _pynvml.c_nvmlEventData_t()
        data.device = self._current[index]
        data.eventType = _pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = 0xFFFFFFFF
        data.computeInstanceId = 0xFFFFFFFF
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._check_name("nvmlEventSetFree")
        self._registered.pop(ctypes.addressof(event_set.contents), None)
