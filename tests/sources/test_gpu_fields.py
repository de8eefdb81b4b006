"""The newer NVML fields and the config's extra field ids on a real GPU (marked ``gpu``:
skipped on CI, run on a lent GPU machine with ``scripts/test.sh -m gpu`` or
``pytest -m gpu -s tests/sources/test_gpu_fields.py``, which also prints what each GPU answered
and what the two new getters cost)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import BackendUnavailable
from gpuwatchd.core.fields import GPU_FIELDS, ExtraField
from gpuwatchd.sources.gpu.nvml import FI_DEV_PCIE_REPLAY_COUNTER, NvmlBackend

pytestmark = pytest.mark.gpu

BANKS = [f"row_remap_banks_{level}" for level in ("max", "high", "partial", "low", "none")]
# The PCIe replay counter once more, by number, under a name of its own; and an id no
# driver knows, which must leave its field absent without an error.
EXTRA = (
    ExtraField(FI_DEV_PCIE_REPLAY_COUNTER, "pcie_replay_by_id", "counter"),
    ExtraField(1000, "unknown_to_the_driver", "gauge"),
)


@pytest.fixture
def backend() -> Iterator[NvmlBackend]:
    b = NvmlBackend(SystemClock(), extra_fields=EXTRA)
    try:
        b.open()
    except BackendUnavailable as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        yield b
    finally:
        b.close()


def test_new_fields_have_sane_values(backend: NvmlBackend) -> None:
    for info in backend.infos():
        s = backend.sample(info.index)
        f = s.fields
        assert not s.errors, s.errors
        assert set(f) <= set(GPU_FIELDS) | {e.name for e in EXTRA}
        present = [n for n in BANKS if n in f]
        # the histogram: all five levels or none (a GPU without row remapping)
        assert present in ([], BANKS), present
        if present:
            counts = [f[n] for n in BANKS]
            assert all(c >= 0 and c.is_integer() for c in counts), counts
            assert sum(counts) > 0, "a GPU with row remapping has banks"
            assert backend.sample(info.index).fields[BANKS[0]] == counts[0]
        if info.memory_max_temperature is not None and "temperature_memory" in f:
            margin = f["temperature_memory_margin"]
            assert margin == info.memory_max_temperature - f["temperature_memory"]
            assert 0 < margin < 150, margin
        if "temperature_gpu_margin" in f:
            assert 0 < f["temperature_gpu_margin"] < 150, f["temperature_gpu_margin"]
        for kind in ("corrected", "uncorrected"):
            sram = f[f"ecc_{kind}_volatile_sram"]
            total, dev = f[f"ecc_{kind}_volatile"], f[f"ecc_{kind}_volatile_dev"]
            assert sram == max(total - dev, 0) and sram >= 0
        # the extra id: read in the same batch as the built-in field with that id
        assert f["pcie_replay_by_id"] == f["pcie_replay"]
        assert "unknown_to_the_driver" not in f
        assert "field 1000 (unknown_to_the_driver)" in backend.not_supported(info.index)
        assert (FI_DEV_PCIE_REPLAY_COUNTER, 0) in backend.field_batch(info.index)
        print(
            f"GPU {info.index} {info.name}: banks {[f.get(n) for n in BANKS]}, "
            f"HBM {f.get('temperature_memory')} C of {info.memory_max_temperature} "
            f"(margin {f.get('temperature_memory_margin')}), GPU margin "
            f"{f.get('temperature_gpu_margin')}, SRAM corrected "
            f"{f['ecc_corrected_volatile_sram']}, not supported {backend.not_supported(info.index)}"
        )


def test_sram_status_agrees_with_total_minus_device_memory(backend: NvmlBackend) -> None:
    """Where the driver has nvmlDeviceGetSramEccErrorStatus, its volatile corrected count is
    what total minus device memory gives (the derivation gpuwatchd uses everywhere)."""
    import pynvml

    if not hasattr(pynvml, "nvmlDeviceGetSramEccErrorStatus"):
        pytest.skip("this pynvml has no nvmlDeviceGetSramEccErrorStatus")
    for info in backend.infos():
        handle = pynvml.nvmlDeviceGetHandleByIndex(info.index)
        status: Any = pynvml.c_nvmlEccSramErrorStatus_v1_t()
        try:
            pynvml.nvmlDeviceGetSramEccErrorStatus(handle, status)
        except pynvml.NVMLError as exc:
            print(f"GPU {info.index}: nvmlDeviceGetSramEccErrorStatus: {exc}")
            continue
        f = backend.sample(info.index).fields
        print(
            f"GPU {info.index}: SRAM status volatile corrected {status.volatileCor}, "
            f"uncorrected {status.volatileUncParity} + {status.volatileUncSecDed}; "
            f"gpuwatchd {f['ecc_corrected_volatile_sram']} / {f['ecc_uncorrected_volatile_sram']}"
        )
        assert f["ecc_corrected_volatile_sram"] == status.volatileCor


@pytest.mark.speed  # a cost budget per call: bench/nvml_call_cost.py measures it too
def test_what_the_new_getters_cost(backend: NvmlBackend) -> None:
    """What each new getter costs. On an H100 (driver 580.159.04) the margin temperature
    took 1.0 ms of CPU per call, the histogram 0.8 us: both are read on the slow cadence
    (every 20 s), like energy and the violation counters (docs/real-gpu.md). The HBM ECC
    counter by location is read on every poll where fields 11/12 are not supported."""
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    hbm = (0, 0, 2)  # corrected, volatile, device memory (the fallback for fields 11/12)
    for name, args in (
        ("nvmlDeviceGetMarginTemperature", ()),
        ("nvmlDeviceGetRowRemapperHistogram", ()),
        ("nvmlDeviceGetMemoryErrorCounter", hbm),
    ):
        fn = getattr(pynvml, name, None)
        if fn is None:
            continue
        try:
            fn(handle, *args)
        except pynvml.NVMLError as exc:
            print(f"{name}: {exc}")
            continue
        n = 200
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn(handle, *args)
        cpu = (time.process_time() - cpu0) / n
        wall = (time.perf_counter() - wall0) / n
        print(f"{name}: {wall * 1e6:.1f} us wall, {cpu * 1e6:.1f} us CPU per call")
        assert wall < 20e-3, f"{name} costs {wall * 1e3:.2f} ms per call"
