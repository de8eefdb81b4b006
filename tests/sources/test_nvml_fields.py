"""The NVML backend's newer fields (row-remapper histogram, temperature margins, SRAM ECC)
and the config's extra field ids, driven through the fake pynvml module."""

from __future__ import annotations

import pynvml
import pytest

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.sources.gpu.nvml import NvmlBackend
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

BANKS = [f"row_remap_banks_{level}" for level in ("max", "high", "partial", "low", "none")]


def make(
    extra: tuple[ExtraField, ...] = (), **gpu_kwargs: object
) -> tuple[NvmlBackend, FakeNvml, VirtualClock]:
    fake = FakeNvml([h100(0, **gpu_kwargs)])  # type: ignore[arg-type]
    clock = VirtualClock()
    backend = NvmlBackend(clock, nvml=fake, extra_fields=extra, slow_interval_s=10.0)
    return backend, fake, clock


def test_histogram_margins_and_sram_are_read() -> None:
    backend, fake, _ = make(remap_histogram=(3060, 8, 3, 1, 0), margin_temperature=49)
    gpu = fake.gpus[0]
    gpu.set_field(3, 40)  # corrected, total
    gpu.set_field(11, 25)  # corrected, device memory
    gpu.set_field(4, 2)
    gpu.set_field(12, 2)
    gpu.set_field(82, 61, value_type=1)  # HBM 61 C
    backend.open()
    f = backend.sample(0).fields
    assert [f[n] for n in BANKS] == [3060, 8, 3, 1, 0]
    assert f["temperature_gpu_margin"] == 49
    assert f["temperature_memory_margin"] == 95 - 61
    assert f["ecc_corrected_volatile_sram"] == 15
    assert f["ecc_uncorrected_volatile_sram"] == 0


def test_memory_limit_is_read_once_per_gpu_not_per_poll() -> None:
    backend, fake, clock = make()
    backend.open()
    opened = fake.calls["nvmlDeviceGetTemperatureThreshold"]
    for _ in range(5):
        assert backend.sample(0).fields["temperature_memory_margin"] == 95 - 37
        clock.advance(1)
    assert fake.calls["nvmlDeviceGetTemperatureThreshold"] == opened


def test_without_a_memory_limit_there_is_no_margin() -> None:
    backend, fake, _ = make()
    fake.gpus[0].thresholds = {0: 95, 1: 89}  # MEM_MAX not supported
    backend.open()
    f = backend.sample(0).fields
    assert "temperature_memory_margin" not in f
    assert "temperature_memory" in f


def test_a_total_below_its_part_is_no_negative_sram_count() -> None:
    backend, fake, _ = make()
    fake.gpus[0].set_field(3, 4)
    fake.gpus[0].set_field(11, 9)
    backend.open()
    assert backend.sample(0).fields["ecc_corrected_volatile_sram"] == 0


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_NOT_SUPPORTED, 13])
def test_unsupported_histogram_and_margin_are_absent_and_not_asked_again(code: int) -> None:
    backend, fake, clock = make()
    gpu = fake.gpus[0]
    gpu.call_errors["nvmlDeviceGetRowRemapperHistogram"] = code
    gpu.call_errors["nvmlDeviceGetMarginTemperature"] = code
    backend.open()
    for _ in range(3):
        s = backend.sample(0)
        assert not set(BANKS) & set(s.fields)
        assert "temperature_gpu_margin" not in s.fields
        assert not s.errors
        clock.advance(11)  # past the slow interval: a full poll each time
    assert fake.calls["nvmlDeviceGetRowRemapperHistogram"] == 1
    assert fake.calls["nvmlDeviceGetMarginTemperature"] == 1
    assert "call nvmlDeviceGetRowRemapperHistogram" in backend.not_supported(0)


def test_histogram_is_read_every_poll() -> None:
    """1 us of driver CPU on an H200 (bench/nvml_call_cost.py): a bank running out of spare
    rows shows on the next poll."""
    backend, fake, clock = make()
    backend.open()
    for _ in range(4):
        assert backend.sample(0).fields["row_remap_banks_max"] == 3072
        clock.advance(1)
    assert fake.calls["nvmlDeviceGetRowRemapperHistogram"] == 4
    fake.gpus[0].remap_histogram = (3071, 0, 0, 0, 1)
    clock.advance(1)
    assert backend.sample(0).fields["row_remap_banks_none"] == 1


def test_a_failing_histogram_is_an_error_on_its_fields_only() -> None:
    backend, fake, _ = make()
    fake.gpus[0].call_errors["nvmlDeviceGetRowRemapperHistogram"] = pynvml.NVML_ERROR_UNKNOWN
    backend.open()
    s = backend.sample(0)
    assert set(s.errors) == set(BANKS)
    assert s.fields["temperature_gpu"] == 33


def test_a_lost_gpu_in_the_histogram_call_is_a_lost_gpu() -> None:
    from gpuwatchd.core.errors import GpuLost

    backend, fake, _ = make()
    fake.gpus[0].call_errors["nvmlDeviceGetRowRemapperHistogram"] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend.open()
    with pytest.raises(GpuLost):
        backend.sample(0)


# -- extra field ids ----------------------------------------------------------------------

CRC_L0 = ExtraField(32, "nvlink_crc_flit_errors_l0", "counter")
REPLAY = ExtraField(94, "pcie_replays_again", "counter", "PCIe replays, again.")
POWER_LIMIT_MW = ExtraField(200, "some_limit_watts", "gauge", scale=1e-3)


def test_extra_ids_ride_in_the_one_batch_call() -> None:
    backend, fake, clock = make((CRC_L0, REPLAY, POWER_LIMIT_MW))
    gpu = fake.gpus[0]
    gpu.set_field(32, 7)
    gpu.set_field(94, 3, value_type=1)
    gpu.set_field(200, 700_000, value_type=1)
    backend.open()
    fake.reset_counts()
    for _ in range(3):
        s = backend.sample(0)
        clock.advance(1)
    assert fake.field_value_calls(0) == 3  # one call per poll, extras included
    assert s.fields["nvlink_crc_flit_errors_l0"] == 7
    assert s.fields["pcie_replays_again"] == 3
    assert s.fields["pcie_replay"] == 3  # the built-in field under its own name
    assert s.fields["some_limit_watts"] == pytest.approx(700.0)  # scale applied
    batch = backend.field_batch(0, full=False)
    assert (32, 0) in batch and (200, 0) in batch


def test_an_extra_id_the_driver_does_not_know_is_absent_and_dropped() -> None:
    unknown = ExtraField(900, "from_a_newer_header", "gauge")
    backend, fake, clock = make((unknown, CRC_L0))
    fake.gpus[0].set_field(32, 0)
    backend.open()
    s = backend.sample(0)
    assert "from_a_newer_header" not in s.fields
    assert not s.errors
    clock.advance(1)
    backend.sample(0)
    assert fake.times_field_requested(900) == 1  # INVALID_ARGUMENT: never asked again
    assert "field 900 (from_a_newer_header)" in backend.not_supported(0)
    assert "nvlink_crc_flit_errors_l0" in s.fields


def test_a_slow_extra_field_is_read_on_the_slow_cadence() -> None:
    slow = ExtraField(83, "energy_again_joules", "counter", scale=1e-3, slow=True)
    backend, fake, clock = make((slow,))
    backend.open()
    fake.reset_counts()
    values = []
    for _ in range(5):
        values.append(backend.sample(0).fields["energy_again_joules"])
        clock.advance(1)
    # built-in energy and the extra: both in the same (full) batch, once in five polls
    assert sum(1 for _, ids in fake.field_requests if (83, 0) in ids) == 1
    assert len(set(values)) == 1
