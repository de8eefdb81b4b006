"""The real NVML backend, driven through a fake pynvml module (and, marked ``gpu``, a real one).

The fake raises the real ``pynvml.NVMLError`` subclasses and returns real pynvml ctypes
structs, so the backend's decoding and error mapping run as they do on a GPU host.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from typing import Any

import pynvml
import pytest

from gpuwatchd.core.clock import SystemClock, VirtualClock
from gpuwatchd.core.errors import (
    BackendError,
    BackendUnavailable,
    GpuLost,
    NotSupported,
    ResetRequired,
)
from gpuwatchd.core.fields import GPU_FIELDS, LINK_FIELDS
from gpuwatchd.sources.gpu.nvml import (
    DEFAULT_LINK_COUNTERS_INTERVAL_S,
    DEFAULT_STATE_INTERVAL_S,
    FIELD_LOCK_WAIT_S,
    GPU_FIELD_IDS,
    LINK_FIELD_IDS,
    NvmlBackend,
    error_from_code,
    read_field_values,
)
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

PCI_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


def make(*gpus_nvlink: bool, **kwargs: Any) -> tuple[NvmlBackend, FakeNvml, VirtualClock]:
    """A backend over fake H100s; one bool per GPU: does it have NVLink (18 links)?"""
    gpus = [h100(i, nvlink=n) for i, n in enumerate(gpus_nvlink or (False,))]
    fake = FakeNvml(gpus, **kwargs)
    clock = VirtualClock()
    # the cadence tests below count in 10 s (the default is DEFAULT_SLOW_INTERVAL_S)
    backend = NvmlBackend(clock, nvml=fake, slow_interval_s=10.0)
    return backend, fake, clock


# --- open ------------------------------------------------------------------------------


def test_open_reads_static_info_once_per_gpu() -> None:
    backend, fake, _ = make(False, True)
    infos = backend.open()
    assert [i.index for i in infos] == [0, 1]
    single, linked = infos
    assert single.name == "NVIDIA H100 80GB HBM3"
    assert single.uuid.startswith("GPU-")
    assert PCI_RE.match(single.pci_bus_id), single.pci_bus_id
    assert single.driver == "580.159.04"
    assert single.serial and single.vbios
    assert single.ecc_enabled is True and single.ecc_pending is True
    # absolute thresholds from nvmlDeviceGetTemperatureThreshold, not the relative T.Limit
    assert (single.slowdown_temperature, single.shutdown_temperature) == (89.0, 95.0)
    assert single.memory_max_temperature == 95.0
    assert single.nvlink_count == 0  # field 91 NOT_SUPPORTED => 0
    assert linked.nvlink_count == 18
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetUUID"] == 2


def test_static_reads_fail_alone() -> None:
    backend, fake, _ = make(False)
    gpu = fake.gpus[0]
    gpu.call_errors["nvmlDeviceGetSerial"] = pynvml.NVML_ERROR_NO_PERMISSION
    gpu.call_errors["nvmlDeviceGetEccMode"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    gpu.field_errors[1] = pynvml.NVML_ERROR_NOT_SUPPORTED  # ECC current via field
    gpu.thresholds = {0: 92}
    (info,) = backend.open()
    assert info.serial == ""
    assert info.ecc_enabled is None
    assert info.ecc_pending is True  # from field 2
    assert info.shutdown_temperature == 92.0
    assert info.slowdown_temperature is None and info.memory_max_temperature is None
    assert info.uuid and info.vbios


@pytest.mark.parametrize(
    ("code", "needle"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "libnvidia-ml"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "driver is not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version"),
        (pynvml.NVML_ERROR_UNKNOWN, "UNKNOWN"),
    ],
)
def test_open_without_nvml_is_unavailable(code: int, needle: str) -> None:
    backend, _, _ = make(init_error=code)
    with pytest.raises(BackendUnavailable, match=needle) as info:
        backend.open()
    assert info.value.code == code


def test_open_without_pynvml_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(BackendUnavailable, match="nvidia-ml-py"):
        NvmlBackend(VirtualClock()).open()


def test_open_with_no_gpus_is_unavailable() -> None:
    fake = FakeNvml([])
    with pytest.raises(BackendUnavailable, match="no GPUs"):
        NvmlBackend(VirtualClock(), nvml=fake).open()
    assert fake.initialised == 0  # shut down again


def test_sample_before_open_or_bad_index() -> None:
    backend, _, _ = make(False)
    with pytest.raises(BackendError, match="not open"):
        backend.sample(0)
    backend.open()
    with pytest.raises(BackendError, match="no GPU with index 3"):
        backend.sample(3)


# --- sample: values and units ----------------------------------------------------------


def test_sample_fills_every_field_in_base_units() -> None:
    backend, fake, clock = make(False)
    gpu = fake.gpus[0]
    gpu.power_mw = 312_500
    gpu.util_gpu, gpu.util_mem = 87, 41
    gpu.sm_mhz, gpu.mem_mhz = 1980, 2619
    gpu.violation_power_ns = 2_500_000_000
    gpu.violation_thermal_ns = 1_000_000
    gpu.clock_reasons = 0x44
    gpu.pcie_gen, gpu.pcie_width = 1, 8
    gpu.processes = [(4242, 1024 * 1024 * 1024), (4343, 0)]
    gpu.set_field(83, 5_000_000)  # mJ
    gpu.set_field(82, 45, value_type=1)
    gpu.set_field(3, 12)
    gpu.set_field(142, 2, value_type=1)
    gpu.set_field(230, 1, value_type=1)
    backend.open()
    clock.advance(10)
    s = backend.sample(0)
    f = s.fields
    assert s.gpu == 0 and s.uuid == gpu.uuid
    assert s.timestamp == clock.now()
    assert s.duration_seconds > 0
    assert not s.errors
    assert f["temperature_gpu"] == 33.0
    assert f["temperature_memory"] == 45.0
    assert f["power"] == pytest.approx(312.5)
    assert f["energy"] == pytest.approx(5000.0)
    assert f["sm_clock"] == 1980e6 and f["memory_clock"] == 2619e6
    assert f["utilization_gpu"] == pytest.approx(0.87)
    assert f["utilization_memory"] == pytest.approx(0.41)
    assert f["memory_total"] == 81559 * 1024 * 1024
    # v2: used excludes the driver's reserve (616 MiB on an idle H200), as nvidia-smi shows
    assert f["memory_used"] == 0
    assert f["memory_total"] - f["memory_free"] == 616 * 1024 * 1024
    assert f["violation_power"] == pytest.approx(2.5)
    assert f["violation_thermal"] == pytest.approx(0.001)
    assert f["clock_event_reasons"] == 0x44
    assert f["ecc_corrected_volatile"] == 12
    assert f["remapped_rows_correctable"] == 2
    assert f["recovery_action"] == 1
    assert (f["pcie_link_generation"], f["pcie_link_width"]) == (1, 8)
    assert (f["pcie_link_generation_max"], f["pcie_link_width_max"]) == (5, 16)
    assert f["compute_processes"] == 2
    assert [p.pid for p in s.processes] == [4242, 4343]
    assert s.processes[0].used_memory_bytes == 1024 * 1024 * 1024
    # Hopper: retired pages are NOT_SUPPORTED and simply absent
    for name in ("retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending"):
        assert name not in f
    assert set(f) <= set(GPU_FIELDS)
    assert set(GPU_FIELDS) - set(f) == {
        "retired_pages_sbe",
        "retired_pages_dbe",
        "retired_pages_pending",
        "fabric_state",  # no NVSwitch fabric: NOT_SUPPORTED, absent
        "fabric_status",
    }
    assert s.links == ()


def test_links_sampled_per_link_with_scope_ids() -> None:
    backend, fake, _ = make(True)
    gpu = fake.gpus[0]
    gpu.set_field(165, 0, scope=3, value_type=1)  # inactive
    gpu.set_field(165, 3, scope=4, value_type=1)  # active, traffic disabled
    gpu.set_field(161, 7, scope=5)
    gpu.set_field(163, 2, scope=17)
    backend.open()
    s = backend.sample(0)
    assert [ls.link for ls in s.links] == list(range(18))
    for ls in s.links:
        assert set(ls.fields) == set(LINK_FIELDS)
    up = {ls.link: ls.fields["nvlink_up"] for ls in s.links}
    assert up[3] == 0.0 and up[4] == 0.0 and up[0] == 1.0
    assert s.links[5].fields["nvlink_replay_errors"] == 7
    assert s.links[17].fields["nvlink_crc_errors"] == 2
    assert s.links[0].fields["nvlink_recovery_errors"] == 0


def test_one_field_value_call_per_gpu_per_poll_link_counters_on_their_cadence() -> None:
    backend, fake, clock = make(True, False)
    backend.open()
    fake.reset_counts()
    for _ in range(5):
        backend.sample(0)
        backend.sample(1)
        clock.advance(1.0)
    # one GPU-wide call per GPU per poll, plus the per-link error counters once (the first
    # poll of the NVLink GPU: the fake H100 has no GPU-wide NVLink totals to watch)
    assert fake.calls["nvmlDeviceGetFieldValues"] == 11
    assert fake.field_value_calls(0) == 6 and fake.field_value_calls(1) == 5
    gpu_calls = [ids for i, ids in fake.field_requests if i == 0]
    link_calls = [ids for ids in gpu_calls if any(scope for _, scope in ids)]
    assert len(link_calls) == 1
    assert {(f, link) for f in (161, 162, 163) for link in range(18)} == set(link_calls[0])
    ids = gpu_calls[-1]
    assert (82, 0) in ids and (230, 0) in ids
    assert all(scope == 0 for _, scope in ids) and all(fid < 251 for fid, _ in ids)
    assert all(fid != 165 for fid, _ in ids)  # link state: the 1 us getter, not the field
    # link state (1.5 ms of driver CPU for 18 links, read cold) on the state cadence
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 18
    # counters read once are carried in every sample until the next read
    s = backend.sample(0)
    assert s.links[17].fields["nvlink_crc_errors"] == 0 and s.links[0].fields["nvlink_up"] == 1
    # the link cadence comes round: the counters are read again
    clock.advance(DEFAULT_LINK_COUNTERS_INTERVAL_S)
    backend.sample(0)
    assert fake.field_value_calls(0) == 9
    # nothing that has a field id is read through a per-field getter
    for getter in (
        "nvmlDeviceGetNvLinkErrorCounter",
        "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetPcieReplayCounter",
        "nvmlDeviceGetTotalEnergyConsumption",
    ):
        assert fake.calls[getter] == 0, getter


def test_a_moving_nvlink_total_reads_the_link_counters_at_once() -> None:
    """Where the GPU-wide totals answer (pre-Hopper parts), a link error is attributed to
    its link in the same poll instead of waiting for the link cadence."""
    backend, fake, clock = make(True)
    gpu = fake.gpus[0]
    for fid in (38, 45, 52, 59):
        gpu.not_supported_fields.discard(fid)
        gpu.set_field(fid, 0)
    backend.open()
    backend.sample(0)
    clock.advance(5.0)
    backend.sample(0)
    before = fake.field_value_calls(0)
    gpu.set_field(163, 9, scope=4)
    gpu.set_field(38, 9)
    clock.advance(5.0)
    s = backend.sample(0)
    assert fake.field_value_calls(0) == before + 2
    assert s.links[4].fields["nvlink_crc_errors"] == 9
    clock.advance(5.0)
    backend.sample(0)  # nothing moved since: one call again
    assert fake.field_value_calls(0) == before + 3


def test_a_field_value_call_that_raises_anything_still_frees_the_lock() -> None:
    """The field-values lock is shared by every GPU: a call that fails with something other
    than an NVMLError must not leave it held (every later poll would wait 2 s, then report
    its fields unread)."""
    backend, fake, _ = make(False)
    backend.open()
    real = fake.nvmlDeviceGetFieldValues

    def broken(handle: Any, ids: list[Any]) -> Any:
        raise RuntimeError("a bug below pynvml")

    fake.nvmlDeviceGetFieldValues = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        backend.sample(0)
    fake.nvmlDeviceGetFieldValues = real  # type: ignore[method-assign]
    started = time.monotonic()
    s = backend.sample(0)
    assert time.monotonic() - started < FIELD_LOCK_WAIT_S
    assert not s.errors and "temperature_memory" in s.fields


def test_slowly_changing_state_is_read_on_its_cadence_and_carried() -> None:
    """Link state, compute processes and the PCIe link (0.25-1.5 ms of driver CPU each per
    GPU, read cold on a busy H200) every state_interval_s; their last values in between."""
    backend, fake, clock = make(True)
    gpu = fake.gpus[0]
    gpu.processes = [(4242, 1 << 30)]
    backend.open()
    first = backend.sample(0)
    assert first.fields["compute_processes"] == 1 and first.processes[0].pid == 4242
    gpu.set_field(165, 0, scope=3, value_type=1)  # link 3 goes down
    gpu.processes = []
    clock.advance(DEFAULT_STATE_INTERVAL_S - 1)
    s = backend.sample(0)
    assert s.links[3].fields["nvlink_up"] == 1.0 and s.processes == first.processes
    assert s.fields["pcie_link_width"] == 16 and s.fields["compute_processes"] == 1
    clock.advance(1)
    s = backend.sample(0)
    assert s.links[3].fields["nvlink_up"] == 0.0 and s.processes == ()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 2


def test_a_poll_that_reads_no_link_reuses_the_links_before() -> None:
    """Between the link cadences a poll hands on the poll before's links, the same tuple
    (no 18 link records rebuilt per poll; the wire sees they did not move), and a poll
    that reads them builds new ones with what it read."""
    backend, fake, clock = make(True)
    backend.open()
    first = backend.sample(0)
    clock.advance(1.0)
    second = backend.sample(0)
    assert second.links is first.links and len(first.links) == 18
    fake.gpus[0].set_field(165, 0, scope=2, value_type=1)  # link 2 goes down
    clock.advance(DEFAULT_STATE_INTERVAL_S)
    third = backend.sample(0)
    assert third.links is not first.links
    assert third.links[2].fields["nvlink_up"] == 0.0 and third.links[1].fields["nvlink_up"] == 1
    assert third.links[17].fields["nvlink_crc_errors"] == 0  # the counters carried
    clock.advance(1.0)
    assert backend.sample(0).links is third.links


def test_a_link_state_read_that_failed_carries_the_last_state_next_poll() -> None:
    """A state getter that fails reports the error in that poll's sample; the polls after
    it carry the link's last known state, as before the links were reused."""
    backend, fake, clock = make(True)
    backend.open()
    backend.sample(0)
    fake.gpus[0].call_errors["nvmlDeviceGetNvLinkState"] = 999  # NVML_ERROR_UNKNOWN
    clock.advance(DEFAULT_STATE_INTERVAL_S)
    failed = backend.sample(0)
    assert "nvlink_up" not in failed.links[0].fields and "nvlink_up[link 0]" in failed.errors
    del fake.gpus[0].call_errors["nvmlDeviceGetNvLinkState"]
    clock.advance(1.0)
    after = backend.sample(0)
    assert after.links[0].fields["nvlink_up"] == 1.0 and not after.errors
    clock.advance(1.0)
    assert backend.sample(0).links is after.links


def test_poll_nvlink_and_processes_off_are_not_read() -> None:
    gpus = [h100(0, nvlink=True)]
    fake = FakeNvml(gpus)
    backend = NvmlBackend(VirtualClock(), nvml=fake, nvlink=False, processes=False)
    backend.open()
    s = backend.sample(0)
    assert s.links == ()
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 0
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses"] == 0
    assert all(scope == 0 for _, ids in fake.field_requests for _, scope in ids)


def test_field_value_calls_never_overlap_across_gpus() -> None:
    """libnvidia-ml corrupts the heap when two threads are inside nvmlDeviceGetFieldValues
    at once (docs/real-gpu.md); one GPU thread per GPU must take turns for that call."""
    import threading
    import time

    backend, fake, _ = make(True, True, True, True)
    backend.open()
    inside = 0
    overlaps = 0
    lock = threading.Lock()
    real = fake.nvmlDeviceGetFieldValues

    def watched(handle: Any, ids: list[Any]) -> Any:
        nonlocal inside, overlaps
        with lock:
            inside += 1
            overlaps += inside > 1
        time.sleep(0.002)
        try:
            return real(handle, ids)
        finally:
            with lock:
                inside -= 1

    fake.nvmlDeviceGetFieldValues = watched  # type: ignore[method-assign]
    threads = [
        threading.Thread(target=lambda i=i: [backend.sample(i) for _ in range(20)])
        for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == 0


def test_not_supported_fields_and_calls_are_asked_only_once() -> None:
    backend, fake, _ = make(False)
    gpu = fake.gpus[0]
    gpu.unsupported_calls.add("nvmlDeviceGetPowerUsage")
    gpu.field_errors[94] = pynvml.NVML_ERROR_INVALID_ARGUMENT  # id unknown to the driver
    backend.open()
    fake.reset_counts()
    for _ in range(4):
        s = backend.sample(0)
        assert "power" not in s.fields and "pcie_replay" not in s.fields
        assert not s.errors
    assert fake.times_field_requested(29) == 1  # retired pages: NOT_SUPPORTED on Hopper
    assert fake.times_field_requested(31) == 1
    assert fake.times_field_requested(94) == 1
    assert fake.times_field_requested(82) == 4
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert fake.calls["nvmlDeviceGetFieldValues"] == 4
    # the pcie maxima are facts of the slot: read once
    assert fake.calls["nvmlDeviceGetMaxPcieLinkGeneration"] == 1
    assert fake.calls["nvmlDeviceGetCurrPcieLinkGeneration"] == 1  # the state cadence
    listed = backend.not_supported(0)
    assert "field 29 (retired_pages_sbe)" in listed
    assert "field 94 (pcie_replay)" in listed
    assert "call nvmlDeviceGetPowerUsage" in listed


def test_unsupported_link_is_dropped_per_link() -> None:
    backend, fake, clock = make(True)
    fake.gpus[0].field_values.pop((162, 9))  # this link lacks one counter
    backend.open()
    fake.reset_counts()
    for _ in range(3):
        s = backend.sample(0)
        clock.advance(DEFAULT_LINK_COUNTERS_INTERVAL_S)  # each poll reads the counters
    assert "nvlink_recovery_errors" not in s.links[9].fields
    assert "nvlink_recovery_errors" in s.links[8].fields
    asked = [ids for _, ids in fake.field_requests]
    assert sum((162, 9) in ids for ids in asked) == 1
    assert sum((162, 8) in ids for ids in asked) == 3
    assert "field 162 (nvlink_recovery_errors) link 9" in backend.not_supported(0)


def test_other_failures_go_to_errors_and_are_asked_again() -> None:
    backend, fake, _ = make(False)
    gpu = fake.gpus[0]
    gpu.field_errors[142] = pynvml.NVML_ERROR_NO_PERMISSION
    gpu.call_errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_UNKNOWN
    backend.open()
    for _ in range(2):
        s = backend.sample(0)
        assert "remapped_rows_correctable" not in s.fields
        assert "NO_PERMISSION" in s.errors["remapped_rows_correctable"]
        assert "UNKNOWN" in s.errors["utilization_gpu"]
        assert "UNKNOWN" in s.errors["utilization_memory"]
        assert s.fields["temperature_gpu"] == 33.0  # the rest still answers
    assert fake.times_field_requested(142) == 2
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 2


def test_whole_field_value_call_failure_is_reported_per_field() -> None:
    backend, fake, _ = make(False)
    backend.open()
    fake.gpus[0].call_errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_UNKNOWN
    s = backend.sample(0)
    assert "temperature_memory" not in s.fields
    assert "UNKNOWN" in s.errors["temperature_memory"]
    assert s.fields["power"] > 0


def test_energy_falls_back_to_getter_when_field_unsupported() -> None:
    backend, fake, clock = make(False)
    fake.gpus[0].not_supported_fields.add(83)
    fake.gpus[0].energy_mj = 2_000_000
    backend.open()
    backend.sample(0)
    clock.advance(10)  # energy is a slow field
    s = backend.sample(0)
    assert s.fields["energy"] == pytest.approx(2000.0)
    assert fake.times_field_requested(83) == 1
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2


def test_clock_event_reasons_fall_back_to_throttle_variant() -> None:
    backend, fake, _ = make(
        False,
        False,
        missing_functions={"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetTemperatureV"},
    )
    fake.gpus[0].clock_reasons = 0x8
    backend.open()
    for _ in range(3):
        s0 = backend.sample(0)
        s1 = backend.sample(1)
    assert s0.fields["clock_event_reasons"] == 0x8 and "clock_event_reasons" in s1.fields
    assert s0.fields["temperature_gpu"] == 33.0
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1  # tried once, backend-wide
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 6
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1
    assert fake.calls["nvmlDeviceGetTemperature"] == 6
    assert not s0.errors


def test_temperature_v_not_supported_falls_back_to_legacy_getter() -> None:
    backend, fake, _ = make(False)
    fake.gpus[0].unsupported_calls.add("nvmlDeviceGetTemperatureV")
    fake.gpus[0].temperature = 61
    backend.open()
    assert backend.sample(0).fields["temperature_gpu"] == 61.0
    assert backend.sample(0).fields["temperature_gpu"] == 61.0
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1
    assert backend.not_supported(0) == [
        "field 29 (retired_pages_sbe)",
        "field 30 (retired_pages_dbe)",
        "field 31 (retired_pages_pending)",
        "call nvmlDeviceGetGpuFabricInfo",
    ]


def test_slow_fields_are_read_every_slow_interval_and_carried_between() -> None:
    backend, fake, clock = make(True)
    gpu = fake.gpus[0]
    backend.open()
    full = backend.field_batch(0)
    fast = backend.field_batch(0, full=False)
    links = {(fid, link) for link in range(18) for fid in (161, 162, 163)}
    assert set(full) - set(fast) == {(83, 0), (94, 0)}
    assert set(backend.link_batch(0)) == links
    fake.reset_counts()
    first = backend.sample(0)  # the first poll reads everything
    gpu.set_field(83, 9_000_000)
    gpu.set_field(94, 3, value_type=1)
    gpu.violation_thermal_ns = 4_000_000_000
    for _ in range(9):
        clock.advance(1)
        s = backend.sample(0)
        # carried, not re-read
        assert s.fields["energy"] == first.fields["energy"]
        assert s.fields["pcie_replay"] == 0 and s.fields["violation_thermal"] == 0
        assert len(s.links) == 18 and s.links[0].fields["nvlink_up"] == 1
        assert s.links[0].fields["nvlink_crc_errors"] == first.links[0].fields["nvlink_crc_errors"]
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # power + thermal, first poll
    assert fake.times_field_requested(83) == 1
    assert fake.calls["nvmlDeviceGetFieldValues"] == 11  # one per poll, the links once
    clock.advance(1)  # 10 s after the first poll
    s = backend.sample(0)
    assert s.fields["energy"] == pytest.approx(9000.0)
    assert s.fields["pcie_replay"] == 3
    assert s.fields["violation_thermal"] == pytest.approx(4.0)
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 4


def test_slow_interval_zero_reads_everything_every_poll() -> None:
    fake = FakeNvml([h100(0)])
    backend = NvmlBackend(VirtualClock(), nvml=fake, slow_interval_s=0)
    backend.open()
    for _ in range(3):
        backend.sample(0)
    assert fake.times_field_requested(83) == 3
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 6


def test_memory_info_falls_back_to_v1_on_old_drivers() -> None:
    backend, fake, _ = make(False, missing_functions={"nvmlDeviceGetMemoryInfo_v2"})
    backend.open()
    f = backend.sample(0).fields
    assert f["memory_used"] == 616 * 1024 * 1024  # v1 counts the reserve as used
    assert f["memory_used"] + f["memory_free"] == f["memory_total"]
    backend.sample(0)
    assert fake.calls["nvmlDeviceGetMemoryInfo_v2"] == 1
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 2


# --- lost GPUs -------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["getter", "field_entry", "field_call"])
def test_gpu_is_lost_anywhere_raises_gpu_lost(where: str) -> None:
    backend, fake, _ = make(False, False)
    backend.open()
    gpu = fake.gpus[0]
    if where == "getter":
        gpu.call_errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_GPU_IS_LOST
    elif where == "field_entry":
        gpu.field_errors[82] = pynvml.NVML_ERROR_GPU_IS_LOST
    else:
        gpu.call_errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_GPU_IS_LOST
    with pytest.raises(GpuLost) as info:
        backend.sample(0)
    assert info.value.code == pynvml.NVML_ERROR_GPU_IS_LOST
    assert backend.sample(1).fields["temperature_gpu"] == 33.0  # the other GPU is fine


def test_reset_required_raises_reset_required() -> None:
    backend, fake, _ = make(False)
    backend.open()
    fake.gpus[0].call_errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_RESET_REQUIRED
    with pytest.raises(ResetRequired):
        backend.sample(0)


def test_lost_gpu_is_sampled_again_after_it_comes_back() -> None:
    backend, fake, _ = make(False, False)
    backend.open()
    old = fake.handle_of(0)
    backend.sample(0)
    fake.lose(0)
    with pytest.raises(GpuLost):
        backend.sample(0)
    with pytest.raises(GpuLost, match=r"no fresh handle|GPU_IS_LOST"):
        backend.sample(0)  # still gone: handle lookups fail too
    assert backend.sample(1).fields  # others keep going
    fake.recover(0)  # back after a reset, under a new handle
    fake.gpus[0].set_field(83, 1_000)  # counters restarted with the driver
    s = backend.sample(0)
    assert s.fields["temperature_gpu"] == 33.0
    assert s.fields["energy"] == pytest.approx(1.0)  # slow fields re-read at once
    assert fake.handle_of(0) is not old
    assert fake.calls["nvmlDeviceGetHandleByUUID"] >= 2


def test_lost_gpu_found_again_by_pci_bus_id() -> None:
    backend, fake, _ = make(False)
    backend.open()
    fake.lose(0)
    with pytest.raises(GpuLost):
        backend.sample(0)
    fake.recover(0)
    fake.gpus[0].call_errors["nvmlDeviceGetHandleByUUID"] = pynvml.NVML_ERROR_NOT_FOUND
    assert backend.sample(0).fields["power"] > 0
    assert fake.calls["nvmlDeviceGetHandleByPciBusId"] == 1


def test_gpu_lost_at_open_is_identified_once_it_answers() -> None:
    fake = FakeNvml([h100(0), h100(1, nvlink=True)])
    fake.gpus[1].lost = True
    backend = NvmlBackend(VirtualClock(), nvml=fake)
    infos = backend.open()
    assert infos[1].uuid == "" and infos[0].uuid
    with pytest.raises(GpuLost):
        backend.sample(1)
    fake.gpus[1].lost = False
    s = backend.sample(1)
    assert s.uuid == fake.gpus[1].uuid
    assert len(s.links) == 18
    assert backend.infos()[1].nvlink_count == 18


# --- threads ---------------------------------------------------------------------------


def test_concurrent_sampling_one_thread_per_gpu() -> None:
    backend, fake, _ = make(True, False, True, False)
    backend.open()
    fake.reset_counts()
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            for _ in range(100):
                s = backend.sample(index)
                assert s.gpu == index and s.fields["temperature_gpu"] == 33.0
                assert len(s.links) == (18 if index % 2 == 0 else 0)
        except BaseException as exc:  # pragma: no cover - reported below
            failures.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    for i in range(4):
        assert fake.field_value_calls(i) == 100 + (i % 2 == 0)  # link counters once
        assert fake.times_field_requested(29, i) == 1


# --- XID events ------------------------------------------------------------------------


def test_xid_events_are_delivered_with_gpu_identity() -> None:
    backend, fake, clock = make(False, False)
    infos = backend.open()
    assert backend.wait_xid_events(0.01) == []
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 31)
    events = backend.wait_xid_events(1.0)
    assert sorted((e.gpu, e.xid) for e in events) == [(0, 31), (1, 79)]
    for e in events:
        assert e.source == "nvml"
        assert e.timestamp == clock.now()
        assert e.uuid == infos[e.gpu or 0].uuid
        assert e.pci_bus_id == infos[e.gpu or 0].pci_bus_id
    assert backend.wait_xid_events(0.01) == []
    assert fake.calls["nvmlEventSetCreate"] == 1  # created lazily, once
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2


def test_fake_event_wait_blocks_like_nvml_until_an_xid_or_the_timeout() -> None:
    """The shipped fake must not return at once from an empty wait: a daemon on it would
    spin (1.5 M calls in 8 s before this was fixed)."""
    backend, fake, _ = make(False, False)
    backend.open()
    start = time.monotonic()
    assert backend.wait_xid_events(0.3) == []
    assert time.monotonic() - start >= 0.25
    threading.Timer(0.1, fake.inject_xid, (0, 79)).start()
    start = time.monotonic()
    events = backend.wait_xid_events(5.0)
    assert [e.xid for e in events] == [79] and time.monotonic() - start < 4.0  # not 5 s


def test_xid_events_survive_a_gpu_without_event_support() -> None:
    backend, fake, _ = make(False, False)
    fake.gpus[0].xid_events_supported = False
    backend.open()
    fake.inject_xid(1, 48)
    assert [(e.gpu, e.xid) for e in backend.wait_xid_events(0.1)] == [(1, 48)]
    backend.wait_xid_events(0.01)
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2  # GPU 0 not retried


def test_xid_wait_on_lost_gpu_returns_empty() -> None:
    backend, fake, _ = make(False)
    backend.open()
    fake.wait_error = pynvml.NVML_ERROR_GPU_IS_LOST
    assert backend.wait_xid_events(0.05) == []
    fake.wait_error = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(BackendError):
        backend.wait_xid_events(0.05)


def test_xid_events_reregister_after_gpu_comes_back() -> None:
    backend, fake, _ = make(False)
    backend.open()
    backend.wait_xid_events(0.01)
    fake.lose(0)
    with pytest.raises(GpuLost):
        backend.sample(0)
    fake.recover(0)
    backend.sample(0)  # fresh handle
    fake.inject_xid(0, 79)
    assert [(e.gpu, e.xid) for e in backend.wait_xid_events(0.1)] == [(0, 79)]
    assert fake.calls["nvmlDeviceRegisterEvents"] == 2


def test_close_frees_event_set_and_shuts_down() -> None:
    backend, fake, _ = make(False)
    backend.open()
    backend.wait_xid_events(0.01)
    backend.close()
    assert fake.calls["nvmlEventSetFree"] == 1
    assert fake.initialised == 0
    assert backend.wait_xid_events(0.01) == []


# --- helpers ---------------------------------------------------------------------------


def test_field_ids_avoid_the_renumbered_range() -> None:
    for spec in (*GPU_FIELD_IDS, *LINK_FIELD_IDS):
        assert spec.field_id < 251
    assert {s.name for s in GPU_FIELD_IDS} <= set(GPU_FIELDS)
    assert {s.name for s in LINK_FIELD_IDS} <= set(LINK_FIELDS)


def test_raw_and_attribute_decoding_agree() -> None:
    values = (pynvml.c_nvmlFieldValue_t * 9)()
    samples = [
        (0, 1.5),
        (1, 4_000_000_000),
        (2, 2**40),
        (3, 2**63 + 5),
        (4, -(2**40)),
        (5, -8),
        (6, 65535),
    ]
    for entry, (vtype, value) in zip(values, samples, strict=False):
        entry.valueType = vtype
        member = ["dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal"][vtype]
        setattr(entry.value, member, value)
    values[7].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    values[8].valueType = 42  # unknown type
    fast = read_field_values(values)
    slow = read_field_values(values, raw=False)
    assert fast == slow
    assert [v for _, v in fast[:7]] == [float(v) for _, v in samples]
    assert fast[7] == (pynvml.NVML_ERROR_NOT_SUPPORTED, None)
    assert fast[8] == (0, None)


def test_error_mapping_in_one_place() -> None:
    assert isinstance(error_from_code(15, "x"), GpuLost)
    assert isinstance(error_from_code(16, "x"), ResetRequired)
    assert isinstance(error_from_code(3, "x"), NotSupported)
    assert isinstance(error_from_code(13, "x"), NotSupported)
    err = error_from_code(4, "GPU 0: nvmlDeviceGetSerial")
    assert type(err) is BackendError and err.code == 4
    assert "NO_PERMISSION" in str(err) and "nvmlDeviceGetSerial" in str(err)


# --- the real thing ----------------------------------------------------------------------


@pytest.mark.gpu
def test_real_gpus_open_and_sample() -> None:
    backend = NvmlBackend(SystemClock())
    try:
        infos = backend.open()
    except BackendUnavailable as exc:
        pytest.skip(f"no NVML here: {exc}")
    try:
        assert infos
        for info in infos:
            assert info.uuid.startswith("GPU-"), info
            assert PCI_RE.match(info.pci_bus_id), info.pci_bus_id
            assert info.name and info.driver
            s = backend.sample(info.index)
            again = backend.sample(info.index)
            for sample in (s, again):
                assert set(sample.fields) <= set(GPU_FIELDS)
                assert not sample.errors, sample.errors
                assert 0 < sample.fields["temperature_gpu"] < 110
                assert sample.fields["memory_total"] > 1e9
                assert 0 <= sample.fields["utilization_gpu"] <= 1
                assert sample.fields["power"] > 1
                assert sample.fields["sm_clock"] > 1e6
                assert len(sample.links) == info.nvlink_count
                for link in sample.links:
                    assert set(link.fields) <= set(LINK_FIELDS)
            for name in ("ecc_corrected_volatile", "remapped_rows_pending", "recovery_action"):
                assert name in s.fields, name
        assert isinstance(backend.wait_xid_events(0.2), list)
    finally:
        backend.close()


def test_the_default_slow_cadence_is_two_minutes() -> None:
    """Energy (4 ms of driver CPU), the violation counters and the margin temperature
    (~1 ms each) are read every 20 s by default: at 1 s polls that keeps the daemon under
    0.3 % of a core on an H100 (docs/PERFORMANCE.md)."""
    fake = FakeNvml([h100(0)])
    clock = VirtualClock()
    backend = NvmlBackend(clock, nvml=fake)
    backend.open()
    for _ in range(120):
        backend.sample(0)
        clock.advance(1)
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 2  # the first poll only
    backend.sample(0)  # 120 s after the first
    assert fake.calls["nvmlDeviceGetViolationStatus"] == 4
