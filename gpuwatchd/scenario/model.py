"""Scenarios: a scripted GPU node for tests, ``simulate``, ``demo``, drills and backtesting.

A scenario file names a node (its GPUs, their model and NVLink links), the idle values of
every field, and a timeline of things that happen to it: a job starts, a counter starts to
leak, clocks are held down, a GPU falls off the bus, a call hangs, a kernel-log line or an
NVML XID event appears. docs/scenarios.md describes the format.

Loading validates the whole file and reports every mistake as ``PATH:LINE:COL: message``
(a ``ConfigError``). The timeline is then compiled into closed-form series: each field of
each GPU (and each NVLink link) is a list of segments ``value = base + rate * (t - start)``,
so the value at any scenario time is a pure function of that time. Sampling every second
or every hour gives the same counter values at the same instants, and two runs give the
same output.
"""

from __future__ import annotations

import bisect
import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Literal

from gpuwatchd.config.yamlsrc import Node, Reader, load_file, parse
from gpuwatchd.core.digest import sha256
from gpuwatchd.core.errors import Location
from gpuwatchd.core.fields import (
    CLOCK_EVENT_REASON_BITS,
    DERIVED_FIELDS,
    GPU_FIELDS,
    LINK_FIELDS,
    ExtraField,
    FieldSpec,
    gpu_fields_with,
)
from gpuwatchd.core.records import GpuInfo, LinkSample, ProcessInfo
from gpuwatchd.core.units import format_duration, value_with_unit

__all__ = [
    "KNOWN_MODELS",
    "TRANSPORTS",
    "GpuModel",
    "GpuSpec",
    "GpuState",
    "Note",
    "Scenario",
    "bundled_scenario_path",
    "bundled_scenarios",
    "format_duration",
    "load_scenario",
    "parse_scenario",
]

TRANSPORTS: tuple[str, ...] = ("kernel", "syslog", "kmsg-user")
"""How a kernel-log line reaches the log: from the kernel (trusted), forged through syslog
by a user process, or written into /dev/kmsg by a user process (facility != 0)."""

MAX_GPUS = 64
MAX_XID = 1023
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10

_MIB = 1024 * 1024
_HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")

# Fields that count as "thermal" or "power" clock events for the NVML violation counters.
_THERMAL_REASONS = CLOCK_EVENT_REASON_BITS["hw_thermal_slowdown"] | (
    CLOCK_EVENT_REASON_BITS["sw_thermal_slowdown"] | CLOCK_EVENT_REASON_BITS["hw_slowdown"]
)
_POWER_REASONS = (
    CLOCK_EVENT_REASON_BITS["sw_power_cap"] | CLOCK_EVENT_REASON_BITS["hw_power_brake_slowdown"]
)

# (source, follower): the follower counts what the source counts unless the timeline
# drives it. Lifetime (aggregate) counters count the volatile ones; the device-memory
# (HBM) counters count the totals, so a scenario that drives only the total describes HBM
# errors (drive ``ecc_corrected_volatile_dev`` too for SRAM errors: total minus device).
_ECC_MIRRORS: tuple[tuple[str, str], ...] = (
    ("ecc_corrected_volatile", "ecc_corrected_aggregate"),
    ("ecc_uncorrected_volatile", "ecc_uncorrected_aggregate"),
    ("ecc_corrected_volatile", "ecc_corrected_volatile_dev"),
    ("ecc_uncorrected_volatile", "ecc_uncorrected_volatile_dev"),
)

# Fields the scenario computes from others, as the NVML backend does (plus the GPU's
# temperature margin, which NVML reports itself and a scenario derives from the model's
# slowdown temperature): a timeline drives their sources, never them.
SCENARIO_DERIVED: Mapping[str, str] = MappingProxyType(
    {
        **DERIVED_FIELDS,
        "temperature_gpu_margin": "the model's slowdown temperature minus temperature_gpu",
    }
)
# Fields a GPU of an unknown model does not report unless its timeline sets them: the fabric
# registration is NOT_SUPPORTED on a GPU without an NVSwitch fabric (0 would read "not
# started").
NO_BASELINE = frozenset({"fabric_state", "fabric_status"})
# How each is computed: (field, source, part or None, use the slowdown limit?). With a part
# the value is max(source - part, 0); without, limit - source.
_DERIVATIONS: tuple[tuple[str, str, str | None, bool], ...] = (
    ("ecc_corrected_volatile_sram", "ecc_corrected_volatile", "ecc_corrected_volatile_dev", False),
    (
        "ecc_uncorrected_volatile_sram",
        "ecc_uncorrected_volatile",
        "ecc_uncorrected_volatile_dev",
        False,
    ),
    ("temperature_memory_margin", "temperature_memory", None, False),
    ("temperature_gpu_margin", "temperature_gpu", None, True),
)


# -- GPU models --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuModel:
    """What a known GPU model looks like when idle, and the facts NVML reports once."""

    name: str
    nvlink_links: int
    baseline: Mapping[str, float]
    slowdown_temperature: float | None = None
    shutdown_temperature: float | None = None
    memory_max_temperature: float | None = None
    vbios: str = ""


def _hopper_baseline(memory_mib: int, power: float) -> Mapping[str, float]:
    # Hopper answers NOT_SUPPORTED for the retired-pages fields (it remaps rows instead),
    # so they are absent here, as they are from a real H100's samples.
    return MappingProxyType(
        {
            "temperature_gpu": 33.0,
            "temperature_memory": 37.0,
            "power": power,
            "energy": 0.0,
            "sm_clock": 345e6,
            "memory_clock": 2619e6,
            "utilization_gpu": 0.0,
            "utilization_memory": 0.0,
            "memory_used": 0.0,
            "memory_free": float(memory_mib * _MIB),
            "memory_total": float(memory_mib * _MIB),
            "ecc_corrected_volatile": 0.0,
            "ecc_uncorrected_volatile": 0.0,
            "ecc_corrected_volatile_dev": 0.0,
            "ecc_uncorrected_volatile_dev": 0.0,
            "ecc_corrected_aggregate": 0.0,
            "ecc_uncorrected_aggregate": 0.0,
            "remapped_rows_correctable": 0.0,
            "remapped_rows_uncorrectable": 0.0,
            "remapped_rows_pending": 0.0,
            "remapped_rows_failure": 0.0,
            "violation_power": 0.0,
            "violation_thermal": 0.0,
            "clock_event_reasons": 0.0,
            "pcie_replay": 0.0,
            "pcie_link_generation": 5.0,
            "pcie_link_generation_max": 5.0,
            "pcie_link_width": 16.0,
            "pcie_link_width_max": 16.0,
            "compute_processes": 0.0,
            "recovery_action": 0.0,
        }
    )


KNOWN_MODELS: Mapping[str, GpuModel] = MappingProxyType(
    {
        "NVIDIA H100 80GB HBM3": GpuModel(
            "NVIDIA H100 80GB HBM3",
            nvlink_links=18,
            baseline=_hopper_baseline(81559, 70.0),
            slowdown_temperature=89.0,
            shutdown_temperature=95.0,
            memory_max_temperature=95.0,
            vbios="96.00.99.00.01",
        ),
        "NVIDIA H200": GpuModel(
            "NVIDIA H200",
            nvlink_links=18,
            baseline=_hopper_baseline(143771, 75.0),
            slowdown_temperature=89.0,
            shutdown_temperature=95.0,
            memory_max_temperature=95.0,
            vbios="96.00.AF.00.01",
        ),
    }
)
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DRIVER_VERSION = "580.159.04"

# An unknown model starts from zeros and must give at least these in `baseline`.
_UNKNOWN_MODEL_REQUIRED = ("memory_total", "power", "sm_clock", "temperature_gpu")


# -- public records ----------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    """One GPU of the scenario's node."""

    index: int
    uuid: str
    pci_bus_id: str
    model: str
    nvlink_links: int
    serial: str
    vbios: str
    slowdown_temperature: float | None
    shutdown_temperature: float | None
    memory_max_temperature: float | None

    def info(self) -> GpuInfo:
        return GpuInfo(
            index=self.index,
            uuid=self.uuid,
            name=self.model,
            pci_bus_id=self.pci_bus_id,
            serial=self.serial,
            vbios=self.vbios,
            driver=DRIVER_VERSION,
            ecc_enabled=True,
            ecc_pending=True,
            slowdown_temperature=self.slowdown_temperature,
            shutdown_temperature=self.shutdown_temperature,
            memory_max_temperature=self.memory_max_temperature,
            nvlink_count=self.nvlink_links,
        )


@dataclass(frozen=True)
class Note:
    """A line of the story, printed by ``demo`` when scenario time reaches ``t``.

    ``gpus`` are the GPUs the entry named with ``gpu:`` (empty when it named none)."""

    t: float
    text: str
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class GpuState:
    """Whether a GPU answers at a given time: ``ok``, ``lost``, or ``stall`` until ``until``."""

    status: Literal["ok", "lost", "stall"]
    until: float | None = None


_OK = GpuState("ok")
_LOST = GpuState("lost")


@dataclass(frozen=True)
class _Segment:
    start: float
    base: float
    rate: float  # per second


@dataclass(frozen=True)
class _Series:
    """A piecewise-linear value; absent before its first segment."""

    starts: tuple[float, ...]
    segments: tuple[_Segment, ...]
    integer: bool

    def value(self, t: float) -> float | None:
        i = bisect.bisect_right(self.starts, t) - 1
        if i < 0:
            return None
        seg = self.segments[i]
        v = seg.base + seg.rate * (t - seg.start)
        if self.integer:
            # Tolerate float noise in base + rate * dt (3 * (1/3) must give 1, not 0).
            return float(math.floor(v + 1e-9))
        return v


# A moving field in a plan: name, segment (start, base, rate), integer?, jitter amplitude,
# noise phases, whole-degree rounding?, clamp kind (see _clamp_kind).
_Moving = tuple[str, float, float, float, bool, float, tuple[float, float], bool, int]
# A derived field computed at every call (a source of it moves): name, source, part or
# None, limit (see _DERIVATIONS).
_Derived = tuple[str, str, str | None, float]
_FieldsPlan = tuple[float, float, dict[str, float], tuple[_Moving, ...], tuple[_Derived, ...]]

_W1 = 2 * math.pi / 173.0  # the two periods of the deterministic jitter, in seconds
_W2 = 2 * math.pi / 31.0


@dataclass(frozen=True)
class Scenario:
    """A loaded, validated and compiled scenario. Times are seconds from its start."""

    name: str
    description: str
    path: str
    duration: float
    step: float
    gpus: tuple[GpuSpec, ...]
    notes: tuple[Note, ...]
    jitter: Mapping[str, float] = field(repr=False)
    _series: tuple[Mapping[str, _Series], ...] = field(repr=False)
    _links: tuple[tuple[Mapping[str, _Series], ...], ...] = field(repr=False)
    _lost: tuple[tuple[tuple[float, float], ...], ...] = field(repr=False)
    _stalls: tuple[tuple[tuple[float, float], ...], ...] = field(repr=False)
    _kernel: tuple[tuple[float, str, str], ...] = field(repr=False)
    _xids: tuple[tuple[float, int, int], ...] = field(repr=False)
    _phases: Mapping[tuple[int, str], tuple[float, float]] = field(repr=False)
    # gpu -> (from, until, links): a GPU's link samples while none of its link counters
    # moves, so that polling a quiet node costs (and allocates) nothing per link.
    _links_cache: dict[int, tuple[float, float, tuple[LinkSample, ...]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _fields_cache: dict[int, _FieldsPlan] = field(default_factory=dict, repr=False, compare=False)
    _processes_cache: dict[tuple[int, int, int | None], tuple[ProcessInfo, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def gpu_infos(self) -> list[GpuInfo]:
        return [g.info() for g in self.gpus]

    def kernel_lines(self) -> list[tuple[float, str, str]]:
        """``(t, transport, line)`` for every kernel-log line, in time order."""
        return list(self._kernel)

    def nvml_xids(self) -> list[tuple[float, int, int]]:
        """``(t, gpu, xid)`` for every NVML XID event, in time order."""
        return list(self._xids)

    def state_at(self, gpu: int, t: float) -> GpuState:
        for start, end in self._lost[gpu]:
            if start <= t < end:
                return _LOST
        for start, end in self._stalls[gpu]:
            if start <= t < end:
                return GpuState("stall", end)
        return _OK

    def values_at(
        self, gpu: int, t: float
    ) -> tuple[dict[str, float], tuple[LinkSample, ...], tuple[ProcessInfo, ...]]:
        """What GPU ``gpu`` answers at scenario time ``t`` (clamped to 0..duration)."""
        t = min(max(t, 0.0), self.duration)
        cached = self._fields_cache.get(gpu)
        if cached is None or not cached[0] <= t < cached[1]:
            cached = self._fields_plan(gpu, t)
        fields = cached[2].copy()  # the fields that hold still, in file order
        for name, start, base, rate, integer, amplitude, phases, temperature, clamp in cached[3]:
            value = base + rate * (t - start)
            if integer:
                value = float(math.floor(value + 1e-9))  # as _Series.value does
            if amplitude:
                value += amplitude * (
                    0.6 * math.sin(_W1 * t + phases[0]) + 0.4 * math.sin(_W2 * t + phases[1])
                )
                # Like NVML: whole degrees, milliwatts; keeps golden files readable.
                value = round(value) if temperature else round(value, 3)
            if clamp == 1:
                value = min(max(value, 0.0), 1.0)
            elif clamp == 2:
                value = max(value, 0.0)
            fields[name] = value
        for name, source, part, limit in cached[4]:
            if part is None:
                fields[name] = limit - fields[source]
            else:
                value = fields[source] - fields[part]
                fields[name] = value if value > 0.0 else 0.0
        links = self._links_at(gpu, t)
        count = int(fields.get("compute_processes", 0.0))
        used = fields.get("memory_used")
        per_process = None if used is None or count <= 0 else int(used // count)
        key = (gpu, count, per_process)
        processes = self._processes_cache.get(key)
        if processes is None:
            processes = tuple(
                ProcessInfo(pid=_pid(gpu, k), used_memory_bytes=per_process) for k in range(count)
            )
            if len(self._processes_cache) < 4096:
                self._processes_cache[key] = processes
        return fields, links, processes

    def _fields_plan(self, gpu: int, t: float) -> _FieldsPlan:
        """How to compute a GPU's fields around ``t``: the value of each field that holds
        still (no ramp, no jitter) until the next timeline change, the series of the rest."""
        lo, hi = -math.inf, math.inf
        still: dict[str, float] = {}
        moving: list[_Moving] = []
        for name, series in self._series[gpu].items():
            starts = series.starts
            i = bisect.bisect_right(starts, t) - 1
            if i + 1 < len(starts):
                hi = min(hi, starts[i + 1])
            if i < 0:
                continue  # absent until its first entry
            lo = max(lo, starts[i])
            amplitude = self.jitter.get(name) or 0.0
            seg = series.segments[i]
            if amplitude or seg.rate:
                still[name] = 0.0  # keeps the key's place; overwritten in values_at
                phases = self._phases[(gpu, name)] if amplitude else (0.0, 0.0)
                moving.append(
                    (
                        name,
                        seg.start,
                        seg.base,
                        seg.rate,
                        series.integer,
                        amplitude,
                        phases,
                        name.startswith("temperature_"),
                        _clamp_kind(name),
                    )
                )
            else:
                value = series.value(t)
                assert value is not None
                still[name] = _clamp(name, value)
        derived: list[_Derived] = []
        moving_names = {m[0] for m in moving}
        spec = self.gpus[gpu]
        for name, source, part, slowdown in _DERIVATIONS:
            limit = spec.slowdown_temperature if slowdown else spec.memory_max_temperature
            if source not in still or (part is not None and part not in still):
                continue
            if part is None and limit is None:
                continue
            entry = (name, source, part, limit or 0.0)
            if source in moving_names or part in moving_names:
                still[name] = 0.0
                derived.append(entry)
            elif part is None:
                still[name] = entry[3] - still[source]
            else:
                still[name] = max(still[source] - still[part], 0.0)
        cached = (lo, hi, still, tuple(moving), tuple(derived))
        self._fields_cache[gpu] = cached
        return cached

    def _links_at(self, gpu: int, t: float) -> tuple[LinkSample, ...]:
        """The link samples at ``t``; the same tuple while no link value changes."""
        cached = self._links_cache.get(gpu)
        if cached is not None and cached[0] <= t < cached[1]:
            return cached[2]
        lo, hi = -math.inf, math.inf
        constant = True
        samples: list[LinkSample] = []
        for link, link_series in enumerate(self._links[gpu]):
            values: dict[str, float] = {}
            for name, series in link_series.items():
                starts = series.starts
                i = bisect.bisect_right(starts, t) - 1
                if i + 1 < len(starts):
                    hi = min(hi, starts[i + 1])
                if i >= 0:
                    lo = max(lo, starts[i])
                    if series.segments[i].rate:
                        constant = False
                v = series.value(t)
                if v is not None:
                    values[name] = v
            samples.append(LinkSample(link, MappingProxyType(values)))
        links = tuple(samples)
        if constant:
            self._links_cache[gpu] = (lo, hi, links)
        return links

    def _noise(self, gpu: int, name: str, t: float) -> float:
        # Two slow sines with phases from a hash: smooth, in [-1, 1], a pure function of t.
        # (values_at inlines this for speed; keep the two in step.)
        p1, p2 = self._phases[(gpu, name)]
        return 0.6 * math.sin(_W1 * t + p1) + 0.4 * math.sin(_W2 * t + p2)


def _pid(gpu: int, k: int) -> int:
    return 40000 + gpu * 100 + k


def _clamp_kind(name: str) -> int:
    """0: no clamp (temperatures), 1: ratio in [0, 1], 2: not negative."""
    if name.startswith("utilization_"):
        return 1
    if name.startswith("temperature_"):
        return 0
    return 2


def _clamp(name: str, value: float) -> float:
    if name.startswith("utilization_"):
        return min(max(value, 0.0), 1.0)
    if name.startswith("temperature_"):
        return value
    return max(value, 0.0)


# -- helpers -----------------------------------------------------------------------------


def _digest(*parts: object) -> bytes:
    return sha256("\x1f".join(str(p) for p in parts).encode())


def _default_uuid(scenario: str, index: int) -> str:
    h = _digest("uuid", scenario, index).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _default_serial(scenario: str, index: int) -> str:
    return str(1650000000000 + int.from_bytes(_digest("serial", scenario, index)[:6]) % 10**9)


def _default_bus_id(index: int, count: int) -> str:
    if count <= len(_HGX_BUS_IDS):
        return f"00000000:{_HGX_BUS_IDS[index]}:00.0"
    return f"00000000:{0x04 + index * 3:02X}:00.0"


def _phases(scenario: str, gpu: int, name: str) -> tuple[float, float]:
    d = _digest("jitter", scenario, gpu, name)
    return (
        int.from_bytes(d[:4]) / 2**32 * 2 * math.pi,
        int.from_bytes(d[4:8]) / 2**32 * 2 * math.pi,
    )


def _hint(word: str, choices: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _model_hint(model: str) -> str:
    low = model.lower()
    for known in KNOWN_MODELS:
        if known.lower().startswith(low) or low.startswith(known.lower()):
            return f" (did you mean {known!r}?)"
    return _hint(model, list(KNOWN_MODELS))


def _normalise_bus_id(text: str) -> str | None:
    """NVML form ``00000000:3B:00.0`` from ``0000:3b:00.0``, ``3b:00.0`` and the like."""
    parts = text.strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dev, _, fn = parts[2].partition(".")
    try:
        dom, bus, d, f = (int(x, 16) for x in (parts[0], parts[1], dev, fn))
    except ValueError:
        return None
    if dom > 0xFFFFFFFF or bus > 0xFF or d > 0x1F or f > 7:
        return None
    return f"{dom:08X}:{bus:02X}:{d:02X}.{f}"


def _valid_uuid(text: str) -> bool:
    body = text.removeprefix("GPU-")
    if body == text:
        return False
    groups = body.split("-")
    if [len(g) for g in groups] != [8, 4, 4, 4, 12]:
        return False
    return all(c in "0123456789abcdefABCDEF" for g in groups for c in g)


def bundled_scenarios() -> list[str]:
    """Names of the scenarios shipped inside the package (``demo``, ...)."""
    folder = resources.files("gpuwatchd").joinpath("data", "scenarios")
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def bundled_scenario_path(name: str) -> str:
    """The file path of a scenario shipped inside the package, e.g. ``demo``."""
    entry = resources.files("gpuwatchd").joinpath("data", "scenarios", f"{name}.yaml")
    if not entry.is_file():
        raise FileNotFoundError(
            f"no bundled scenario {name!r}; bundled: {', '.join(bundled_scenarios())}"
        )
    return str(entry)


# -- parsing -----------------------------------------------------------------------------

_TOP_KEYS = ("name", "description", "duration", "step", "gpus", "baseline", "jitter", "timeline")
_GPUS_COUNT_KEYS = ("count", "model", "nvlink_links")
_GPU_ENTRY_KEYS = ("uuid", "pci_bus_id", "model", "nvlink_links", "serial", "vbios")
_EVENT_KEYS = (
    "at",
    "note",
    "gpu",
    "link",
    "set",
    "add",
    "ramp",
    "throttle",
    "lose",
    "recover",
    "stall",
    "kernel_log",
    "transport",
    "nvml_xid",
)
_ACTIONS = (
    "set",
    "add",
    "ramp",
    "throttle",
    "lose",
    "recover",
    "stall",
    "kernel_log",
    "nvml_xid",
)
_RAMP_KEYS = ("field", "rate", "per")


@dataclass
class _Gpu:
    loc: Location
    uuid: str | None
    pci_bus_id: str | None
    model: str
    model_loc: Location
    model_what: str
    nvlink_links: int | None
    serial: str | None
    vbios: str | None


@dataclass
class _Event:
    order: int
    at: float
    what: str
    gpus: tuple[int, ...]
    links: tuple[int, ...] | None
    gpu_named: bool = False
    note: str | None = None
    sets: list[tuple[str, float]] = field(default_factory=list)
    adds: list[tuple[str, float]] = field(default_factory=list)
    ramps: list[tuple[str, float]] = field(default_factory=list)
    throttle: int | None = None
    lose: bool = False
    recover: bool = False
    stall: float | None = None
    kernel_log: str | None = None
    transport: str = "kernel"
    nvml_xid: int | None = None


class _Parser:
    def __init__(self, path: str, extra: tuple[ExtraField, ...] = ()) -> None:
        self.path = path
        self.r = Reader()
        self.extra = extra
        self.gpu_fields = gpu_fields_with(extra)
        self.all_fields: Mapping[str, FieldSpec] = {**self.gpu_fields, **LINK_FIELDS}

    # -- top level ------------------------------------------------------------------
    def scenario(self, root: Node | None) -> Scenario:
        r = self.r
        if root is None:
            r.fail(Location(self.path, 1, 1), "scenario: the file is empty")
        keys = r.mapping(root, list(_TOP_KEYS), "scenario", required=("name", "duration", "gpus"))
        if keys is None:
            r.raise_if_any()
            raise AssertionError("unreachable")
        name = ""
        if (n := keys.get("name")) is not None:
            name = r.string(n, "name") or ""
            if isinstance(n.value, str) and not name.strip():
                r.error(n.loc, "name: must not be empty")
        description = ""
        if (n := keys.get("description")) is not None:
            description = (r.string(n, "description") or "").strip()
        duration: float | None = None
        if (n := keys.get("duration")) is not None:
            duration = r.duration(n, "duration", allow_zero=False)
        step = 1.0
        if (n := keys.get("step")) is not None:
            got = r.duration(n, "step", allow_zero=False)
            if got is not None and duration is not None and got > duration:
                r.error(n.loc, f"step: {n.value!r} is longer than the duration")
            step = got if got is not None else step

        gpus: list[_Gpu] | None = None
        if (n := keys.get("gpus")) is not None:
            gpus = self.gpus(n)
        baseline: dict[str, float] = {}
        if (n := keys.get("baseline")) is not None:
            baseline = self.field_values(n, "baseline", allow_links=False) or {}
        if gpus is not None:
            self.check_models(gpus, baseline, keys.get("baseline"), root.loc)
        jitter: dict[str, float] = {}
        if (n := keys.get("jitter")) is not None:
            jitter = self.jitter(n)
        events: list[_Event] = []
        if (n := keys.get("timeline")) is not None:
            events = self.timeline(n, gpus, duration)
        r.raise_if_any()
        assert gpus is not None and duration is not None
        return _compile(
            self.path,
            name,
            description,
            duration,
            step,
            gpus,
            baseline,
            jitter,
            events,
            self.gpu_fields,
        )

    # -- gpus -----------------------------------------------------------------------
    def gpus(self, node: Node) -> list[_Gpu] | None:
        r = self.r
        if node.is_mapping():
            keys = r.mapping(node, list(_GPUS_COUNT_KEYS), "gpus", required=("count",))
            if keys is None or "count" not in keys:
                return None
            count = r.integer(keys["count"], "gpus.count", minimum=1, maximum=MAX_GPUS)
            model, model_loc = DEFAULT_MODEL, node.loc
            if (n := keys.get("model")) is not None:
                model = r.string(n, "gpus.model") or DEFAULT_MODEL
                model_loc = n.loc
            links = None
            if (n := keys.get("nvlink_links")) is not None:
                links = r.integer(n, "gpus.nvlink_links", minimum=0, maximum=64)
            if count is None:
                return None
            gpu = _Gpu(node.loc, None, None, model, model_loc, "gpus.model", links, None, None)
            return [gpu] * count
        if node.is_sequence():
            items = r.sequence(node, "gpus") or []
            if not items:
                r.error(node.loc, "gpus: the list is empty")
                return None
            if len(items) > MAX_GPUS:
                r.error(node.loc, f"gpus: at most {MAX_GPUS} GPUs")
                return None
            out: list[_Gpu] = []
            seen_uuid: dict[str, int] = {}
            seen_pci: dict[str, int] = {}
            for i, item in enumerate(items):
                what = f"gpus[{i}]"
                keys = r.mapping(item, list(_GPU_ENTRY_KEYS), what) or {}
                gpu = _Gpu(
                    item.loc, None, None, DEFAULT_MODEL, item.loc, f"{what}.model", None, None, None
                )
                if (n := keys.get("uuid")) is not None and (s := r.string(n, f"{what}.uuid")):
                    if not _valid_uuid(s):
                        r.error(
                            n.loc,
                            f"{what}.uuid: {s!r} is not a GPU UUID "
                            "(GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                        )
                    elif s.lower() in seen_uuid:
                        r.error(n.loc, f"{what}.uuid: same as gpus[{seen_uuid[s.lower()]}]")
                    else:
                        seen_uuid[s.lower()] = i
                        gpu.uuid = s
                if (n := keys.get("pci_bus_id")) is not None and (
                    s := r.string(n, f"{what}.pci_bus_id")
                ):
                    bus = _normalise_bus_id(s)
                    if bus is None:
                        r.error(
                            n.loc,
                            f"{what}.pci_bus_id: {s!r} is not a PCI bus id (like 00000000:3B:00.0)",
                        )
                    elif bus in seen_pci:
                        r.error(n.loc, f"{what}.pci_bus_id: same as gpus[{seen_pci[bus]}]")
                    else:
                        seen_pci[bus] = i
                        gpu.pci_bus_id = bus
                if (n := keys.get("model")) is not None:
                    gpu.model = r.string(n, f"{what}.model") or DEFAULT_MODEL
                    gpu.model_loc = n.loc
                if (n := keys.get("nvlink_links")) is not None:
                    gpu.nvlink_links = r.integer(n, f"{what}.nvlink_links", minimum=0, maximum=64)
                if (n := keys.get("serial")) is not None:
                    gpu.serial = r.string(n, f"{what}.serial")
                if (n := keys.get("vbios")) is not None:
                    gpu.vbios = r.string(n, f"{what}.vbios")
                out.append(gpu)
            return out
        r.error(node.loc, "gpus: expected a mapping with 'count' or a list of GPUs")
        return None

    def check_models(
        self, gpus: list[_Gpu], baseline: dict[str, float], base_node: Node | None, loc: Location
    ) -> None:
        reported: set[str] = set()
        for gpu in gpus:
            if gpu.model in KNOWN_MODELS or gpu.model in reported:
                continue
            reported.add(gpu.model)
            missing = [f for f in _UNKNOWN_MODEL_REQUIRED if f not in baseline]
            if missing:
                self.r.error(
                    gpu.model_loc,
                    f"{gpu.model_what}: {gpu.model!r} is not a known model"
                    f"{_model_hint(gpu.model)}; known: {', '.join(KNOWN_MODELS)}. "
                    f"For another model give `baseline` with at least {', '.join(missing)}",
                )

    # -- field values ---------------------------------------------------------------
    def field_name(self, node: Node, what: str, allow_links: bool) -> tuple[str, FieldSpec] | None:
        name = node.value
        if not isinstance(name, str):
            self.r.error(node.loc, f"{what}: a field name must be a string")
            return None
        spec = self.all_fields.get(name)
        if spec is None:
            close = _hint(name, list(self.all_fields))
            self.r.error(
                node.loc,
                f"{what}: unknown field {name!r}"
                + (
                    close
                    or " (another NVML field id needs an entry in the config's `fields` section)"
                ),
            )
            return None
        if name in SCENARIO_DERIVED:
            self.r.error(
                node.loc,
                f"{what}: {name!r} is derived ({SCENARIO_DERIVED[name]}); set those instead",
            )
            return None
        if name in LINK_FIELDS and not allow_links:
            self.r.error(node.loc, f"{what}: {name!r} is a per-link field and needs `link:`")
            return None
        return name, spec

    def value(self, node: Node, what: str, spec: FieldSpec, increment: bool) -> float | None:
        r = self.r
        raw = node.value
        if isinstance(raw, str):
            converted = value_with_unit(raw, spec)
            if isinstance(converted, str):
                r.error(node.loc, f"{what}: {converted}")
                return None
            raw = converted
        if isinstance(raw, bool) and spec.integer:
            raw_num: object = int(raw)
        else:
            raw_num = raw
        node = Node(raw_num, node.loc, node.tag)
        minimum = None if spec.name.startswith("temperature_") and not increment else 0.0
        if increment and spec.kind == "gauge":
            minimum = None
        maximum = 1.0 if spec.name.startswith("utilization_") and not increment else None
        if isinstance(raw_num, int | float) and not isinstance(raw_num, bool):
            if maximum is not None and raw_num > maximum and raw_num <= 100:
                r.error(
                    node.loc, f"{what}: ratios are 0-1 (write {raw_num / 100:g}, not {raw_num})"
                )
                return None
            if spec.integer and not float(raw_num).is_integer():
                r.error(node.loc, f"{what}: {spec.name} counts whole numbers, got {raw_num!r}")
                return None
        return r.number(node, what, minimum=minimum, maximum=maximum)

    def field_values(
        self, node: Node, what: str, allow_links: bool, increment: bool = False
    ) -> dict[str, float] | None:
        if not node.is_mapping():
            self.r.error(node.loc, f"{what}: expected a mapping of field: value")
            return None
        out: dict[str, float] = {}
        for key, val in node.items():
            got = self.field_name(key, what, allow_links)
            if got is None:
                continue
            name, spec = got
            v = self.value(val, f"{what}.{name}", spec, increment)
            if v is not None:
                out[name] = v
        return out

    def jitter(self, node: Node) -> dict[str, float]:
        if not node.is_mapping():
            self.r.error(node.loc, "jitter: expected a mapping of field: amplitude")
            return {}
        out: dict[str, float] = {}
        for key, val in node.items():
            got = self.field_name(key, "jitter", allow_links=False)
            if got is None:
                continue
            name, spec = got
            if spec.kind != "gauge" or spec.integer:
                self.r.error(
                    key.loc,
                    f"jitter: {name!r} is a {'counter' if spec.kind == 'counter' else 'count'}; "
                    "jitter applies to measured gauges (temperatures, power, clocks, ...)",
                )
                continue
            v = self.r.number(val, f"jitter.{name}", minimum=0.0)
            if v is not None:
                out[name] = v
        return out

    # -- timeline -------------------------------------------------------------------
    def timeline(self, node: Node, gpus: list[_Gpu] | None, duration: float | None) -> list[_Event]:
        items = self.r.sequence(node, "timeline")
        if items is None:
            return []
        events = []
        for i, item in enumerate(items):
            ev = self.event(item, f"timeline[{i}]", i, gpus, duration)
            if ev is not None:
                events.append(ev)
        return events

    def gpu_selector(self, node: Node | None, what: str, count: int | None) -> tuple[int, ...]:
        r = self.r
        if node is None or node.value == "all":
            return tuple(range(count or 0))
        values = node.value if node.is_sequence() else [node]
        if node.is_sequence() and not values:
            r.error(node.loc, f"{what}: the list is empty")
            return ()
        out: list[int] = []
        for item in values:
            if isinstance(item.value, str):
                r.error(item.loc, f"{what}: expected a GPU index, a list of indexes or 'all'")
                continue
            idx = r.integer(item, what, minimum=0)
            if idx is None:
                continue
            if count is not None and idx >= count:
                r.error(
                    item.loc,
                    f"{what}: GPU {idx} is out of range (this scenario has {count} GPUs: "
                    f"0-{count - 1})",
                )
                continue
            if idx not in out:
                out.append(idx)
        return tuple(out)

    def link_selector(
        self, node: Node, what: str, gpus: tuple[int, ...], link_counts: list[int] | None
    ) -> tuple[int, ...]:
        r = self.r
        fewest = None
        if link_counts is not None and gpus:
            fewest = min(gpus, key=lambda g: link_counts[g])
        limit = None if fewest is None or link_counts is None else link_counts[fewest]
        if node.value == "all":
            if limit == 0:
                r.error(node.loc, f"{what}: GPU {fewest} has no NVLink links")
            return tuple(range(limit or 0))
        values = node.value if node.is_sequence() else [node]
        out: list[int] = []
        for item in values:
            if isinstance(item.value, str):
                r.error(item.loc, f"{what}: expected a link number, a list of them or 'all'")
                continue
            idx = r.integer(item, what, minimum=0)
            if idx is None:
                continue
            if limit is not None and idx >= limit:
                span = f"0-{limit - 1}" if limit else "none"
                r.error(
                    item.loc,
                    f"{what}: link {idx} is out of range (GPU {fewest} has {limit} NVLink "
                    f"links: {span})",
                )
                continue
            if idx not in out:
                out.append(idx)
        return tuple(out)

    def event(
        self,
        node: Node,
        what: str,
        order: int,
        gpus: list[_Gpu] | None,
        duration: float | None,
    ) -> _Event | None:
        r = self.r
        keys = r.mapping(node, list(_EVENT_KEYS), what, required=("at",))
        if keys is None or "at" not in keys:
            return None
        at_node = keys["at"]
        at = r.duration(at_node, f"{what}.at")
        if at is not None and duration is not None and at > duration:
            r.error(
                at_node.loc,
                f"{what}.at: {at_node.value!r} is after the end of the scenario "
                f"(duration {format_duration(duration)})",
            )
        count = None if gpus is None else len(gpus)
        link_counts = None if gpus is None else [_links_of(g) for g in gpus]
        selected = self.gpu_selector(keys.get("gpu"), f"{what}.gpu", count)
        links = None
        if (n := keys.get("link")) is not None:
            links = self.link_selector(n, f"{what}.link", selected, link_counts)
        ev = _Event(order, at or 0.0, what, selected, links, gpu_named="gpu" in keys)
        actions = [k for k in _ACTIONS if k in keys]
        if not actions and "note" not in keys:
            r.error(
                node.loc,
                f"{what}: nothing happens here: give a note or one of {', '.join(_ACTIONS)}",
            )
        per_link = links is not None
        if (n := keys.get("note")) is not None:
            ev.note = r.string(n, f"{what}.note")
        if (n := keys.get("set")) is not None:
            ev.sets = list((self.field_values(n, f"{what}.set", per_link) or {}).items())
            self.check_link_fields(n, what, per_link)
        if (n := keys.get("add")) is not None:
            ev.adds = list(
                (self.field_values(n, f"{what}.add", per_link, increment=True) or {}).items()
            )
            self.check_link_fields(n, what, per_link)
        if (n := keys.get("ramp")) is not None:
            ev.ramps = self.ramps(n, f"{what}.ramp", per_link)
        if (n := keys.get("throttle")) is not None:
            ev.throttle = self.throttle(n, f"{what}.throttle")
        if (n := keys.get("lose")) is not None and r.boolean(n, f"{what}.lose") is not None:
            ev.lose = bool(n.value)
            if not ev.lose:
                r.error(n.loc, f"{what}.lose: write `recover: true` to bring a GPU back")
        if (n := keys.get("recover")) is not None and r.boolean(n, f"{what}.recover") is not None:
            ev.recover = bool(n.value)
            if not ev.recover:
                r.error(n.loc, f"{what}.recover: only `recover: true` means something")
        if ev.lose and ev.recover:
            r.error(node.loc, f"{what}: lose and recover at once")
        if (n := keys.get("stall")) is not None:
            ev.stall = r.duration(n, f"{what}.stall", allow_zero=False)
            if (
                ev.stall is not None
                and at is not None
                and duration is not None
                and at + ev.stall > duration
            ):
                r.error(n.loc, f"{what}.stall: the stall runs past the end of the scenario")
        if (n := keys.get("kernel_log")) is not None:
            line = r.string(n, f"{what}.kernel_log")
            if line is not None and ("\n" in line.strip() or not line.strip()):
                r.error(n.loc, f"{what}.kernel_log: one non-empty line per event")
            elif line is not None:
                ev.kernel_log = line.strip()
        if (n := keys.get("transport")) is not None:
            if "kernel_log" not in keys:
                r.error(n.loc, f"{what}.transport: only applies to a kernel_log line")
            ev.transport = r.string(n, f"{what}.transport", TRANSPORTS) or "kernel"
        if (n := keys.get("nvml_xid")) is not None:
            ev.nvml_xid = r.integer(n, f"{what}.nvml_xid", minimum=1, maximum=MAX_XID)
        if per_link:
            whole = [k for k in ("throttle", "lose", "recover", "stall", "nvml_xid") if k in keys]
            if whole:
                r.error(
                    keys["link"].loc,
                    f"{what}.link: {', '.join(whole)} applies to a whole GPU; "
                    "put it in an entry without `link:`",
                )
            elif not any(k in keys for k in ("set", "add", "ramp")):
                r.error(keys["link"].loc, f"{what}.link: only set, add and ramp take a link")
        return ev

    def check_link_fields(self, node: Node, what: str, per_link: bool) -> None:
        if not per_link or not node.is_mapping():
            return
        for key, _ in node.items():
            if key.value in self.gpu_fields:
                self.r.error(
                    key.loc,
                    f"{what}: {key.value!r} is a GPU field; an entry with `link:` sets only "
                    "per-link fields",
                )

    def ramps(self, node: Node, what: str, per_link: bool) -> list[tuple[str, float]]:
        r = self.r
        items = node.value if node.is_sequence() else [node]
        out: list[tuple[str, float]] = []
        for j, item in enumerate(items):
            w = f"{what}[{j}]" if node.is_sequence() else what
            keys = r.mapping(item, list(_RAMP_KEYS), w, required=("field", "rate"))
            if keys is None or "field" not in keys or "rate" not in keys:
                continue
            got = self.field_name(keys["field"], f"{w}.field", per_link)
            rate = r.number(keys["rate"], f"{w}.rate", minimum=0.0)
            per = 1.0
            if (n := keys.get("per")) is not None:
                per = r.duration(n, f"{w}.per", allow_zero=False) or 1.0
            if got is None:
                continue
            name, spec = got
            if per_link is True and name in self.gpu_fields:
                r.error(
                    keys["field"].loc,
                    f"{w}.field: {name!r} is a GPU field; an entry with `link:` ramps only "
                    "per-link fields",
                )
                continue
            if spec.kind != "counter":
                r.error(
                    keys["field"].loc,
                    f"{w}.field: {name!r} is a gauge; only counters ramp (use `set` for gauges)",
                )
                continue
            if rate is not None:
                out.append((name, rate / per))
        return out

    def throttle(self, node: Node, what: str) -> int | None:
        r = self.r
        items = r.sequence(node, what)
        if items is None:
            return None
        mask = 0
        names = list(CLOCK_EVENT_REASON_BITS)
        ok = True
        for item in items:
            name = item.value
            if not isinstance(name, str):
                r.error(item.loc, f"{what}: expected a clock-event reason name")
                ok = False
            elif name not in CLOCK_EVENT_REASON_BITS:
                r.error(
                    item.loc,
                    f"{what}: unknown clock-event reason {name!r}{_hint(name, names)} "
                    f"(one of {', '.join(names)})",
                )
                ok = False
            else:
                mask |= CLOCK_EVENT_REASON_BITS[name]
        return mask if ok else None


def _links_of(gpu: _Gpu) -> int:
    if gpu.nvlink_links is not None:
        return gpu.nvlink_links
    model = KNOWN_MODELS.get(gpu.model)
    return model.nvlink_links if model is not None else 0


# -- compiling ---------------------------------------------------------------------------


class _Builder:
    def __init__(self, integer: bool) -> None:
        self.integer = integer
        self.segments: list[_Segment] = []

    def current(self, t: float) -> tuple[float, float]:
        if not self.segments:
            return 0.0, 0.0
        seg = self.segments[-1]
        return seg.base + seg.rate * (t - seg.start), seg.rate

    def push(self, t: float, base: float, rate: float) -> None:
        self.segments.append(_Segment(t, base, rate))

    def build(self) -> _Series:
        return _Series(tuple(s.start for s in self.segments), tuple(self.segments), self.integer)


def _compile(
    path: str,
    name: str,
    description: str,
    duration: float,
    step: float,
    raw_gpus: list[_Gpu],
    baseline: dict[str, float],
    jitter: dict[str, float],
    events: list[_Event],
    gpu_fields: Mapping[str, FieldSpec] = GPU_FIELDS,
) -> Scenario:
    specs: list[GpuSpec] = []
    count = len(raw_gpus)
    for i, g in enumerate(raw_gpus):
        model = KNOWN_MODELS.get(g.model)
        specs.append(
            GpuSpec(
                index=i,
                uuid=g.uuid or _default_uuid(name, i),
                pci_bus_id=g.pci_bus_id or _default_bus_id(i, count),
                model=g.model,
                nvlink_links=_links_of(g),
                serial=g.serial or _default_serial(name, i),
                vbios=g.vbios or (model.vbios if model else ""),
                slowdown_temperature=model.slowdown_temperature if model else None,
                shutdown_temperature=model.shutdown_temperature if model else None,
                memory_max_temperature=model.memory_max_temperature if model else None,
            )
        )

    ordered = sorted(events, key=lambda e: (e.at, e.order))
    series: list[Mapping[str, _Series]] = []
    link_series: list[tuple[Mapping[str, _Series], ...]] = []
    lost: list[tuple[tuple[float, float], ...]] = []
    stalls: list[tuple[tuple[float, float], ...]] = []
    xids: list[tuple[float, int, int]] = []
    phases: dict[tuple[int, str], tuple[float, float]] = {}

    for spec in specs:
        gpu_series, gpu_links, lost_spans, stall_spans, gpu_xids = _compile_gpu(
            spec, baseline, [e for e in ordered if spec.index in e.gpus], gpu_fields
        )
        series.append(gpu_series)
        link_series.append(gpu_links)
        lost.append(lost_spans)
        stalls.append(stall_spans)
        xids.extend(gpu_xids)
        for f in jitter:
            phases[(spec.index, f)] = _phases(name, spec.index, f)

    notes = tuple(Note(e.at, e.note, e.gpus if e.gpu_named else ()) for e in ordered if e.note)
    kernel = tuple((e.at, e.transport, e.kernel_log) for e in ordered if e.kernel_log)
    xids.sort(key=lambda x: (x[0], x[1]))
    return Scenario(
        name=name,
        description=description,
        path=path,
        duration=duration,
        step=step,
        gpus=tuple(specs),
        notes=notes,
        jitter=MappingProxyType(dict(jitter)),
        _series=tuple(series),
        _links=tuple(link_series),
        _lost=tuple(lost),
        _stalls=tuple(stalls),
        _kernel=kernel,
        _xids=tuple(xids),
        _phases=MappingProxyType(phases),
    )


def _get(table: dict[str, _Builder], f: str, specs: Mapping[str, FieldSpec]) -> _Builder:
    if f not in table:
        table[f] = _Builder(specs[f].integer)
    return table[f]


def _compile_gpu(
    spec: GpuSpec,
    baseline: dict[str, float],
    mine: list[_Event],
    gpu_fields: Mapping[str, FieldSpec] = GPU_FIELDS,
) -> tuple[
    Mapping[str, _Series],
    tuple[Mapping[str, _Series], ...],
    tuple[tuple[float, float], ...],
    tuple[tuple[float, float], ...],
    list[tuple[float, int, int]],
]:
    """Turn one GPU's events (in time order) into closed-form series and spans."""
    model = KNOWN_MODELS.get(spec.model)
    start = (
        dict(model.baseline)
        if model
        else {f: 0.0 for f in GPU_FIELDS if f not in SCENARIO_DERIVED and f not in NO_BASELINE}
    )
    start.update(baseline)
    if "memory_free" not in baseline and "memory_total" in start:
        start["memory_free"] = max(start["memory_total"] - start.get("memory_used", 0.0), 0.0)
    driven = {f for e in mine if e.links is None for f, _ in (*e.sets, *e.adds, *e.ramps)}
    if any(e.throttle is not None for e in mine):
        driven.add("clock_event_reasons")
    # Derived series follow their source unless the timeline drives them itself: energy
    # integrates power, memory_free is total - used, violation counters run while a
    # thermal or power clock-event reason is set, aggregate ECC counts what volatile adds.
    auto_energy = "energy" in start and "energy" not in driven
    auto_free = "memory_free" in start and "memory_free" not in driven
    auto_violation = {
        f: f in start and f not in driven for f in ("violation_thermal", "violation_power")
    }
    # The lifetime (aggregate) ECC counters also count what the volatile ones count.
    mirrors: dict[str, list[str]] = {}
    for src, follower in _ECC_MIRRORS:
        if follower in start and follower not in driven:
            mirrors.setdefault(src, []).append(follower)

    b: dict[str, _Builder] = {}
    for f, v in start.items():
        _get(b, f, gpu_fields).push(0.0, v, 0.0)

    def violations(t: float) -> None:
        mask = int(b["clock_event_reasons"].current(t)[0]) if "clock_event_reasons" in b else 0
        for f, bits in (
            ("violation_thermal", _THERMAL_REASONS),
            ("violation_power", _POWER_REASONS),
        ):
            if auto_violation[f]:
                cur, _ = b[f].current(t)
                b[f].push(t, cur, 1.0 if mask & bits else 0.0)

    if auto_energy:
        b["energy"].segments[0] = _Segment(0.0, start["energy"], start.get("power", 0.0))
    violations(0.0)

    links: list[dict[str, _Builder]] = []
    for _ in range(spec.nvlink_links):
        lb: dict[str, _Builder] = {}
        for f in LINK_FIELDS:
            _get(lb, f, LINK_FIELDS).push(0.0, 1.0 if f == "nvlink_up" else 0.0, 0.0)
        links.append(lb)

    lost_spans: list[tuple[float, float]] = []
    lost_since: float | None = None
    stall_spans: list[tuple[float, float]] = []
    xids: list[tuple[float, int, int]] = []
    for e in mine:
        t = e.at
        tables: list[tuple[dict[str, _Builder], Mapping[str, FieldSpec]]]
        if e.links is None:
            tables = [(b, gpu_fields)]
        else:
            tables = [(links[k], LINK_FIELDS) for k in e.links if k < len(links)]
        for table, fspecs in tables:
            for f, v in e.sets:
                _get(table, f, fspecs).push(t, v, 0.0)
            for f, d in e.adds:
                cur, rate = _get(table, f, fspecs).current(t)
                table[f].push(t, cur + d, rate)
            for f, rate in e.ramps:
                cur, _ = _get(table, f, fspecs).current(t)
                table[f].push(t, cur, rate)
        if e.links is None:
            touched = {f for f, _ in (*e.sets, *e.adds)}
            if e.throttle is not None:
                _get(b, "clock_event_reasons", GPU_FIELDS).push(t, float(e.throttle), 0.0)
                touched.add("clock_event_reasons")
            if "clock_event_reasons" in touched:
                violations(t)
            if auto_energy and "power" in touched:
                cur, _ = b["energy"].current(t)
                b["energy"].push(t, cur, b["power"].current(t)[0])
            for f, _ in e.sets:
                for m in mirrors.get(f, ()):
                    cur, _ = b[m].current(t)
                    b[m].push(t, cur, 0.0)
            for f, d in e.adds:
                for m in mirrors.get(f, ()):
                    cur, rate = b[m].current(t)
                    b[m].push(t, cur + d, rate)
            for f, rate in e.ramps:
                for m in mirrors.get(f, ()):
                    cur, _ = b[m].current(t)
                    b[m].push(t, cur, rate)
            if auto_free and touched & {"memory_used", "memory_total"}:
                total = b["memory_total"].current(t)[0] if "memory_total" in b else 0.0
                used = b["memory_used"].current(t)[0] if "memory_used" in b else 0.0
                b["memory_free"].push(t, max(total - used, 0.0), 0.0)
        if e.lose and lost_since is None:
            lost_since = t
        if e.recover and lost_since is not None:
            if t > lost_since:
                lost_spans.append((lost_since, t))
            lost_since = None
        if e.stall is not None:
            stall_spans.append((t, t + e.stall))
        if e.nvml_xid is not None:
            xids.append((t, spec.index, e.nvml_xid))
    if lost_since is not None:
        lost_spans.append((lost_since, math.inf))

    return (
        MappingProxyType({f: bb.build() for f, bb in b.items()}),
        tuple(MappingProxyType({f: bb.build() for f, bb in lb.items()}) for lb in links),
        tuple(lost_spans),
        tuple(_merge(stall_spans)),
        xids,
    )


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


# -- entry points ------------------------------------------------------------------------


def parse_scenario(
    text: str, path: str = "<scenario>", extra_fields: tuple[ExtraField, ...] = ()
) -> Scenario:
    """Parse and validate scenario YAML; raises ``ConfigError`` listing every problem.

    ``extra_fields`` (the config's ``fields`` section) are settable like built-in fields."""
    return _Parser(path, extra_fields).scenario(parse(text, path))


def load_scenario(path: str, extra_fields: tuple[ExtraField, ...] = ()) -> Scenario:
    """Load, validate and compile a scenario file; raises ``ConfigError``."""
    return _Parser(path, extra_fields).scenario(load_file(path))
