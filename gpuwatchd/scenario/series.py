"""A compiled scenario: each field of each GPU (and NVLink link) as closed-form segments
``value = base + rate * (t - start)``, and the queries the scenario backend asks of it
(values at a time, GPU state, processes, XIDs, kernel-log lines). Built by
``scenario.compile`` from a parsed file.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from gpuwatchd.core.records import GpuInfo, LinkSample, ProcessInfo
from gpuwatchd.scenario.gpumodels import DRIVER_VERSION

NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10


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
class Segment:
    start: float
    base: float
    rate: float  # per second


@dataclass(frozen=True)
class Series:
    """A piecewise-linear value; absent before its first segment."""

    starts: tuple[float, ...]
    segments: tuple[Segment, ...]
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
    _series: tuple[Mapping[str, Series], ...] = field(repr=False)
    _links: tuple[tuple[Mapping[str, Series], ...], ...] = field(repr=False)
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
                value = float(math.floor(value + 1e-9))  # as Series.value does
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
                still[name] = clamp(name, value)
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


def clamp(name: str, value: float) -> float:
    if name.startswith("utilization_"):
        return min(max(value, 0.0), 1.0)
    if name.startswith("temperature_"):
        return value
    return max(value, 0.0)
