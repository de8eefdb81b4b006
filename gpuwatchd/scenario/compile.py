"""Compiling a parsed scenario (``scenario.spec``) into series (``scenario.series``): the
timeline's events become segments per field, derived fields (free memory, the ECC
mirrors, the NVML violation counters) follow their sources, and default identities
(UUID, serial, PCI bus id) come from the scenario's name, so two runs give the same output.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.core.digest import sha256
from gpuwatchd.core.fields import (
    CLOCK_EVENT_REASON_BITS,
    DERIVED_FIELDS,
    GPU_FIELDS,
    LINK_FIELDS,
    FieldSpec,
)
from gpuwatchd.scenario.gpumodels import KNOWN_MODELS, default_bus_id
from gpuwatchd.scenario.series import GpuSpec, Note, Scenario, Segment, Series
from gpuwatchd.scenario.spec import Event, GpuEntry, links_of

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


def _digest(*parts: object) -> bytes:
    return sha256("\x1f".join(str(p) for p in parts).encode())


def _default_uuid(scenario: str, index: int) -> str:
    h = _digest("uuid", scenario, index).hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _default_serial(scenario: str, index: int) -> str:
    return str(1650000000000 + int.from_bytes(_digest("serial", scenario, index)[:6]) % 10**9)


def _phases(scenario: str, gpu: int, name: str) -> tuple[float, float]:
    d = _digest("jitter", scenario, gpu, name)
    return (
        int.from_bytes(d[:4]) / 2**32 * 2 * math.pi,
        int.from_bytes(d[4:8]) / 2**32 * 2 * math.pi,
    )


class _Builder:
    def __init__(self, integer: bool) -> None:
        self.integer = integer
        self.segments: list[Segment] = []

    def current(self, t: float) -> tuple[float, float]:
        if not self.segments:
            return 0.0, 0.0
        seg = self.segments[-1]
        return seg.base + seg.rate * (t - seg.start), seg.rate

    def push(self, t: float, base: float, rate: float) -> None:
        self.segments.append(Segment(t, base, rate))

    def build(self) -> Series:
        return Series(tuple(s.start for s in self.segments), tuple(self.segments), self.integer)


def compile_scenario(
    path: str,
    name: str,
    description: str,
    duration: float,
    step: float,
    raw_gpus: list[GpuEntry],
    baseline: dict[str, float],
    jitter: dict[str, float],
    events: list[Event],
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
                pci_bus_id=g.pci_bus_id or default_bus_id(i, count),
                model=g.model,
                nvlink_links=links_of(g),
                serial=g.serial or _default_serial(name, i),
                vbios=g.vbios or (model.vbios if model else ""),
                slowdown_temperature=model.slowdown_temperature if model else None,
                shutdown_temperature=model.shutdown_temperature if model else None,
                memory_max_temperature=model.memory_max_temperature if model else None,
            )
        )

    ordered = sorted(events, key=lambda e: (e.at, e.order))
    series: list[Mapping[str, Series]] = []
    link_series: list[tuple[Mapping[str, Series], ...]] = []
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
    mine: list[Event],
    gpu_fields: Mapping[str, FieldSpec] = GPU_FIELDS,
) -> tuple[
    Mapping[str, Series],
    tuple[Mapping[str, Series], ...],
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
        b["energy"].segments[0] = Segment(0.0, start["energy"], start.get("power", 0.0))
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
