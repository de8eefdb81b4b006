"""The real backend: NVIDIA GPUs through NVML (nvidia-ml-py, ``import pynvml``).

Design notes (facts behind them: docs/real-gpu.md and the shared NVML reference):

- Everything NVML exposes as a field id is read with ONE ``nvmlDeviceGetFieldValues`` call
  per GPU per poll: the GPU fields and every NVLink counter, as ``(fieldId, scopeId)``
  pairs. Each entry carries its own return code, which is checked before the value union
  is read by its ``valueType``. Only ids below 251 are used: 251 and up were renumbered
  between pynvml 12 and 13.
- A field or call that answers NOT_SUPPORTED (or FUNCTION_NOT_FOUND; for field ids also
  INVALID_ARGUMENT, which is how a driver answers an id it does not know) is remembered per
  GPU and never asked again. Other per-field failures go into ``GpuSample.errors``.
- GPU_IS_LOST anywhere raises ``GpuLost``; RESET_REQUIRED raises ``ResetRequired``. The
  next ``sample`` of that GPU looks for a fresh handle (by UUID, then PCI bus id), so a GPU
  that comes back after a reset is sampled again.
- A few readings cost the driver milliseconds of CPU each (measured on an H200 with driver
  580: total energy 4 ms, each violation counter 0.75 ms, PCIe replays 0.15 ms; every
  other reading about 10 us or less). These SLOW fields are read every ``slow_interval_s``
  (default 20 s) and their last values are carried in the samples between reads; 0 reads
  everything on every poll. See docs/PERFORMANCE.md.
- Derived fields (``core.fields.add_derived_fields``): SRAM ECC counts are the totals
  minus the device-memory counts of the same batch (no extra call; NVML's own
  ``nvmlDeviceGetSramEccErrorStatus`` is a versioned struct call that older drivers lack),
  and the HBM margin is the memory max temperature, read once per GPU with the other
  thresholds, minus the HBM temperature. The config's extra field ids (``fields``) ride
  in the same batch as the built-in ones.
- Per-GPU state is separate and guarded by its own lock, so one thread per GPU can poll
  concurrently. pynvml itself is safe to call from several threads.
- pynvml is imported lazily (``nvml`` is the seam: tests pass a fake module object).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import (
    BackendError,
    BackendUnavailable,
    GpuLost,
    NotSupported,
    ResetRequired,
)
from gpuwatchd.core.fields import ROW_REMAP_AVAILABILITY, ExtraField, add_derived_fields
from gpuwatchd.core.records import GpuInfo, GpuSample, LinkSample, ProcessInfo, XidEvent

log = logging.getLogger(__name__)

# --- NVML numbers (nvml.h; identical in pynvml 12.x and 13.x) --------------------------

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16

_CODE_NAMES: dict[int, str] = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    30: "RESET_TYPE_NOT_SUPPORTED",
    999: "UNKNOWN",
}

# A call answering one of these will never work on this GPU with this driver.
_CALL_UNSUPPORTED = frozenset({NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND})
NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0
NVML_GPU_FABRIC_STATE_COMPLETED = 3
FABRIC_CALL = "nvmlDeviceGetGpuFabricInfo"  # its key in _Gpu.bad_calls (V or not)
# A field entry answering one of these likewise (INVALID_ARGUMENT: id unknown to the driver).
_FIELD_UNSUPPORTED = _CALL_UNSUPPORTED | {NVML_ERROR_INVALID_ARGUMENT}

# Field ids (NVML_FI_*). All < 251: see the module docstring.
FI_DEV_ECC_CURRENT = 1
FI_DEV_ECC_PENDING = 2
FI_DEV_ECC_SBE_VOL_TOTAL = 3
FI_DEV_ECC_SBE_VOL_DEV = 11
FI_DEV_ECC_DBE_VOL_DEV = 12
FI_DEV_ECC_DBE_VOL_TOTAL = 4
FI_DEV_ECC_SBE_AGG_TOTAL = 5
FI_DEV_ECC_DBE_AGG_TOTAL = 6
FI_DEV_RETIRED_SBE = 29
FI_DEV_RETIRED_DBE = 30
FI_DEV_RETIRED_PENDING = 31
FI_DEV_MEMORY_TEMP = 82
FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83  # mJ since the driver loaded
FI_DEV_NVLINK_LINK_COUNT = 91
FI_DEV_PCIE_REPLAY_COUNTER = 94
FI_DEV_REMAPPED_COR = 142
FI_DEV_REMAPPED_UNC = 143
FI_DEV_REMAPPED_PENDING = 144
FI_DEV_REMAPPED_FAILURE = 145
FI_DEV_NVLINK_CRC_FLIT_TOTAL = 38
FI_DEV_NVLINK_CRC_DATA_TOTAL = 45
FI_DEV_NVLINK_REPLAY_TOTAL = 52
FI_DEV_NVLINK_RECOVERY_TOTAL = 59
FI_DEV_NVLINK_ERROR_DL_REPLAY = 161
FI_DEV_NVLINK_ERROR_DL_RECOVERY = 162
FI_DEV_NVLINK_ERROR_DL_CRC = 163
FI_DEV_GET_GPU_RECOVERY_ACTION = 230

NVLINK_STATE_ACTIVE = 1

# Enum values used with getters.
NVML_TEMPERATURE_GPU = 0
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
EVENT_TYPE_XID_CRITICAL_ERROR = 0x8

# Value union member by nvmlValueType_t.
_VALUE_MEMBERS: dict[int, str] = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


@dataclass(frozen=True)
class _FieldSpec:
    name: str  # key in gpuwatchd.core.fields.GPU_FIELDS / LINK_FIELDS
    field_id: int
    scale: float = 1.0
    slow: bool = False  # costly for the driver: read every slow_interval_s only
    sentinel: bool = False  # not a reading: a GPU-wide total that says "read the links now"


GPU_FIELD_IDS: tuple[_FieldSpec, ...] = (
    _FieldSpec("temperature_memory", FI_DEV_MEMORY_TEMP),
    _FieldSpec("energy", FI_DEV_TOTAL_ENERGY_CONSUMPTION, 1e-3, slow=True),
    _FieldSpec("ecc_corrected_volatile", FI_DEV_ECC_SBE_VOL_TOTAL),
    _FieldSpec("ecc_uncorrected_volatile", FI_DEV_ECC_DBE_VOL_TOTAL),
    _FieldSpec("ecc_corrected_volatile_dev", FI_DEV_ECC_SBE_VOL_DEV),
    _FieldSpec("ecc_uncorrected_volatile_dev", FI_DEV_ECC_DBE_VOL_DEV),
    _FieldSpec("ecc_corrected_aggregate", FI_DEV_ECC_SBE_AGG_TOTAL),
    _FieldSpec("ecc_uncorrected_aggregate", FI_DEV_ECC_DBE_AGG_TOTAL),
    _FieldSpec("retired_pages_sbe", FI_DEV_RETIRED_SBE),
    _FieldSpec("retired_pages_dbe", FI_DEV_RETIRED_DBE),
    _FieldSpec("retired_pages_pending", FI_DEV_RETIRED_PENDING),
    _FieldSpec("remapped_rows_correctable", FI_DEV_REMAPPED_COR),
    _FieldSpec("remapped_rows_uncorrectable", FI_DEV_REMAPPED_UNC),
    _FieldSpec("remapped_rows_pending", FI_DEV_REMAPPED_PENDING),
    _FieldSpec("remapped_rows_failure", FI_DEV_REMAPPED_FAILURE),
    _FieldSpec("pcie_replay", FI_DEV_PCIE_REPLAY_COUNTER, slow=True),
    _FieldSpec("recovery_action", FI_DEV_GET_GPU_RECOVERY_ACTION),
)

# GPU-wide NVLink error totals (a few us for all four, against ~13 ms of driver CPU for one
# per-link counter on 18 links of an H200): read every poll while links are polled; when one
# moves, the per-link counters are read in the same poll, so a link's errors are attributed
# at once. A GPU that answers NOT_SUPPORTED for them has its links read on the link cadence.
NVLINK_SENTINELS: tuple[_FieldSpec, ...] = (
    _FieldSpec("nvlink_crc_flit_total", FI_DEV_NVLINK_CRC_FLIT_TOTAL, sentinel=True),
    _FieldSpec("nvlink_crc_data_total", FI_DEV_NVLINK_CRC_DATA_TOTAL, sentinel=True),
    _FieldSpec("nvlink_replay_total", FI_DEV_NVLINK_REPLAY_TOTAL, sentinel=True),
    _FieldSpec("nvlink_recovery_total", FI_DEV_NVLINK_RECOVERY_TOTAL, sentinel=True),
)

# HBM ECC through nvmlDeviceGetMemoryErrorCounter when the field ids are not supported
# (field 11/12 answered NOT_SUPPORTED on an H100 with driver 580.159.04, while the counter
# by location answered): (field, nvmlMemoryErrorType_t, field id it stands in for).
NVML_VOLATILE_ECC = 0
HBM_ECC_FALLBACKS: tuple[tuple[str, int, int], ...] = (
    ("ecc_corrected_volatile_dev", 0, FI_DEV_ECC_SBE_VOL_DEV),
    ("ecc_uncorrected_volatile_dev", 1, FI_DEV_ECC_DBE_VOL_DEV),
)

# The row-remapper histogram (one getter): field name per member of its struct.
ROW_REMAP_FIELDS: tuple[tuple[str, str], ...] = tuple(
    (f"row_remap_banks_{level}", level) for level in ROW_REMAP_AVAILABILITY
)

# Fields read only every slow_interval_s (the batch ones above marked slow, and getters).
SLOW_FIELDS = frozenset(
    {s.name for s in GPU_FIELD_IDS if s.slow}
    | {"violation_power", "violation_thermal"}
    | {"temperature_gpu_margin"}
    | {"fabric_state", "fabric_status"}
)
# Measured on a busy 4 x H200 host (docs/PERFORMANCE.md): energy 4 ms of driver CPU per
# read, each violation counter 0.7-1.2 ms, the margin temperature 0.9 ms, PCIe replays
# 0.15 ms: about 7 ms per GPU, so every two minutes. No shipped rule reads them; they are
# metrics, and a counter read two minutes late loses nothing for rate().
DEFAULT_SLOW_INTERVAL_S = 120.0
# The per-link error counters when no GPU-wide total says they moved: a safety net.
DEFAULT_LINK_COUNTERS_INTERVAL_S = 600.0
# State that changes rarely and whose rules wait minutes anyway (NvlinkLinkDown: 1m,
# pcie_downtrained and stuck_workload: 10m): NVLink link state, compute processes, PCIe
# link generation and width. Read cold on a busy H200 these cost 1.5 ms (18 links), 0.5 ms
# and 0.25 ms of CPU per GPU, most of a 1 s poll (bench/nvml_call_cost.py --gap).
DEFAULT_STATE_INTERVAL_S = 15.0
STATE_FIELDS = frozenset({"compute_processes", "pcie_link_generation", "pcie_link_width"})

# The per-link data-link error counters (~0.75 ms of driver CPU per link each on an H200:
# 40 ms for the three on 18 links). Read when a sentinel total moved, on the link cadence,
# and on the first poll. Link state is not a field here: ``nvmlDeviceGetNvLinkState`` is
# as cheap as field 165 read cold (1.5 ms for 18 links) and 10x cheaper in a hot loop.
LINK_FIELD_IDS: tuple[_FieldSpec, ...] = (
    _FieldSpec("nvlink_replay_errors", FI_DEV_NVLINK_ERROR_DL_REPLAY),
    _FieldSpec("nvlink_recovery_errors", FI_DEV_NVLINK_ERROR_DL_RECOVERY),
    _FieldSpec("nvlink_crc_errors", FI_DEV_NVLINK_ERROR_DL_CRC),
)

# libnvidia-ml 580.159.04 corrupts the process heap when nvmlDeviceGetFieldValues runs on
# two threads at once (docs/real-gpu.md: 2 x H100 and 4 x H200, busy with NCCL; dead in
# 2-3 s under glibc's malloc checker, alive for the whole run with only this call
# serialised). One lock for every field-values call in the process; a GPU whose read
# cannot get it within FIELD_LOCK_WAIT_S reports its fields as errors for that poll
# instead of waiting behind another GPU's stuck call.
_FIELD_VALUES_LOCK = threading.Lock()
FIELD_LOCK_WAIT_S = 2.0

# --- error conversion: the one place NVML errors become gpuwatchd errors ---------------


def nvml_code(exc: BaseException) -> int | None:
    """The nvmlReturn_t code of a pynvml ``NVMLError`` (None for anything else)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def describe_code(code: int | None) -> str:
    if code is None:
        return "unknown NVML failure"
    return f"NVML_ERROR_{_CODE_NAMES.get(code, 'CODE')} ({code})"


def error_from_code(code: int | None, what: str) -> BackendError:
    """Map an NVML return code to the gpuwatchd error class callers act on."""
    text = f"{what}: {describe_code(code)}"
    if code == NVML_ERROR_GPU_IS_LOST:
        return GpuLost(text + ": the GPU has fallen off the bus or is inaccessible", code)
    if code == NVML_ERROR_RESET_REQUIRED:
        return ResetRequired(text + ": the GPU needs a reset", code)
    if code in _CALL_UNSUPPORTED:
        return NotSupported(text, code)
    return BackendError(text, code)


def nvml_error(exc: BaseException, what: str) -> BackendError:
    return error_from_code(nvml_code(exc), what)


def _unavailable(exc: BaseException, what: str) -> BackendUnavailable:
    code = nvml_code(exc)
    hints = {
        9: "the NVIDIA kernel driver is not loaded",
        12: "libnvidia-ml.so.1 was not found: is the NVIDIA driver installed?",
        18: "the NVML library and the kernel driver differ in version "
        "(driver upgraded without a reboot?)",
        4: "no permission to open the NVIDIA device files",
        28: "NVML found no GPUs",
    }
    hint = hints.get(code if code is not None else -1, str(exc) or describe_code(code))
    return BackendUnavailable(f"NVML unavailable: {what}: {hint} [{describe_code(code)}]", code)


def _handle_key(handle: Any) -> int | None:
    """The address an NVML device handle points at (handles compare by identity)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def decode_field_value(entry: Any) -> float:
    """The value of one successful ``c_nvmlFieldValue_t``, read by its ``valueType``."""
    member = _VALUE_MEMBERS.get(entry.valueType)
    if member is None:
        raise ValueError(f"unknown NVML valueType {entry.valueType}")
    return float(getattr(entry.value, member))


class _RawDecoder:
    """Reads a whole ``c_nvmlFieldValue_t`` array from its bytes in one pass.

    pynvml's structs answer every attribute read through a Python-level
    ``__getattribute__``; unpacking the raw buffer is several times cheaper. The layout is
    taken from the ctypes class itself (offsets, sizes), so a changed struct either still
    decodes right or is refused here (then the attribute path is used).
    """

    def __init__(self, elem: Any) -> None:
        vtype, ret, value = elem.valueType, elem.nvmlReturn, elem.value
        size = ctypes.sizeof(elem)
        if vtype.size != 4 or ret.size != 4 or ret.offset != vtype.offset + 4:
            raise ValueError("unexpected c_nvmlFieldValue_t layout")
        if value.size < 8 or value.offset + 8 > size:
            raise ValueError("unexpected c_nvmlFieldValue_t layout")
        self.size = size
        self.value_offset = value.offset
        self.head = struct.Struct(f"={vtype.offset}xII{size - vtype.offset - 8}x")
        ulong = "Q" if ctypes.sizeof(ctypes.c_ulong) == 8 else "I"
        formats = {0: "d", 1: "I", 2: ulong, 3: "Q", 4: "q", 5: "i", 6: "H"}
        self.values = {t: struct.Struct("=" + f) for t, f in formats.items()}

    def __call__(self, values: Any) -> list[tuple[int, float | None]]:
        raw = ctypes.string_at(ctypes.addressof(values), ctypes.sizeof(values))
        out: list[tuple[int, float | None]] = []
        at = self.value_offset
        for vtype, ret in self.head.iter_unpack(raw):
            if ret == NVML_SUCCESS:
                fmt = self.values.get(vtype)
                out.append((ret, float(fmt.unpack_from(raw, at)[0]) if fmt else None))
            else:
                out.append((ret, None))
            at += self.size
        return out


_DECODERS: dict[Any, _RawDecoder | None] = {}


def read_field_values(values: Any, raw: bool = True) -> list[tuple[int, float | None]]:
    """``(nvmlReturn, value)`` per entry of a ``nvmlDeviceGetFieldValues`` answer.

    ``value`` is None unless the entry succeeded with a known ``valueType``. ``raw=False``
    forces the attribute-by-attribute path (tests compare the two).
    """
    decoder: _RawDecoder | None = None
    if raw and isinstance(values, ctypes.Array):
        elem = values._type_
        if elem not in _DECODERS:
            try:
                _DECODERS[elem] = _RawDecoder(elem)
            except (AttributeError, ValueError, TypeError, struct.error):
                _DECODERS[elem] = None
        decoder = _DECODERS[elem]
        if decoder is not None and ctypes.sizeof(values) != decoder.size * len(values):
            decoder = None
    if decoder is not None:
        return decoder(values)
    out: list[tuple[int, float | None]] = []
    for entry in values:
        ret = int(entry.nvmlReturn)
        if ret != NVML_SUCCESS:
            out.append((ret, None))
            continue
        try:
            out.append((ret, decode_field_value(entry)))
        except ValueError:
            out.append((ret, None))
    return out


class _Fallbacks:
    """One logical call with alternatives, newest first: the first that works wins.

    FUNCTION_NOT_FOUND (the loaded driver lacks the symbol), ARGUMENT_VERSION_MISMATCH or
    NOT_SUPPORTED from one alternative moves on to the next, once for the whole backend; a
    pynvml without a wrapper skips it. When the last alternative fails, its error stands.
    """

    _MOVE_ON = frozenset({NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, 25})

    def __init__(self, nvml: Any, alternatives: Sequence[str | Callable[..., Any]]) -> None:
        self._fns: list[Callable[..., Any]] = [
            getattr(nvml, a) if isinstance(a, str) else a
            for a in alternatives
            if not isinstance(a, str) or hasattr(nvml, a)
        ]
        self._nvml = nvml
        self._i = 0
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        while True:
            i = self._i
            if i >= len(self._fns):
                raise self._nvml.NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            try:
                return self._fns[i](*args)
            except self._nvml.NVMLError as exc:
                if nvml_code(exc) not in self._MOVE_ON or i + 1 >= len(self._fns):
                    raise
                with self._lock:
                    self._i = max(self._i, i + 1)


# --- per-GPU state ---------------------------------------------------------------------


class _Gpu:
    """Everything the backend keeps about one GPU; touched only under ``lock``."""

    def __init__(
        self,
        index: int,
        handle: Any,
        info: GpuInfo,
        extra: tuple[_FieldSpec, ...] = (),
        nvlink: bool = True,
    ) -> None:
        self.index = index
        self.extra = extra  # the config's extra field ids, after the built-in ones
        self.info = info
        self.lock = threading.Lock()
        self.handle = handle
        self.lost = handle is None
        self.nvlink = nvlink  # the config's poll.nvlink
        self.nvlink_count = info.nvlink_count if nvlink else 0
        self.bad_fields: set[tuple[int, int]] = set()  # (fieldId, scopeId)
        self.bad_calls: set[str] = set()
        self.bad_link_state: set[int] = set()  # links whose state getter is NOT_SUPPORTED
        self.pcie_max: dict[str, float] = {}
        # field-value batches: everything (full) and without the slow fields (fast)
        self.full_ids: list[tuple[int, int]] = []
        self.full_specs: list[tuple[_FieldSpec, int | None]] = []
        self.fast_ids: list[tuple[int, int]] = []
        self.fast_specs: list[tuple[_FieldSpec, int | None]] = []
        self.link_ids: list[tuple[int, int]] = []
        self.link_specs: list[tuple[_FieldSpec, int | None]] = []
        self.batch_dirty = True
        # slow fields: when next due (clock.monotonic), and their last values
        self.slow_due: float | None = None
        self.slow_values: dict[str, float] = {}
        # slowly changing state (link state, processes, PCIe link): when due, last values
        self.state_due: float | None = None
        self.state_fields: dict[str, float] = {}
        self.state_processes: tuple[ProcessInfo, ...] = ()
        self.link_up: dict[int, float] = {}
        # per-link error counters: when next due, the sentinels that last saw them, values
        self.links_due: float | None = None
        self.sentinels: dict[str, float] = {}
        self.link_values: list[dict[str, float]] = []
        self.links: tuple[LinkSample, ...] | None = None  # as last sampled
        # XID events
        self.events_registered = False
        self.events_unsupported = False

    def rebuild_batch(self) -> None:
        ids: list[tuple[int, int]] = []
        specs: list[tuple[_FieldSpec, int | None]] = []
        sentinels = NVLINK_SENTINELS if self.nvlink_count else ()
        for spec in (*GPU_FIELD_IDS, *self.extra, *sentinels):
            if (spec.field_id, 0) not in self.bad_fields:
                ids.append((spec.field_id, 0))
                specs.append((spec, None))
        self.full_ids = ids
        self.full_specs = specs
        fast = [i for i, (spec, _) in enumerate(specs) if not spec.slow]
        self.fast_ids = [ids[i] for i in fast]
        self.fast_specs = [specs[i] for i in fast]
        self.link_ids = []
        self.link_specs = []
        for link in range(self.nvlink_count):
            for spec in LINK_FIELD_IDS:
                if (spec.field_id, link) not in self.bad_fields:
                    self.link_ids.append((spec.field_id, link))
                    self.link_specs.append((spec, link))
        self.batch_dirty = False

    def not_supported(self) -> list[str]:
        by_id = {s.field_id: s.name for s in (*GPU_FIELD_IDS, *LINK_FIELD_IDS, *NVLINK_SENTINELS)}
        by_id.update((s.field_id, s.name) for s in self.extra if s.field_id not in by_id)
        link_ids = {s.field_id for s in LINK_FIELD_IDS}
        out = []
        for fid, scope in sorted(self.bad_fields):
            where = f" link {scope}" if fid in link_ids else ""
            out.append(f"field {fid} ({by_id.get(fid, '?')}){where}")
        out.extend(f"call {c}" for c in sorted(self.bad_calls))
        out.extend(f"call nvmlDeviceGetNvLinkState link {i}" for i in sorted(self.bad_link_state))
        return out


# --- the backend -----------------------------------------------------------------------


class NvmlBackend:
    """Backend on real NVIDIA GPUs. ``nvml`` replaces the pynvml module (tests, bench)."""

    name = "nvml"

    def __init__(
        self,
        clock: Clock,
        nvml: Any | None = None,
        slow_interval_s: float = DEFAULT_SLOW_INTERVAL_S,
        extra_fields: tuple[ExtraField, ...] = (),
        *,
        link_interval_s: float = DEFAULT_LINK_COUNTERS_INTERVAL_S,
        nvlink: bool = True,
        processes: bool = True,
        state_interval_s: float = DEFAULT_STATE_INTERVAL_S,
    ) -> None:
        self._clock = clock
        self._link_interval = max(0.0, link_interval_s)
        self._state_interval = max(0.0, state_interval_s)
        self._nvlink = nvlink  # the config's poll.nvlink: links not read at all when off
        self._processes = processes  # poll.processes
        # The config's ``fields`` section: asked in the same field-values call.
        self._extra = tuple(_FieldSpec(e.name, e.field_id, e.scale, e.slow) for e in extra_fields)
        self._slow_fields = SLOW_FIELDS | {e.name for e in extra_fields if e.slow}
        self._slow_interval = max(0.0, slow_interval_s)
        self._nvml_arg = nvml
        self._nvml: Any = None
        self._gpus: list[_Gpu] = []
        self._infos: list[GpuInfo] = []
        self._open = False
        self._stop = threading.Event()
        self._event_lock = threading.Lock()
        self._event_set: Any = None
        self._events_unavailable = False
        self._temperature: _Fallbacks | None = None
        self._hbm_counter: _Fallbacks | None = None
        self._clock_reasons: _Fallbacks | None = None
        self._memory_info: _Fallbacks | None = None

    # -- open / close --------------------------------------------------------------------

    def _load(self) -> Any:
        if self._nvml_arg is not None:
            return self._nvml_arg
        try:
            import pynvml
        except ImportError as exc:
            raise BackendUnavailable(
                "NVML unavailable: the Python package nvidia-ml-py (module pynvml) is not "
                f"installed ({exc})"
            ) from exc
        return pynvml

    def open(self) -> list[GpuInfo]:
        if self._open:
            return list(self._infos)
        nv = self._load()
        self._nvml = nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise _unavailable(exc, "nvmlInit") from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
        except nv.NVMLError as exc:
            self._shutdown_quietly()
            raise _unavailable(exc, "nvmlDeviceGetCount") from exc
        if count <= 0:
            self._shutdown_quietly()
            raise BackendUnavailable("NVML unavailable: NVML initialised but found no GPUs")
        self._temperature = _Fallbacks(
            nv, ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature")
        )
        self._clock_reasons = _Fallbacks(
            nv,
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"),
        )
        # v2 reports driver-reserved memory apart, so "used" matches nvidia-smi's Used
        memory_v2 = getattr(nv, "nvmlMemory_v2", None)
        self._memory_info = _Fallbacks(
            nv,
            [
                *([functools.partial(_memory_info_v2, nv, memory_v2)] if memory_v2 else []),
                "nvmlDeviceGetMemoryInfo",
            ],
        )
        # HBM ECC counts when fields 11/12 answer NOT_SUPPORTED (an H100 on driver 580 does):
        # the memory-error counter by location, DRAM (Turing and later) then device memory
        self._hbm_counter = _Fallbacks(
            nv,
            [
                functools.partial(_memory_error_counter, nv, "NVML_MEMORY_LOCATION_DRAM"),
                functools.partial(_memory_error_counter, nv, "NVML_MEMORY_LOCATION_DEVICE_MEMORY"),
            ],
        )
        driver = self._try_static(nv.nvmlSystemGetDriverVersion, default="")
        gpus = [self._open_gpu(i, str(driver)) for i in range(count)]
        self._gpus = gpus
        self._infos = [g.info for g in gpus]
        self._open = True
        self._stop.clear()
        return list(self._infos)

    def _try_static(self, fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return default

    def _open_gpu(self, index: int, driver: str) -> _Gpu:
        nv = self._nvml
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError:
            # Keep the slot: the first sample() reports the GPU as lost and retries by
            # index; identity is read once a handle comes.
            info = GpuInfo(index=index, uuid="", name="", pci_bus_id="", driver=driver)
            return _Gpu(index, None, info, self._extra, self._nvlink)
        info = self._read_info(index, handle, driver)
        return _Gpu(index, handle, info, self._extra, self._nvlink)

    def _read_info(self, index: int, handle: Any, driver: str) -> GpuInfo:
        """Static facts of one GPU; each read may fail alone and leaves its default."""
        nv = self._nvml

        def get(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
            return self._try_static(fn, handle, *args, default=default)

        uuid = str(get(nv.nvmlDeviceGetUUID, default=""))
        name = str(get(nv.nvmlDeviceGetName, default=""))
        pci = get(nv.nvmlDeviceGetPciInfo)
        pci_bus_id = str(getattr(pci, "busId", "")) if pci is not None else ""
        serial = str(get(nv.nvmlDeviceGetSerial, default=""))
        vbios = str(get(nv.nvmlDeviceGetVbiosVersion, default=""))

        static = self._static_fields(handle)
        ecc_cur = static.get(FI_DEV_ECC_CURRENT)
        ecc_pend = static.get(FI_DEV_ECC_PENDING)
        if ecc_cur is None or ecc_pend is None:
            mode = get(nv.nvmlDeviceGetEccMode)
            if mode is not None:
                ecc_cur = float(mode[0]) if ecc_cur is None else ecc_cur
                ecc_pend = float(mode[1]) if ecc_pend is None else ecc_pend
        links = static.get(FI_DEV_NVLINK_LINK_COUNT)

        # Absolute thresholds come from nvmlDeviceGetTemperatureThreshold: the only
        # threshold field ids (193-196, *_TLIMIT) are positions on the relative T.Limit
        # scale (-8, -2, 0, 0 on an H100), not degrees Celsius.
        def threshold(kind: int) -> float | None:
            value = get(nv.nvmlDeviceGetTemperatureThreshold, kind)
            return float(value) if value is not None else None

        return GpuInfo(
            index=index,
            uuid=uuid,
            name=name,
            pci_bus_id=pci_bus_id,
            serial=serial,
            vbios=vbios,
            driver=driver,
            ecc_enabled=None if ecc_cur is None else bool(ecc_cur),
            ecc_pending=None if ecc_pend is None else bool(ecc_pend),
            slowdown_temperature=threshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
            shutdown_temperature=threshold(NVML_TEMPERATURE_THRESHOLD_SHUTDOWN),
            memory_max_temperature=threshold(NVML_TEMPERATURE_THRESHOLD_MEM_MAX),
            nvlink_count=int(links) if links is not None else 0,
            nvlink_peers=self._link_peers(handle, int(links) if links is not None else 0),
        )

    def _link_peers(self, handle: Any, links: int) -> tuple[str, ...]:
        """The distinct PCI bus ids at the far end of the GPU's NVLinks (NVSwitches on an
        HGX board), read once at open; () where NVML does not say (no NVLink, or a link
        that answers NOT_SUPPORTED)."""
        getter = getattr(self._nvml, "nvmlDeviceGetNvLinkRemotePciInfo", None)
        if getter is None:
            return ()
        peers: set[str] = set()
        for link in range(min(links, 64)):
            info = self._try_static(getter, handle, link)
            bus_id = getattr(info, "busId", None) if info is not None else None
            if isinstance(bus_id, bytes):
                bus_id = bus_id.decode("ascii", "replace")
            if isinstance(bus_id, str) and 0 < len(bus_id) <= 32:
                peers.add(bus_id.upper())
        return tuple(sorted(peers))

    def _static_fields(self, handle: Any) -> dict[int, float]:
        ids = [(FI_DEV_ECC_CURRENT, 0), (FI_DEV_ECC_PENDING, 0), (FI_DEV_NVLINK_LINK_COUNT, 0)]
        out: dict[int, float] = {}
        try:
            decoded = self._field_values(handle, ids, wait_s=-1)  # at open: wait its turn
        except self._nvml.NVMLError:
            return out
        assert decoded is not None  # waited for the lock
        for (fid, _), (ret, value) in zip(ids, decoded, strict=False):
            if ret == NVML_SUCCESS and value is not None:
                out[fid] = value
        return out

    def close(self) -> None:
        self._stop.set()
        if not self._open:
            return
        with self._event_lock:
            if self._event_set is not None:
                self._try_static(self._nvml.nvmlEventSetFree, self._event_set)
                self._event_set = None
            self._open = False
        self._shutdown_quietly()

    def _shutdown_quietly(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()

    # -- introspection (docs, bench, tests) --------------------------------------------

    def infos(self) -> list[GpuInfo]:
        return list(self._infos)

    def not_supported(self, index: int) -> list[str]:
        """What this GPU answered NOT_SUPPORTED (or unknown) so far; never asked again."""
        gpu = self._gpu(index)
        with gpu.lock:
            return gpu.not_supported()

    def field_batch(self, index: int, full: bool = True) -> list[tuple[int, int]]:
        """The ``(fieldId, scopeId)`` list a poll of this GPU asks in its GPU-wide call
        (``full``: a poll that also reads the slow fields)."""
        gpu = self._gpu(index)
        with gpu.lock:
            if gpu.batch_dirty:
                gpu.rebuild_batch()
            return list(gpu.full_ids if full else gpu.fast_ids)

    def link_batch(self, index: int) -> list[tuple[int, int]]:
        """The per-link error counters asked when they are due (a second call)."""
        gpu = self._gpu(index)
        with gpu.lock:
            if gpu.batch_dirty:
                gpu.rebuild_batch()
            return list(gpu.link_ids)

    # -- sampling -------------------------------------------------------------------------

    def _gpu(self, index: int) -> _Gpu:
        if not self._open:
            raise BackendError("NVML backend is not open")
        if not 0 <= index < len(self._gpus):
            raise BackendError(f"no GPU with index {index} (NVML has {len(self._gpus)})")
        return self._gpus[index]

    def sample(self, index: int) -> GpuSample:
        gpu = self._gpu(index)
        with gpu.lock:
            start = time.perf_counter()
            timestamp = self._clock.now()
            handle = self._ensure_handle(gpu)
            try:
                fields, links, processes, errors = self._poll(gpu, handle)
            except (GpuLost, ResetRequired):
                gpu.lost = True
                raise
            duration = time.perf_counter() - start
        return GpuSample(
            gpu=index,
            uuid=gpu.info.uuid,
            timestamp=timestamp,
            fields=MappingProxyType(fields),
            links=links,
            processes=processes,
            duration_seconds=duration,
            errors=MappingProxyType(errors),
        )

    def _ensure_handle(self, gpu: _Gpu) -> Any:
        """The GPU's handle; after a loss, a fresh one by UUID, then PCI bus id (or index)."""
        if not gpu.lost:
            return gpu.handle
        nv = self._nvml
        tries: list[tuple[str, Callable[..., Any], Any]] = []
        if gpu.info.uuid:
            tries.append(("nvmlDeviceGetHandleByUUID", nv.nvmlDeviceGetHandleByUUID, gpu.info.uuid))
        if gpu.info.pci_bus_id:
            tries.append(
                (
                    "nvmlDeviceGetHandleByPciBusId",
                    nv.nvmlDeviceGetHandleByPciBusId,
                    gpu.info.pci_bus_id,
                )
            )
        if not tries:  # never identified (handle by index failed at open)
            tries.append(("nvmlDeviceGetHandleByIndex", nv.nvmlDeviceGetHandleByIndex, gpu.index))
        last: BackendError | None = None
        for what, fn, arg in tries:
            try:
                handle = fn(arg)
            except nv.NVMLError as exc:
                last = nvml_error(exc, f"GPU {gpu.index}: {what}")
                continue
            if not gpu.info.uuid:  # first handle ever for this GPU: learn what it is
                gpu.info = self._read_info(gpu.index, handle, gpu.info.driver)
                gpu.nvlink_count = gpu.info.nvlink_count if gpu.nvlink else 0
                gpu.batch_dirty = True
                self._infos[gpu.index] = gpu.info
            gpu.handle = handle
            gpu.lost = False
            gpu.events_registered = False
            gpu.pcie_max.clear()
            gpu.slow_due = None  # counters may have restarted: read everything now
            gpu.slow_values.clear()
            gpu.links_due = None
            gpu.state_due = None
            gpu.sentinels.clear()
            gpu.link_values = []
            gpu.links = None
            return handle
        assert last is not None
        if isinstance(last, (GpuLost, ResetRequired)):
            raise last
        raise GpuLost(
            f"GPU {gpu.index} {gpu.info.uuid or ''} {gpu.info.pci_bus_id or ''}".strip()
            + f" is lost and no fresh handle was found ({last})",
            last.code,
        )

    def _poll(
        self, gpu: _Gpu, handle: Any
    ) -> tuple[dict[str, float], tuple[LinkSample, ...], tuple[ProcessInfo, ...], dict[str, str]]:
        nv = self._nvml
        fields: dict[str, float] = {}
        errors: dict[str, str] = {}
        links: tuple[LinkSample, ...] = ()

        now = self._clock.monotonic()
        full = gpu.slow_due is None or now >= gpu.slow_due or self._slow_interval <= 0
        state = gpu.state_due is None or now >= gpu.state_due or self._state_interval <= 0

        # 1. Everything with a GPU-wide field id: one call.
        if gpu.batch_dirty:
            gpu.rebuild_batch()
        ids, specs = (gpu.full_ids, gpu.full_specs) if full else (gpu.fast_ids, gpu.fast_specs)
        sentinels: dict[str, float] = {}
        if ids:
            self._read_batch(gpu, handle, ids, specs, fields, [], errors, sentinels)
        if gpu.nvlink_count:
            links = self._read_links(gpu, handle, now, state, sentinels, errors)

        # 2. The rest: one getter each; a NOT_SUPPORTED getter is never called again.
        def call(key: str, names: tuple[str, ...], fn: Callable[..., Any], *args: Any) -> Any:
            if key in gpu.bad_calls:
                return None
            try:
                return fn(handle, *args)
            except nv.NVMLError as exc:
                code = nvml_code(exc)
                if code in _CALL_UNSUPPORTED:
                    gpu.bad_calls.add(key)
                    return None
                err = error_from_code(code, f"GPU {gpu.index}: {key}")
                if isinstance(err, (GpuLost, ResetRequired)):
                    raise err from exc
                for n in names:
                    errors[n] = str(err)
                return None

        assert self._temperature and self._clock_reasons and self._memory_info
        value = call(
            "nvmlDeviceGetTemperature",
            ("temperature_gpu",),
            self._temperature,
            NVML_TEMPERATURE_GPU,
        )
        if value is not None:
            fields["temperature_gpu"] = float(value)
        value = call("nvmlDeviceGetPowerUsage", ("power",), nv.nvmlDeviceGetPowerUsage)
        if value is not None:
            fields["power"] = value / 1000.0  # mW
        if full and (FI_DEV_TOTAL_ENERGY_CONSUMPTION, 0) in gpu.bad_fields:
            value = call(
                "nvmlDeviceGetTotalEnergyConsumption",
                ("energy",),
                nv.nvmlDeviceGetTotalEnergyConsumption,
            )
            if value is not None:
                fields["energy"] = value / 1000.0  # mJ
        for name, error_type, fid in HBM_ECC_FALLBACKS:
            if (fid, 0) in gpu.bad_fields:  # the field id is not supported: ask by location
                assert self._hbm_counter is not None
                value = call(
                    f"nvmlDeviceGetMemoryErrorCounter({name})",
                    (name,),
                    self._hbm_counter,
                    error_type,
                )
                if value is not None:
                    fields[name] = float(value)
        value = call(
            "nvmlDeviceGetClockInfo(SM)", ("sm_clock",), nv.nvmlDeviceGetClockInfo, NVML_CLOCK_SM
        )
        if value is not None:
            fields["sm_clock"] = value * 1e6  # MHz
        value = call(
            "nvmlDeviceGetClockInfo(MEM)",
            ("memory_clock",),
            nv.nvmlDeviceGetClockInfo,
            NVML_CLOCK_MEM,
        )
        if value is not None:
            fields["memory_clock"] = value * 1e6
        util = call(
            "nvmlDeviceGetUtilizationRates",
            ("utilization_gpu", "utilization_memory"),
            nv.nvmlDeviceGetUtilizationRates,
        )
        if util is not None:
            fields["utilization_gpu"] = util.gpu / 100.0
            fields["utilization_memory"] = util.memory / 100.0
        mem = call(
            "nvmlDeviceGetMemoryInfo",
            ("memory_used", "memory_free", "memory_total"),
            self._memory_info,
        )
        if mem is not None:
            fields["memory_used"] = float(mem.used)
            fields["memory_free"] = float(mem.free)
            fields["memory_total"] = float(mem.total)
        if full:  # slow: see the module docstring
            self._read_fabric(gpu, handle, fields, errors)
            for name, policy, label in (
                ("violation_power", NVML_PERF_POLICY_POWER, "POWER"),
                ("violation_thermal", NVML_PERF_POLICY_THERMAL, "THERMAL"),
            ):
                viol = call(
                    f"nvmlDeviceGetViolationStatus({label})",
                    (name,),
                    nv.nvmlDeviceGetViolationStatus,
                    policy,
                )
                if viol is not None:
                    fields[name] = viol.violationTime * 1e-9  # ns
        # 1 ms of driver CPU per call on an H100 (tests/sources/test_gpu_fields.py prints it): slow
        if full and hasattr(nv, "nvmlDeviceGetMarginTemperature"):
            value = call(
                "nvmlDeviceGetMarginTemperature",
                ("temperature_gpu_margin",),
                nv.nvmlDeviceGetMarginTemperature,
            )
            if value is not None:
                fields["temperature_gpu_margin"] = float(value)
        # 1 us on an H200 (bench/nvml_call_cost.py): every poll
        if hasattr(nv, "nvmlDeviceGetRowRemapperHistogram"):
            hist = call(
                "nvmlDeviceGetRowRemapperHistogram",
                tuple(name for name, _ in ROW_REMAP_FIELDS),
                nv.nvmlDeviceGetRowRemapperHistogram,
            )
            if hist is not None:
                for name, member in ROW_REMAP_FIELDS:
                    fields[name] = float(getattr(hist, member))
        value = call(
            "nvmlDeviceGetCurrentClocksEventReasons", ("clock_event_reasons",), self._clock_reasons
        )
        if value is not None:
            fields["clock_event_reasons"] = float(value)
        if state:
            value = call(
                "nvmlDeviceGetCurrPcieLinkGeneration",
                ("pcie_link_generation",),
                nv.nvmlDeviceGetCurrPcieLinkGeneration,
            )
            if value is not None:
                fields["pcie_link_generation"] = float(value)
            value = call(
                "nvmlDeviceGetCurrPcieLinkWidth",
                ("pcie_link_width",),
                nv.nvmlDeviceGetCurrPcieLinkWidth,
            )
            if value is not None:
                fields["pcie_link_width"] = float(value)
        # The maxima are facts of the card and the slot: read until they answer once.
        for name, getter in (
            ("pcie_link_generation_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
            ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth"),
        ):
            if name not in gpu.pcie_max:
                value = call(getter, (name,), getattr(nv, getter))
                if value is not None:
                    gpu.pcie_max[name] = float(value)
            if name in gpu.pcie_max:
                fields[name] = gpu.pcie_max[name]
        procs = None
        if self._processes and state:
            procs = call(
                "nvmlDeviceGetComputeRunningProcesses",
                ("compute_processes",),
                nv.nvmlDeviceGetComputeRunningProcesses,
            )
        processes: tuple[ProcessInfo, ...] = ()
        if procs is not None:
            processes = tuple(_process_info(p) for p in procs)
            fields["compute_processes"] = float(len(processes))
        if state:
            gpu.state_fields = {n: fields[n] for n in STATE_FIELDS if n in fields}
            gpu.state_processes = processes
            gpu.state_due = now + self._state_interval
        else:
            fields.update(gpu.state_fields)
            processes = gpu.state_processes

        if full:
            gpu.slow_values = {n: fields[n] for n in self._slow_fields if n in fields}
            gpu.slow_due = now + self._slow_interval
        else:
            fields.update(gpu.slow_values)

        add_derived_fields(fields, gpu.info.memory_max_temperature)
        return fields, links, processes, errors

    def _read_fabric(
        self, gpu: _Gpu, handle: Any, fields: dict[str, float], errors: dict[str, str]
    ) -> None:
        """The GPU's NVLink fabric registration (``nvmlDeviceGetGpuFabricInfoV``, else
        ``nvmlDeviceGetGpuFabricInfo``): ``fabric_state``, and ``fabric_status`` once it
        completed. On the slow cadence; a GPU that answers NOT_SUPPORTED (or the state
        "not supported": no NVSwitch fabric) is never asked again."""
        if FABRIC_CALL in gpu.bad_calls:
            return
        nv = self._nvml
        tries: list[tuple[Any, Any]] = []
        if "nvmlDeviceGetGpuFabricInfoV" not in gpu.bad_calls:
            getter_v = getattr(nv, "nvmlDeviceGetGpuFabricInfoV", None)
            struct_v = getattr(nv, "c_nvmlGpuFabricInfoV_t", None)
            if getter_v is not None and struct_v is not None:
                tries.append((getter_v, struct_v))
        getter = getattr(nv, "nvmlDeviceGetGpuFabricInfo", None)
        plain = getattr(nv, "c_nvmlGpuFabricInfo_t", None)
        if getter is not None and plain is not None:
            tries.append((getter, plain))
        info: Any = None
        for fn, struct_type in tries:
            probe = struct_type()
            try:
                fn(handle, ctypes.byref(probe))
            except nv.NVMLError as exc:
                code = nvml_code(exc)
                if code == NVML_ERROR_FUNCTION_NOT_FOUND and fn is not getter:
                    gpu.bad_calls.add("nvmlDeviceGetGpuFabricInfoV")  # an older driver
                    continue
                if code in _CALL_UNSUPPORTED:
                    gpu.bad_calls.add(FABRIC_CALL)
                    return
                err = error_from_code(code, f"GPU {gpu.index}: {FABRIC_CALL}")
                if isinstance(err, (GpuLost, ResetRequired)):
                    raise err from exc
                errors["fabric_state"] = str(err)
                return
            info = probe
            break
        if info is None:
            gpu.bad_calls.add(FABRIC_CALL)  # this pynvml has neither getter
            return
        state = int(info.state)
        if state == NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
            gpu.bad_calls.add(FABRIC_CALL)
            return
        fields["fabric_state"] = float(state)
        if state == NVML_GPU_FABRIC_STATE_COMPLETED:  # NVML: status is valid only then
            fields["fabric_status"] = float(int(info.status))

    def _read_batch(
        self,
        gpu: _Gpu,
        handle: Any,
        ids: list[tuple[int, int]],
        specs: list[tuple[_FieldSpec, int | None]],
        fields: dict[str, float],
        link_fields: list[dict[str, float]],
        errors: dict[str, str],
        sentinels: dict[str, float] | None = None,
    ) -> None:
        nv = self._nvml
        try:
            decoded = self._field_values(handle, ids)
        except nv.NVMLError as exc:
            code = nvml_code(exc)
            if code in _CALL_UNSUPPORTED:
                gpu.bad_fields.update(ids)
                gpu.bad_calls.add("nvmlDeviceGetFieldValues")
                gpu.batch_dirty = True
                return
            err = error_from_code(code, f"GPU {gpu.index}: nvmlDeviceGetFieldValues")
            if isinstance(err, (GpuLost, ResetRequired)):
                raise err from exc
            for spec, link in specs:
                if not spec.sentinel:
                    errors[_label(spec, link)] = str(err)
            return
        if decoded is None:
            for spec, link in specs:
                if not spec.sentinel:
                    errors[_label(spec, link)] = (
                        f"GPU {gpu.index}: field values not read: another GPU's "
                        f"nvmlDeviceGetFieldValues has not returned in {FIELD_LOCK_WAIT_S:g}s"
                    )
            return
        for (spec, link), (ret, value) in zip(specs, decoded, strict=False):
            if ret == NVML_SUCCESS:
                if value is None:
                    errors[_label(spec, link)] = f"field {spec.field_id}: unknown valueType"
                elif spec.sentinel:
                    if sentinels is not None:
                        sentinels[spec.name] = value
                elif link is None:
                    fields[spec.name] = value * spec.scale if spec.scale != 1.0 else value
                else:
                    link_fields[link][spec.name] = value
            elif ret in _FIELD_UNSUPPORTED:
                gpu.bad_fields.add((spec.field_id, 0 if link is None else link))
                gpu.batch_dirty = True
            else:
                err = error_from_code(
                    ret, f"GPU {gpu.index}: field {spec.field_id} ({_label(spec, link)})"
                )
                if isinstance(err, (GpuLost, ResetRequired)):
                    raise err
                if not spec.sentinel:
                    errors[_label(spec, link)] = str(err)

    def _field_values(
        self, handle: Any, ids: list[tuple[int, int]], wait_s: float = FIELD_LOCK_WAIT_S
    ) -> list[tuple[int, float | None]] | None:
        """``(nvmlReturn, value)`` per id, read and decoded under the process-wide lock (see
        ``_FIELD_VALUES_LOCK``); None when the lock was not free within ``wait_s`` (-1:
        wait for it). NVMLError passes through; whatever happens, the lock is released."""
        if not _FIELD_VALUES_LOCK.acquire(timeout=wait_s):
            return None
        try:
            return read_field_values(self._nvml.nvmlDeviceGetFieldValues(handle, ids))
        finally:
            _FIELD_VALUES_LOCK.release()

    def _read_links(
        self,
        gpu: _Gpu,
        handle: Any,
        now: float,
        state: bool,
        sentinels: dict[str, float],
        errors: dict[str, str],
    ) -> tuple[LinkSample, ...]:
        """Link state on the state cadence (one getter per link, carried between); the
        per-link error counters when due: first poll, a GPU-wide total moved, or the link
        cadence came round. A poll that reads neither returns the poll before's links (the
        same tuple: the wire sees at once that they did not move)."""
        moved = bool(sentinels) and bool(gpu.sentinels) and sentinels != gpu.sentinels
        if sentinels:
            gpu.sentinels = sentinels
        due = (
            gpu.links_due is None
            or now >= gpu.links_due
            or moved
            or self._link_interval <= 0
            or len(gpu.link_values) != gpu.nvlink_count
        )
        if not state and not (due and gpu.link_ids) and gpu.links is not None:
            return gpu.links  # nothing read: the same links as the poll before
        link_fields: list[dict[str, float]] = [{} for _ in range(gpu.nvlink_count)]
        failed = False  # a link's state not read: the next poll carries its last known one
        nv = self._nvml
        for link in range(gpu.nvlink_count):
            if link in gpu.bad_link_state:
                continue
            if not state:
                if link in gpu.link_up:
                    link_fields[link]["nvlink_up"] = gpu.link_up[link]
                continue
            try:
                answer = nv.nvmlDeviceGetNvLinkState(handle, link)
            except nv.NVMLError as exc:
                code = nvml_code(exc)
                if code in _CALL_UNSUPPORTED:
                    gpu.bad_link_state.add(link)
                    continue
                err = error_from_code(code, f"GPU {gpu.index}: nvmlDeviceGetNvLinkState({link})")
                if isinstance(err, (GpuLost, ResetRequired)):
                    raise err from exc
                errors[f"nvlink_up[link {link}]"] = str(err)
                failed = True
                continue
            up = gpu.link_up[link] = 1.0 if answer == NVLINK_STATE_ACTIVE else 0.0
            link_fields[link]["nvlink_up"] = up
        if due and gpu.link_ids:
            read: list[dict[str, float]] = [{} for _ in range(gpu.nvlink_count)]
            self._read_batch(gpu, handle, gpu.link_ids, gpu.link_specs, {}, read, errors)
            gpu.link_values = read
            gpu.links_due = now + self._link_interval
        for lf, kept in zip(link_fields, gpu.link_values, strict=False):
            lf.update(kept)
        links = tuple(
            LinkSample(link=i, fields=MappingProxyType(f)) for i, f in enumerate(link_fields)
        )
        gpu.links = None if failed else links
        return links

    # -- XID events -----------------------------------------------------------------------

    def wait_xid_events(self, timeout_s: float) -> list[XidEvent]:
        """XIDs the driver reports within ``timeout_s`` (``nvmlEventSetWait``).

        Returns [] on timeout. A lost GPU never raises here: the wait sits out its timeout
        and returns [], and ``sample`` reports the loss. Call from one thread; stop it
        before ``close``.
        """
        with self._event_lock:
            if not self._open or self._stop.is_set():
                return []
            event_set = self._prepare_event_set()
            if event_set is None:
                self._clock.wait(self._stop, timeout_s)
                return []
            return self._wait_events(event_set, timeout_s)

    def _prepare_event_set(self) -> Any:
        nv = self._nvml
        if self._events_unavailable:
            return None
        if self._event_set is None:
            try:
                self._event_set = nv.nvmlEventSetCreate()
            except nv.NVMLError as exc:
                code = nvml_code(exc)
                if code in _CALL_UNSUPPORTED:
                    self._events_unavailable = True
                    return None
                raise nvml_error(exc, "nvmlEventSetCreate") from exc
        for gpu in self._gpus:
            if gpu.events_registered or gpu.events_unsupported or gpu.lost:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(
                    gpu.handle, EVENT_TYPE_XID_CRITICAL_ERROR, self._event_set
                )
            except nv.NVMLError as exc:
                if nvml_code(exc) in _CALL_UNSUPPORTED:
                    gpu.events_unsupported = True
                continue  # lost or other trouble: try again on the next wait
            gpu.events_registered = True
        return self._event_set

    def _wait_events(self, event_set: Any, timeout_s: float) -> list[XidEvent]:
        nv = self._nvml
        events: list[XidEvent] = []
        timeout_ms = max(0, int(timeout_s * 1000))
        for _ in range(256):  # the first wait blocks; the rest drain what is queued
            try:
                data = nv.nvmlEventSetWait(event_set, timeout_ms)
            except nv.NVMLError as exc:
                code = nvml_code(exc)
                if code == NVML_ERROR_TIMEOUT or events:
                    break
                if code in (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED):
                    self._clock.wait(self._stop, timeout_s)
                    break
                raise nvml_error(exc, "nvmlEventSetWait") from exc
            timeout_ms = 0
            event = self._xid_event(data)
            if event is not None:
                events.append(event)
        return events

    def _xid_event(self, data: Any) -> XidEvent | None:
        if not int(data.eventType) & EVENT_TYPE_XID_CRITICAL_ERROR:
            return None
        handle = data.device
        key = _handle_key(handle)
        found: _Gpu | None = None
        if key is not None:
            for gpu in self._gpus:
                if gpu.handle is not None and _handle_key(gpu.handle) == key:
                    found = gpu
                    break
        if found is None:
            uuid = self._try_static(self._nvml.nvmlDeviceGetUUID, handle, default=None)
            for gpu in self._gpus:
                if uuid and gpu.info.uuid == uuid:
                    found = gpu
                    break
        return XidEvent(
            timestamp=self._clock.now(),
            source="nvml",
            xid=int(data.eventData),
            gpu=found.index if found else None,
            uuid=(found.info.uuid or None) if found else None,
            pci_bus_id=(found.info.pci_bus_id or None) if found else None,
        )


def _label(spec: _FieldSpec, link: int | None) -> str:
    return spec.name if link is None else f"{spec.name}[link {link}]"


def _memory_error_counter(nv: Any, location: str, handle: Any, error_type: int) -> Any:
    """Volatile ECC count of one kind at one memory location (``location``: the pynvml
    constant's name; 2 for both DRAM and device memory in nvml.h)."""
    where = getattr(nv, location, 2)
    return nv.nvmlDeviceGetMemoryErrorCounter(handle, error_type, NVML_VOLATILE_ECC, where)


def _memory_info_v2(nv: Any, version: int, handle: Any) -> Any:
    return nv.nvmlDeviceGetMemoryInfo(handle, version=version)


def _process_info(proc: Any) -> ProcessInfo:
    used = getattr(proc, "usedGpuMemory", None)
    return ProcessInfo(pid=int(proc.pid), used_memory_bytes=int(used) if used is not None else None)
