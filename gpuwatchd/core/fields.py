"""The one table of sampled fields: names, units, metric families and DCGM equivalents.

Backends fill ``GpuSample.fields`` with these names in base units; the scenario format
accepts exactly these names; ``/metrics`` renders them; docs/metrics.md lists them. Adding a
field is one entry here plus the backend code that reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

MetricKind = Literal["gauge", "counter"]


@dataclass(frozen=True)
class DcgmName:
    """How dcgm-exporter names this field: its name, type and the factor from base units."""

    name: str
    kind: Literal["gauge", "counter"] = "gauge"
    scale: float = 1.0
    help: str = ""


@dataclass(frozen=True)
class FieldSpec:
    name: str
    metric: str  # family name; counters end in _total
    kind: MetricKind
    help: str
    const_labels: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    dcgm: DcgmName | None = None
    integer: bool = False  # counts and flags; the scenario rejects fractions


def _f(
    name: str,
    metric: str,
    kind: MetricKind,
    help: str,
    labels: dict[str, str] | None = None,
    dcgm: DcgmName | None = None,
    integer: bool = False,
) -> FieldSpec:
    return FieldSpec(name, metric, kind, help, MappingProxyType(labels or {}), dcgm, integer)


_MIB = 1.0 / (1024 * 1024)

# NVML's row-remapper histogram (nvmlDeviceGetRowRemapperHistogram): how many banks have
# each level of spare rows left, from all of them (max) to not one (none).
ROW_REMAP_AVAILABILITY: tuple[str, ...] = ("max", "high", "partial", "low", "none")

GPU_FIELD_LIST: tuple[FieldSpec, ...] = (
    _f(
        "temperature_gpu",
        "gpuwatchd_gpu_temperature_celsius",
        "gauge",
        "GPU die temperature.",
        dcgm=DcgmName("DCGM_FI_DEV_GPU_TEMP", help="GPU temperature (in C)."),
    ),
    _f(
        "temperature_memory",
        "gpuwatchd_memory_temperature_celsius",
        "gauge",
        "HBM (memory) temperature.",
        dcgm=DcgmName("DCGM_FI_DEV_MEMORY_TEMP", help="Memory temperature (in C)."),
    ),
    _f(
        "temperature_gpu_margin",
        "gpuwatchd_gpu_temperature_margin_celsius",
        "gauge",
        "Degrees the GPU can still warm before the nearest slowdown threshold "
        "(NVML margin temperature).",
    ),
    _f(
        "temperature_memory_margin",
        "gpuwatchd_memory_temperature_margin_celsius",
        "gauge",
        "Degrees from the HBM temperature to the highest it is specified for (memory max "
        "temperature minus memory temperature; negative above the limit).",
    ),
    _f(
        "power",
        "gpuwatchd_power_usage_watts",
        "gauge",
        "Power draw.",
        dcgm=DcgmName("DCGM_FI_DEV_POWER_USAGE", help="Power draw (in W)."),
    ),
    _f(
        "energy",
        "gpuwatchd_energy_consumption_joules_total",
        "counter",
        "Energy used since the driver loaded.",
        dcgm=DcgmName(
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            1000.0,
            "Total energy consumption since boot (in mJ).",
        ),
    ),
    _f(
        "sm_clock",
        "gpuwatchd_sm_clock_hertz",
        "gauge",
        "SM clock frequency.",
        dcgm=DcgmName("DCGM_FI_DEV_SM_CLOCK", scale=1e-6, help="SM clock frequency (in MHz)."),
    ),
    _f(
        "memory_clock",
        "gpuwatchd_memory_clock_hertz",
        "gauge",
        "Memory clock frequency.",
        dcgm=DcgmName("DCGM_FI_DEV_MEM_CLOCK", scale=1e-6, help="Memory clock frequency (in MHz)."),
    ),
    _f(
        "utilization_gpu",
        "gpuwatchd_gpu_utilization_ratio",
        "gauge",
        "Fraction of the last sample period in which a kernel ran (0-1).",
        dcgm=DcgmName("DCGM_FI_DEV_GPU_UTIL", scale=100.0, help="GPU utilization (in %)."),
    ),
    _f(
        "utilization_memory",
        "gpuwatchd_memory_utilization_ratio",
        "gauge",
        "Fraction of the last sample period in which device memory was read or written (0-1).",
        dcgm=DcgmName("DCGM_FI_DEV_MEM_COPY_UTIL", scale=100.0, help="Memory utilization (in %)."),
    ),
    _f(
        "memory_used",
        "gpuwatchd_memory_used_bytes",
        "gauge",
        "Device memory in use.",
        dcgm=DcgmName("DCGM_FI_DEV_FB_USED", scale=_MIB, help="Framebuffer memory used (in MiB)."),
    ),
    _f(
        "memory_free",
        "gpuwatchd_memory_free_bytes",
        "gauge",
        "Device memory free.",
        dcgm=DcgmName("DCGM_FI_DEV_FB_FREE", scale=_MIB, help="Framebuffer memory free (in MiB)."),
    ),
    _f("memory_total", "gpuwatchd_memory_total_bytes", "gauge", "Device memory in all."),
    _f(
        "ecc_corrected_volatile",
        "gpuwatchd_ecc_volatile_errors_total",
        "counter",
        "ECC errors since the driver loaded, by type (corrected = single-bit).",
        {"type": "corrected"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "counter",
            help="Total number of single-bit volatile ECC errors.",
        ),
    ),
    _f(
        "ecc_uncorrected_volatile",
        "gpuwatchd_ecc_volatile_errors_total",
        "counter",
        "ECC errors since the driver loaded, by type (corrected = single-bit).",
        {"type": "uncorrected"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "counter",
            help="Total number of double-bit volatile ECC errors.",
        ),
    ),
    _f(
        "ecc_corrected_volatile_dev",
        "gpuwatchd_ecc_volatile_device_memory_errors_total",
        "counter",
        "ECC errors in device memory (HBM) since the driver loaded, by type; the totals "
        "also count SRAM (L1, L2, register file).",
        {"type": "corrected"},
        integer=True,
    ),
    _f(
        "ecc_uncorrected_volatile_dev",
        "gpuwatchd_ecc_volatile_device_memory_errors_total",
        "counter",
        "ECC errors in device memory (HBM) since the driver loaded, by type; the totals "
        "also count SRAM (L1, L2, register file).",
        {"type": "uncorrected"},
        integer=True,
    ),
    _f(
        "ecc_corrected_volatile_sram",
        "gpuwatchd_ecc_volatile_sram_errors_total",
        "counter",
        "ECC errors in on-chip SRAM (L1, L2, register file) since the driver loaded, by "
        "type: the totals minus the device-memory (HBM) counts.",
        {"type": "corrected"},
        integer=True,
    ),
    _f(
        "ecc_uncorrected_volatile_sram",
        "gpuwatchd_ecc_volatile_sram_errors_total",
        "counter",
        "ECC errors in on-chip SRAM (L1, L2, register file) since the driver loaded, by "
        "type: the totals minus the device-memory (HBM) counts.",
        {"type": "uncorrected"},
        integer=True,
    ),
    _f(
        "ecc_corrected_aggregate",
        "gpuwatchd_ecc_aggregate_errors_total",
        "counter",
        "ECC errors over the life of the GPU (InfoROM), by type.",
        {"type": "corrected"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "counter",
            help="Total number of single-bit persistent ECC errors.",
        ),
    ),
    _f(
        "ecc_uncorrected_aggregate",
        "gpuwatchd_ecc_aggregate_errors_total",
        "counter",
        "ECC errors over the life of the GPU (InfoROM), by type.",
        {"type": "uncorrected"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "counter",
            help="Total number of double-bit persistent ECC errors.",
        ),
    ),
    _f(
        "retired_pages_sbe",
        "gpuwatchd_retired_pages",
        "gauge",
        "Pages retired by dynamic page retirement, by cause (pre-Ampere GPUs).",
        {"cause": "multiple_sbe"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_RETIRED_SBE",
            "counter",
            help="Total number of retired pages due to single-bit errors.",
        ),
    ),
    _f(
        "retired_pages_dbe",
        "gpuwatchd_retired_pages",
        "gauge",
        "Pages retired by dynamic page retirement, by cause (pre-Ampere GPUs).",
        {"cause": "dbe"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_RETIRED_DBE",
            "counter",
            help="Total number of retired pages due to double-bit errors.",
        ),
    ),
    _f(
        "retired_pages_pending",
        "gpuwatchd_retired_pages_pending",
        "gauge",
        "1 when pages wait for a reboot to be retired.",
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_RETIRED_PENDING",
            "counter",
            help="Total number of pages pending retirement.",
        ),
    ),
    _f(
        "remapped_rows_correctable",
        "gpuwatchd_remapped_rows",
        "gauge",
        "HBM rows remapped (InfoROM entries), by the error that caused it.",
        {"cause": "correctable"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "counter",
            help="Number of remapped rows for correctable errors",
        ),
    ),
    _f(
        "remapped_rows_uncorrectable",
        "gpuwatchd_remapped_rows",
        "gauge",
        "HBM rows remapped (InfoROM entries), by the error that caused it.",
        {"cause": "uncorrectable"},
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            help="Number of remapped rows for uncorrectable errors",
        ),
    ),
    *(
        _f(
            f"row_remap_banks_{level}",
            "gpuwatchd_row_remap_banks",
            "gauge",
            "HBM banks by how many spare rows they have left for row remapping "
            "(max: all of them, none: not one; NVML's row-remapper histogram).",
            {"availability": level},
            integer=True,
            dcgm=DcgmName(
                f"DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_{level.upper()}",
                help=f"Number of memory banks in the row remapper's {level!r} spare-rows bucket.",
            ),
        )
        for level in ROW_REMAP_AVAILABILITY
    ),
    _f(
        "remapped_rows_pending",
        "gpuwatchd_remapped_rows_pending",
        "gauge",
        "1 when a row remapping waits for a GPU reset.",
        integer=True,
    ),
    _f(
        "remapped_rows_failure",
        "gpuwatchd_remapped_rows_failed",
        "gauge",
        "1 when a row remapping has ever failed (the GPU needs service).",
        integer=True,
        dcgm=DcgmName("DCGM_FI_DEV_ROW_REMAP_FAILURE", help="Whether remapping of rows has failed"),
    ),
    _f(
        "violation_power",
        "gpuwatchd_clock_throttle_seconds_total",
        "counter",
        "Time the clocks were held down, by cause (NVML violation counters).",
        {"cause": "power"},
        dcgm=DcgmName(
            "DCGM_FI_DEV_POWER_VIOLATION",
            "counter",
            1e9,
            "Throttling duration due to power constraints (in ns).",
        ),
    ),
    _f(
        "violation_thermal",
        "gpuwatchd_clock_throttle_seconds_total",
        "counter",
        "Time the clocks were held down, by cause (NVML violation counters).",
        {"cause": "thermal"},
        dcgm=DcgmName(
            "DCGM_FI_DEV_THERMAL_VIOLATION",
            "counter",
            1e9,
            "Throttling duration due to thermal constraints (in ns).",
        ),
    ),
    _f(
        "clock_event_reasons",
        "gpuwatchd_clock_event_reasons",
        "gauge",
        "Raw NVML clocks-event (throttle) reasons bitmask.",
        integer=True,
    ),
    _f(
        "pcie_replay",
        "gpuwatchd_pcie_replay_errors_total",
        "counter",
        "PCIe link replays (retransmissions).",
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", help="Total number of PCIe retries."
        ),
    ),
    _f(
        "pcie_link_generation",
        "gpuwatchd_pcie_link_generation",
        "gauge",
        "Current PCIe link generation.",
        integer=True,
    ),
    _f(
        "pcie_link_generation_max",
        "gpuwatchd_pcie_link_max_generation",
        "gauge",
        "Highest PCIe link generation the GPU and its slot support.",
        integer=True,
    ),
    _f(
        "pcie_link_width",
        "gpuwatchd_pcie_link_width_lanes",
        "gauge",
        "Current PCIe link width.",
        integer=True,
    ),
    _f(
        "pcie_link_width_max",
        "gpuwatchd_pcie_link_max_width_lanes",
        "gauge",
        "Widest PCIe link the GPU and its slot support.",
        integer=True,
    ),
    _f(
        "compute_processes",
        "gpuwatchd_compute_processes",
        "gauge",
        "Compute processes running on the GPU.",
        integer=True,
    ),
    _f(
        "recovery_action",
        "gpuwatchd_recovery_action",
        "gauge",
        "Driver's recommended recovery action: 0 none, 1 GPU reset, 2 node reboot, "
        "3 drain P2P, 4 drain and reset.",
        integer=True,
    ),
    _f(
        "fabric_state",
        "gpuwatchd_gpu_fabric_state",
        "gauge",
        "The GPU's registration with the NVLink fabric (NVSwitch systems; absent where "
        "NVML answers NOT_SUPPORTED): 1 not started, 2 in progress, 3 completed.",
        integer=True,
    ),
    _f(
        "fabric_status",
        "gpuwatchd_gpu_fabric_status",
        "gauge",
        "NVML's return code of a completed fabric registration: 0 success, anything else an "
        "error (absent until the registration completes).",
        integer=True,
    ),
)

LINK_FIELD_LIST: tuple[FieldSpec, ...] = (
    _f(
        "nvlink_up",
        "gpuwatchd_nvlink_up",
        "gauge",
        "1 when the NVLink link is active.",
        integer=True,
    ),
    _f(
        "nvlink_replay_errors",
        "gpuwatchd_nvlink_replay_errors_total",
        "counter",
        "NVLink data-link transmit replays.",
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
            "counter",
            help="Total number of NVLink retries.",
        ),
    ),
    _f(
        "nvlink_recovery_errors",
        "gpuwatchd_nvlink_recovery_errors_total",
        "counter",
        "NVLink data-link transmit recoveries.",
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
            "counter",
            help="Total number of NVLink recovery errors.",
        ),
    ),
    _f(
        "nvlink_crc_errors",
        "gpuwatchd_nvlink_crc_errors_total",
        "counter",
        "NVLink data-link receive flow-control (flit) CRC errors.",
        integer=True,
        dcgm=DcgmName(
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
            "counter",
            help="Total number of NVLink flow-control CRC errors.",
        ),
    ),
)

GPU_FIELDS: Mapping[str, FieldSpec] = MappingProxyType({f.name: f for f in GPU_FIELD_LIST})
LINK_FIELDS: Mapping[str, FieldSpec] = MappingProxyType({f.name: f for f in LINK_FIELD_LIST})

# -- fields computed from other fields -----------------------------------------------------
# Both backends fill these from what the GPU answered (``add_derived_fields``), so a
# scenario cannot set them: it drives their sources instead.
_SRAM_PARTS: tuple[tuple[str, str, str], ...] = (
    ("ecc_corrected_volatile", "ecc_corrected_volatile_dev", "ecc_corrected_volatile_sram"),
    ("ecc_uncorrected_volatile", "ecc_uncorrected_volatile_dev", "ecc_uncorrected_volatile_sram"),
)
DERIVED_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        **{sram: f"{total} minus {dev}" for total, dev, sram in _SRAM_PARTS},
        "temperature_memory_margin": "the GPU's memory max temperature minus temperature_memory",
    }
)


def add_derived_fields(fields: dict[str, float], memory_max_temperature: float | None) -> None:
    """Add the derived fields whose sources ``fields`` holds (in place).

    SRAM counts are the totals minus the device-memory counts, read in the same NVML call
    (never below 0: a total that reads lower than its part is a driver oddity, not a
    negative count). The HBM margin is the GPU's memory max temperature (read once per
    GPU) minus the current HBM temperature.
    """
    for total, dev, sram in _SRAM_PARTS:
        t = fields.get(total)
        if t is not None:
            d = fields.get(dev)
            if d is not None:
                fields[sram] = t - d if t > d else 0.0
    if memory_max_temperature is not None:
        temp = fields.get("temperature_memory")
        if temp is not None:
            fields["temperature_memory_margin"] = memory_max_temperature - temp


# -- extra NVML fields from the config (the ``fields`` section) ------------------------------
EXTRA_FIELD_PREFIX = "gpuwatchd_field_"
MAX_EXTRA_FIELDS = 64
EXTRA_FIELD_ID_MAX = 1023  # nvmlFieldValue_t ids; newer drivers add ids past today's ~310


@dataclass(frozen=True)
class ExtraField:
    """An NVML field id polled by number, as the config's ``fields`` section names it.

    Its value (times ``scale``) goes into ``GpuSample.fields[name]``; on /metrics it is the
    family ``gpuwatchd_field_<name>`` (a gauge) or ``gpuwatchd_field_<name>_total`` (a
    counter). ``slow`` reads it on the slow cadence with the costly built-in counters.
    """

    field_id: int
    name: str
    kind: MetricKind = "gauge"
    help: str = ""
    scale: float = 1.0
    slow: bool = False

    @property
    def metric(self) -> str:
        suffix = "_total" if self.kind == "counter" else ""
        return f"{EXTRA_FIELD_PREFIX}{self.name}{suffix}"

    def spec(self) -> FieldSpec:
        text = self.help or f"NVML field {self.field_id} (the config's fields section)."
        return FieldSpec(self.name, self.metric, self.kind, text)


def gpu_fields_with(extra: tuple[ExtraField, ...]) -> Mapping[str, FieldSpec]:
    """The per-GPU field table: the built-in fields, then the configured extra ones."""
    if not extra:
        return GPU_FIELDS
    return MappingProxyType({**GPU_FIELDS, **{e.name: e.spec() for e in extra}})


# NVML clocks-event reasons (nvmlClocksEventReason*), bit -> metric label value.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
CLOCK_EVENT_REASON_BITS: Mapping[str, int] = MappingProxyType(
    {name: bit for bit, name in CLOCK_EVENT_REASONS}
)
# The reasons that say something about health (the others are normal operation).
HEALTH_CLOCK_EVENT_REASONS = frozenset(
    {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
)


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the reasons set in an NVML clocks-event bitmask, in bit order."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


RECOVERY_ACTIONS: Mapping[int, str] = MappingProxyType(
    {
        0: "none",
        1: "gpu_reset",
        2: "node_reboot",
        3: "drain_p2p",
        4: "drain_and_reset",
        5: "recover_imex_domain",
        6: "bus_reset",
        7: "system_reboot",
    }
)
