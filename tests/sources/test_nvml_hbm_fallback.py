"""HBM ECC counts on a driver that does not support the per-location field ids.

An H100 on driver 580.159.04 answered NOT_SUPPORTED for fields 7-20 (device memory 11/12
among them) while ``nvmlDeviceGetMemoryErrorCounter`` by location answered: without a
fallback, ``ecc_corrected_volatile_dev`` (what the memory-trend rules read) was missing on
that GPU, and so were the SRAM counts derived from it."""

from __future__ import annotations

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.sources.gpu.nvml import NvmlBackend
from gpuwatchd.testing.fake_pynvml import (
    HOPPER_NOT_SUPPORTED,
    PER_LOCATION_ECC_FIELDS,
    VT_ULL,
    FakeNvml,
    h100,
)


def backend_for(gpu_not_supported: set[int]) -> tuple[NvmlBackend, FakeNvml]:
    fake = FakeNvml([h100(0, not_supported_fields=gpu_not_supported)])
    backend = NvmlBackend(nvml=fake, clock=VirtualClock())
    backend.open()
    return backend, fake


def test_hbm_counts_come_from_the_counter_by_location_when_the_field_ids_are_not_supported() -> (
    None
):
    backend, fake = backend_for(set(HOPPER_NOT_SUPPORTED | PER_LOCATION_ECC_FIELDS))
    gpu = fake.gpus[0]
    gpu.field_values[(3, 0)] = (VT_ULL, 40)  # total corrected: HBM + SRAM
    gpu.field_values[(11, 0)] = (VT_ULL, 31)  # the HBM part, only by location here
    gpu.field_values[(12, 0)] = (VT_ULL, 2)
    f = backend.sample(0).fields
    assert f["ecc_corrected_volatile_dev"] == 31.0
    assert f["ecc_uncorrected_volatile_dev"] == 2.0
    assert f["ecc_corrected_volatile_sram"] == 9.0
    assert fake.calls["nvmlDeviceGetMemoryErrorCounter"] == 2
    gpu.field_values[(11, 0)] = (VT_ULL, 35)
    assert backend.sample(0).fields["ecc_corrected_volatile_dev"] == 35.0  # every poll


def test_the_field_ids_are_used_where_the_driver_supports_them() -> None:
    backend, fake = backend_for(set(HOPPER_NOT_SUPPORTED))
    fake.gpus[0].field_values[(11, 0)] = (VT_ULL, 7)
    assert backend.sample(0).fields["ecc_corrected_volatile_dev"] == 7.0
    assert fake.calls["nvmlDeviceGetMemoryErrorCounter"] == 0
