#!/usr/bin/env python3
"""CPU cost of one GPU poll: gpuwatchd's NvmlBackend.sample() vs a plain pynvml loop.

Both read the same fields of the same GPU in the same process, interleaved in rounds so
that drift (clocks, other load) hits both alike. CPU is ``time.process_time`` (user +
system time of this process, i.e. including the kernel work behind NVML's ioctls), divided
by the number of polls. For context it also times ``nvidia-smi --query-gpu`` per call.

    python3 bench/poll_cpu.py                      # real GPUs (needs the NVIDIA driver)
    python3 bench/poll_cpu.py --fake               # no GPU: fake pynvml, FAKE numbers
    python3 bench/poll_cpu.py --dump out.json      # also write GpuInfo, a sample, the
                                                   # NOT_SUPPORTED list and cross-checks

Goal: backend <= 1.5x the plain loop's CPU per poll (batching should make it < 1x).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatchd.core.clock import SystemClock, VirtualClock
from gpuwatchd.sources.gpu.nvml import (
    DEFAULT_SLOW_INTERVAL_S,
    GPU_FIELD_IDS,
    LINK_FIELD_IDS,
    NvmlBackend,
    read_field_values,
)

SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=temperature.gpu,power.draw,ecc.errors.corrected.volatile.total",
    "--format=csv",
]


# --- the plain loop: one pynvml getter per field, as a straightforward exporter does ------


def plain_poller(nv: Any, handle: Any, nvlink_count: int) -> Callable[[], dict[str, float]]:
    """A poll the obvious way: one getter per field, errors swallowed, asked every time."""

    def field(fid: int) -> float | None:
        # no getter exists for these two: a one-entry field-values call, as one would write
        entry = nv.nvmlDeviceGetFieldValues(handle, [fid])[0]
        if entry.nvmlReturn != 0:
            return None
        member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")[entry.valueType]
        return float(getattr(entry.value, member))

    def poll() -> dict[str, float]:
        out: dict[str, float] = {}

        def get(name: str, fn: Callable[..., Any], *args: Any, scale: float = 1.0) -> None:
            try:
                value = fn(handle, *args) if fn is not field else fn(*args)
            except nv.NVMLError:
                return
            if value is not None:
                out[name] = float(value) * scale

        get("temperature_gpu", nv.nvmlDeviceGetTemperature, 0)
        get("temperature_memory", field, 82)
        get("power", nv.nvmlDeviceGetPowerUsage, scale=1e-3)
        get("energy", nv.nvmlDeviceGetTotalEnergyConsumption, scale=1e-3)
        get("sm_clock", nv.nvmlDeviceGetClockInfo, 1, scale=1e6)
        get("memory_clock", nv.nvmlDeviceGetClockInfo, 2, scale=1e6)
        try:
            util = nv.nvmlDeviceGetUtilizationRates(handle)
            out["utilization_gpu"] = util.gpu / 100
            out["utilization_memory"] = util.memory / 100
        except nv.NVMLError:
            pass
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            out["memory_used"], out["memory_free"] = float(mem.used), float(mem.free)
            out["memory_total"] = float(mem.total)
        except nv.NVMLError:
            pass
        get("ecc_corrected_volatile", nv.nvmlDeviceGetTotalEccErrors, 0, 0)
        get("ecc_uncorrected_volatile", nv.nvmlDeviceGetTotalEccErrors, 1, 0)
        get("ecc_corrected_aggregate", nv.nvmlDeviceGetTotalEccErrors, 0, 1)
        get("ecc_uncorrected_aggregate", nv.nvmlDeviceGetTotalEccErrors, 1, 1)
        with contextlib.suppress(nv.NVMLError):
            out["retired_pages_sbe"] = float(len(nv.nvmlDeviceGetRetiredPages(handle, 0)))
        with contextlib.suppress(nv.NVMLError):
            out["retired_pages_dbe"] = float(len(nv.nvmlDeviceGetRetiredPages(handle, 1)))
        get("retired_pages_pending", nv.nvmlDeviceGetRetiredPagesPendingStatus)
        try:
            cor, unc, pending, failure = nv.nvmlDeviceGetRemappedRows(handle)
            out["remapped_rows_correctable"], out["remapped_rows_uncorrectable"] = cor, unc
            out["remapped_rows_pending"], out["remapped_rows_failure"] = pending, failure
        except nv.NVMLError:
            pass
        with contextlib.suppress(nv.NVMLError):
            out["violation_power"] = nv.nvmlDeviceGetViolationStatus(handle, 0).violationTime * 1e-9
        with contextlib.suppress(nv.NVMLError):
            out["violation_thermal"] = (
                nv.nvmlDeviceGetViolationStatus(handle, 1).violationTime * 1e-9
            )
        get("clock_event_reasons", nv.nvmlDeviceGetCurrentClocksEventReasons)
        get("pcie_replay", nv.nvmlDeviceGetPcieReplayCounter)
        get("pcie_link_generation", nv.nvmlDeviceGetCurrPcieLinkGeneration)
        get("pcie_link_generation_max", nv.nvmlDeviceGetMaxPcieLinkGeneration)
        get("pcie_link_width", nv.nvmlDeviceGetCurrPcieLinkWidth)
        get("pcie_link_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth)
        with contextlib.suppress(nv.NVMLError):
            out["compute_processes"] = float(len(nv.nvmlDeviceGetComputeRunningProcesses(handle)))
        get("recovery_action", field, 230)
        for link in range(nvlink_count):
            get(f"nvlink_up[{link}]", nv.nvmlDeviceGetNvLinkState, link)
            get(f"nvlink_replay_errors[{link}]", nv.nvmlDeviceGetNvLinkErrorCounter, link, 0)
            get(f"nvlink_recovery_errors[{link}]", nv.nvmlDeviceGetNvLinkErrorCounter, link, 1)
            get(f"nvlink_crc_errors[{link}]", nv.nvmlDeviceGetNvLinkErrorCounter, link, 2)
        return out

    return poll


# --- measuring -------------------------------------------------------------------------


def cpu_per_call(fn: Callable[[], Any], iterations: int) -> tuple[float, float]:
    """(CPU seconds, wall seconds) per call, over ``iterations`` calls."""
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.process_time() - c0) / iterations, (time.perf_counter() - w0) / iterations


def interleaved(
    variants: list[Callable[[], Any]], iterations: int, rounds: int = 4
) -> list[tuple[float, float]]:
    """(CPU, wall) seconds per call of each variant, run in turn for ``rounds`` rounds."""
    per_round = max(1, iterations // rounds)
    totals = [[0.0, 0.0] for _ in variants]
    for _ in range(rounds):
        for total, fn in zip(totals, variants, strict=True):
            cpu, wall = cpu_per_call(fn, per_round)
            total[0] += cpu / rounds
            total[1] += wall / rounds
    return [(c, w) for c, w in totals]


def time_nvidia_smi(calls: int) -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    w0 = time.perf_counter()
    last = ""
    for _ in range(calls):
        last = subprocess.run(
            [exe, *SMI_QUERY[1:]], capture_output=True, text=True, check=False
        ).stdout
    wall = (time.perf_counter() - w0) / calls
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = ((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) / calls
    return {"calls": calls, "cpu_us": cpu * 1e6, "wall_us": wall * 1e6, "output": last.strip()}


def breakdown(nv: Any, backend: NvmlBackend, index: int, iterations: int) -> list[dict[str, Any]]:
    """CPU per single call, for what the two polls are made of."""
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    batch = backend.field_batch(index)
    fast = backend.field_batch(index, full=False)
    answer = nv.nvmlDeviceGetFieldValues(handle, batch)
    names = {s.field_id: s.name for s in (*GPU_FIELD_IDS, *LINK_FIELD_IDS)}
    names.update(
        {
            74: "perf policy power",
            75: "perf policy thermal",
            185: "power average",
            186: "power instant",
        }
    )
    calls: list[tuple[str, Callable[[], Any]]] = [
        (
            f"nvmlDeviceGetFieldValues ({len(batch)} ids, full batch)",
            lambda: nv.nvmlDeviceGetFieldValues(handle, batch),
        ),
        (
            f"nvmlDeviceGetFieldValues ({len(fast)} ids, fast batch)",
            lambda: nv.nvmlDeviceGetFieldValues(handle, fast),
        ),
        (f"  decode {len(batch)} entries (raw buffer)", lambda: read_field_values(answer)),
        (
            f"  decode {len(batch)} entries (attributes)",
            lambda: read_field_values(answer, raw=False),
        ),
    ]
    one_ids = sorted({fid for fid, scope in batch if scope == 0} | {74, 75, 185, 186})
    for fid in one_ids:
        calls.append(
            (
                f"  field {fid} alone ({names.get(fid, '?')})",
                functools.partial(nv.nvmlDeviceGetFieldValues, handle, [(fid, 0)]),
            )
        )
    calls += [
        ("nvmlDeviceGetTemperature", lambda: nv.nvmlDeviceGetTemperature(handle, 0)),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(handle)),
        (
            "nvmlDeviceGetTotalEnergyConsumption",
            lambda: nv.nvmlDeviceGetTotalEnergyConsumption(handle),
        ),
        ("nvmlDeviceGetClockInfo(SM)", lambda: nv.nvmlDeviceGetClockInfo(handle, 1)),
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(handle)),
        ("nvmlDeviceGetMemoryInfo", lambda: nv.nvmlDeviceGetMemoryInfo(handle)),
        ("nvmlDeviceGetTotalEccErrors", lambda: nv.nvmlDeviceGetTotalEccErrors(handle, 0, 0)),
        ("nvmlDeviceGetRemappedRows", lambda: nv.nvmlDeviceGetRemappedRows(handle)),
        ("nvmlDeviceGetRetiredPages", lambda: nv.nvmlDeviceGetRetiredPages(handle, 0)),
        ("nvmlDeviceGetViolationStatus", lambda: nv.nvmlDeviceGetViolationStatus(handle, 0)),
        (
            "nvmlDeviceGetCurrentClocksEventReasons",
            lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        ),
        ("nvmlDeviceGetPcieReplayCounter", lambda: nv.nvmlDeviceGetPcieReplayCounter(handle)),
        (
            "nvmlDeviceGetCurrPcieLinkGeneration",
            lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(handle),
        ),
        (
            "nvmlDeviceGetMaxPcieLinkGeneration",
            lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(handle),
        ),
        (
            "nvmlDeviceGetComputeRunningProcesses",
            lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle),
        ),
        ("nvmlDeviceGetNvLinkState(0)", lambda: nv.nvmlDeviceGetNvLinkState(handle, 0)),
    ]
    if hasattr(nv, "_nvmlGetFunctionPointer"):  # real pynvml: the C call alone, no wrapper
        import ctypes

        c_fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
        prebuilt = (nv.c_nvmlFieldValue_t * len(fast))()
        for entry, (fid, scope) in zip(prebuilt, fast, strict=True):
            entry.fieldId, entry.scopeId = fid, scope
        calls.insert(
            2,
            (
                "  fast batch, C function on a prebuilt array (no pynvml wrapper)",
                lambda: c_fn(handle, ctypes.c_int32(len(fast)), ctypes.byref(prebuilt)),
            ),
        )
    rows = []
    for name, fn in calls:

        def guarded(fn: Callable[[], Any] = fn) -> Any:
            try:
                return fn()
            except nv.NVMLError as exc:
                return exc

        result = guarded()
        status = "ok" if not isinstance(result, nv.NVMLError) else f"raises {type(result).__name__}"
        cpu, wall = cpu_per_call(guarded, iterations)
        rows.append({"call": name, "status": status, "cpu_us": cpu * 1e6, "wall_us": wall * 1e6})
    return rows


# --- facts for docs/real-gpu.md --------------------------------------------------------


def crosscheck(nv: Any, index: int) -> dict[str, Any]:
    """Field ids vs getters for the same quantity, and the threshold/T.Limit readings."""
    handle = nv.nvmlDeviceGetHandleByIndex(index)

    def call(fn: Callable[..., Any], *args: Any) -> Any:
        try:
            value = fn(handle, *args)
        except nv.NVMLError as exc:
            return f"{type(exc).__name__}"
        except Exception as exc:  # wrappers missing in this pynvml
            return f"{type(exc).__name__}: {exc}"
        return value

    ids = [83, 74, 75, 185, 186, 193, 194, 195, 196, 1, 2, 91, 92, 93, 301, 302]
    fields = {}
    for (fid, _), (ret, value) in zip(
        [(f, 0) for f in ids],
        read_field_values(nv.nvmlDeviceGetFieldValues(handle, ids)),
        strict=True,
    ):
        fields[str(fid)] = value if ret == 0 else f"ret={ret}"
    viol = [call(nv.nvmlDeviceGetViolationStatus, p) for p in (0, 1)]
    return {
        "fields": fields,
        "energy_getter_mJ": call(nv.nvmlDeviceGetTotalEnergyConsumption),
        "power_getter_mW": call(nv.nvmlDeviceGetPowerUsage),
        "violation_power_ns": getattr(viol[0], "violationTime", viol[0]),
        "violation_thermal_ns": getattr(viol[1], "violationTime", viol[1]),
        "temperature": call(nv.nvmlDeviceGetTemperature, 0),
        "temperatureV": call(nv.nvmlDeviceGetTemperatureV, 0),
        "margin_temperature": call(nv.nvmlDeviceGetMarginTemperature)
        if hasattr(nv, "nvmlDeviceGetMarginTemperature")
        else "n/a",
        "thresholds_0_to_3": [call(nv.nvmlDeviceGetTemperatureThreshold, t) for t in range(4)],
        "supported_event_types": call(nv.nvmlDeviceGetSupportedEventTypes)
        if hasattr(nv, "nvmlDeviceGetSupportedEventTypes")
        else "n/a",
        "clocks_event_reasons": call(nv.nvmlDeviceGetCurrentClocksEventReasons),
        "persistence_mode": call(nv.nvmlDeviceGetPersistenceMode)
        if hasattr(nv, "nvmlDeviceGetPersistenceMode")
        else "n/a",
    }


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--fake", action="store_true", help="use the fake pynvml (no GPU needed)")
    ap.add_argument("--iterations", type=int, default=2000, help="polls per variant per GPU")
    ap.add_argument(
        "--poll-interval", type=float, default=1.0, help="daemon poll interval to model (s)"
    )
    ap.add_argument("--smi-calls", type=int, default=20, help="nvidia-smi calls to time")
    ap.add_argument("--breakdown", action="store_true", help="CPU per individual NVML call")
    ap.add_argument("--dump", type=Path, help="write GpuInfo, samples and checks as JSON")
    ap.add_argument("--json", type=Path, help="write the measured numbers as JSON")
    args = ap.parse_args(argv)

    if args.fake:
        from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

        nv: Any = FakeNvml([h100(0), h100(1, nvlink=True)])
        label = "FAKE (gpuwatchd.testing.fake_pynvml; Python overhead only, NOT real numbers)"
    else:
        import pynvml

        nv = pynvml
        label = "REAL NVML"
    backend = NvmlBackend(SystemClock(), nvml=nv)
    infos = backend.open()
    import importlib.metadata as md

    try:
        nvml_py = md.version("nvidia-ml-py")
    except md.PackageNotFoundError:
        nvml_py = "?"
    print(f"mode:      {label}")
    print(f"host:      {platform.node()}  cpu: {cpu_model()}  ({os.cpu_count()} cpus)")
    print(f"python:    {platform.python_version()}  nvidia-ml-py {nvml_py}")
    print(f"driver:    {infos[0].driver}")
    for info in infos:
        print(
            f"GPU {info.index}:     {info.name}  {info.pci_bus_id}  {info.uuid}  "
            f"nvlinks={info.nvlink_count}"
        )
    print()

    result: dict[str, Any] = {
        "mode": "fake" if args.fake else "real",
        "driver": infos[0].driver,
        "nvidia_ml_py": nvml_py,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "iterations": args.iterations,
        "gpus": [],
    }

    # warm up: the backend learns what is NOT_SUPPORTED on the first poll
    for info in infos:
        for _ in range(3):
            backend.sample(info.index)

    if args.dump:
        dump = {
            "mode": result["mode"],
            "gpus": [
                {
                    "info": info.as_dict(),
                    "sample": backend.sample(info.index).as_dict(),
                    "sample_errors": dict(backend.sample(info.index).errors),
                    "not_supported": backend.not_supported(info.index),
                    "field_batch": backend.field_batch(info.index),
                    "crosscheck": crosscheck(nv, info.index),
                }
                for info in infos
            ],
        }
        args.dump.write_text(json.dumps(dump, indent=2, default=str) + "\n")
        print(f"wrote {args.dump}")
        for g in dump["gpus"]:
            print(f"GPU {g['info']['index']} NOT_SUPPORTED: {', '.join(g['not_supported']) or '-'}")
        print()

    # Three variants per GPU, interleaved:
    #  cadence: the backend as the daemon runs it (slow fields every 10 s), polled every
    #           --poll-interval seconds of a virtual clock (NVML itself is real)
    #  every:   the backend reading every field on every poll (slow_interval_s=0)
    #  plain:   one pynvml getter per field
    vclock = VirtualClock()
    cadence = NvmlBackend(vclock, nvml=nv)
    cadence.open()
    every = NvmlBackend(SystemClock(), nvml=nv, slow_interval_s=0)
    every.open()
    print(
        f"CPU per poll (us), {args.iterations} polls per variant, interleaved in 4 rounds;"
        f" cadence = slow fields every {DEFAULT_SLOW_INTERVAL_S:g} s at one poll per"
        f" {args.poll_interval:g} s"
    )
    print(
        f"{'GPU':>3}  {'cadence':>9}  {'every':>9}  {'plain':>9}  {'cad/plain':>9}  "
        f"{'every/plain':>11}  {'wall c/e/p us':>22}  {'values e/p':>10}"
    )
    for info in infos:
        i = info.index
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        plain = plain_poller(nv, handle, info.nvlink_count)
        for b in (cadence, every):
            for _ in range(3):
                b.sample(i)
        sample = every.sample(i)
        n_backend = len(sample.fields) + sum(len(ls.fields) for ls in sample.links)
        n_plain = len(plain())

        def cadence_poll(i: int = i) -> None:
            vclock.advance(args.poll_interval)
            cadence.sample(i)

        (cc, cw), (ec, ew), (pc, pw) = interleaved(
            [cadence_poll, functools.partial(every.sample, i), plain], args.iterations
        )
        print(
            f"{i:>3}  {cc * 1e6:>9.1f}  {ec * 1e6:>9.1f}  {pc * 1e6:>9.1f}  "
            f"{cc / pc:>8.2f}x  {ec / pc:>10.2f}x  "
            f"{cw * 1e6:>7.0f}/{ew * 1e6:>6.0f}/{pw * 1e6:>7.0f}  {n_backend:>4}/{n_plain:<5}"
        )
        result["gpus"].append(
            {
                "gpu": i,
                "name": info.name,
                "nvlink_count": info.nvlink_count,
                "poll_interval_s": args.poll_interval,
                "cadence_cpu_us": cc * 1e6,
                "every_cpu_us": ec * 1e6,
                "plain_cpu_us": pc * 1e6,
                "ratio_cadence": cc / pc,
                "ratio_every": ec / pc,
                "cadence_wall_us": cw * 1e6,
                "every_wall_us": ew * 1e6,
                "plain_wall_us": pw * 1e6,
                "backend_values": n_backend,
                "plain_values": n_plain,
                "batch_ids_full": len(every.field_batch(i)),
                "batch_ids_fast": len(every.field_batch(i, full=False)),
            }
        )
    cadence.close()
    every.close()
    print()

    if args.breakdown:
        for info in infos:
            rows = breakdown(nv, backend, info.index, max(100, args.iterations // 4))
            result["gpus"][info.index]["breakdown"] = rows
            print(f"GPU {info.index}: CPU per single call")
            for r in rows:
                print(
                    f"  {r['call']:<58} {r['cpu_us']:>8.1f} us cpu {r['wall_us']:>8.1f} us wall"
                    f"  {r['status']}"
                )
            print()

    smi = None if args.fake else time_nvidia_smi(args.smi_calls)
    result["nvidia_smi"] = smi
    if smi is None:
        print("nvidia-smi: not timed (" + ("fake mode" if args.fake else "not found") + ")")
    else:
        print(
            f"nvidia-smi --query-gpu=temperature.gpu,power.draw,"
            f"ecc.errors.corrected.volatile.total --format=csv, {smi['calls']} calls:"
        )
        print(f"  {smi['cpu_us']:.0f} us CPU (child) and {smi['wall_us']:.0f} us wall per call")
        print("  " + smi["output"].replace("\n", "\n  "))
    backend.close()
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
