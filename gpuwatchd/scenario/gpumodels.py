"""The GPU models a scenario can name, and the one table of what an idle H100 (or H200)
answers: every field's idle value and the facts NVML reports once (NVLink links, slowdown
and shutdown temperatures, VBIOS, driver). The scenario backend starts from it, the
test backend (``gpuwatchd.testing.fake_backend``) and the rule test kit
(``tests/rulekit.py``) build their GPUs from it, so the three agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

MIB = 1024 * 1024


HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


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
            "memory_free": float(memory_mib * MIB),
            "memory_total": float(memory_mib * MIB),
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
H100 = KNOWN_MODELS[DEFAULT_MODEL]


def at_work(model: GpuModel, **fields: float) -> dict[str, float]:
    """The model's idle baseline with ``fields`` changed, e.g. a GPU running a job; the
    free memory follows a changed ``memory_used``. Test GPUs are built this way, from the
    one table, naming only what differs from idle."""
    values = dict(model.baseline)
    unknown = sorted(set(fields) - set(values))
    if unknown:
        raise KeyError(f"not fields of {model.name}'s baseline: {', '.join(unknown)}")
    values.update(fields)
    if "memory_used" in fields and "memory_free" not in fields:
        values["memory_free"] = values["memory_total"] - values["memory_used"]
    return values


# An unknown model starts from zeros and must give at least these in `baseline`.
UNKNOWN_MODEL_REQUIRED = ("memory_total", "power", "sm_clock", "temperature_gpu")


def default_bus_id(index: int, count: int) -> str:
    if count <= len(HGX_BUS_IDS):
        return f"00000000:{HGX_BUS_IDS[index]}:00.0"
    return f"00000000:{0x04 + index * 3:02X}:00.0"
