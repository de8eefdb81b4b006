"""CPU per NVML call, one line per candidate way of reading a value (GPU 1 by default).

Tells which call is the cheapest for each value the daemon reads; docs/PERFORMANCE.md
("Cheapest call per value") has the results from a busy 4-GPU NVLink host.

    python3 bench/nvml_call_cost.py [--gpu 1] [--repeat 50] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Callable
from typing import Any

import pynvml as nv


def cost(fn: Callable[[], Any], repeat: int, gap: float = 0.0) -> tuple[float, float, str]:
    """(CPU us per call, wall us per call, outcome). ``gap`` > 0: ``gap`` seconds between
    calls (not counted), so a value NVML caches for a moment is read cold each time, as a
    daemon polling every second reads it."""
    outcome = "ok"
    try:
        fn()
    except nv.NVMLError as exc:
        outcome = f"error {exc}"
    if gap > 0:
        cpu = wall = 0.0
        for _ in range(repeat):
            time.sleep(gap)
            c0, w0 = time.process_time(), time.perf_counter()
            with contextlib.suppress(nv.NVMLError):
                fn()
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
        return cpu / repeat * 1e6, wall / repeat * 1e6, outcome
    c0, w0 = time.thread_time(), time.perf_counter()
    for _ in range(repeat):
        with contextlib.suppress(nv.NVMLError):
            fn()
    return (
        (time.thread_time() - c0) / repeat * 1e6,
        (time.perf_counter() - w0) / repeat * 1e6,
        outcome,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--json")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between calls (cold reads)")
    args = ap.parse_args()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(args.gpu)
    links = 18
    cands: dict[str, Callable[[], Any]] = {
        "NvLinkState x18 (getter)": lambda: [
            nv.nvmlDeviceGetNvLinkState(h, i) for i in range(links)
        ],
        "NvLinkState x18 (field 165)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(165, i) for i in range(links)]
        ),
        "NvLinkErrorCounter x18x4 (getter)": lambda: [
            nv.nvmlDeviceGetNvLinkErrorCounter(h, i, c) for i in range(links) for c in range(4)
        ],
        "NvLinkErrorCounter 1 link 1 counter": lambda: nv.nvmlDeviceGetNvLinkErrorCounter(h, 0, 0),
        "fields 160-164 x18 (5 per link)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(f, i) for i in range(links) for f in (160, 161, 162, 163, 164)]
        ),
        "field 160 x18 (CRC flit)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(160, i) for i in range(links)]
        ),
        "field 161 x18": lambda: nv.nvmlDeviceGetFieldValues(h, [(161, i) for i in range(links)]),
        "field 162 x18": lambda: nv.nvmlDeviceGetFieldValues(h, [(162, i) for i in range(links)]),
        "field 163 x18": lambda: nv.nvmlDeviceGetFieldValues(h, [(163, i) for i in range(links)]),
        "field 164 x18": lambda: nv.nvmlDeviceGetFieldValues(h, [(164, i) for i in range(links)]),
        "fields totals 44-59 scope 0 (NVLink totals)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(f, 0) for f in (44, 51, 58, 65, 66, 67)]
        ),
        "ECC fields 1-6": lambda: nv.nvmlDeviceGetFieldValues(h, [(f, 0) for f in range(1, 7)]),
        "field 142 row remap (x4 142-145)": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(f, 0) for f in (142, 143, 144, 145)]
        ),
        "RemappedRows (getter)": lambda: nv.nvmlDeviceGetRemappedRows(h),
        "TotalEnergyConsumption (getter)": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "ViolationStatus power": lambda: nv.nvmlDeviceGetViolationStatus(h, 0),
        "PcieReplayCounter (getter)": lambda: nv.nvmlDeviceGetPcieReplayCounter(h),
        "Temperature": lambda: nv.nvmlDeviceGetTemperature(h, 0),
        "PowerUsage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "ClockInfo SM": lambda: nv.nvmlDeviceGetClockInfo(h, 1),
        "UtilizationRates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "MemoryInfo": lambda: nv.nvmlDeviceGetMemoryInfo(h),
        "ClocksEventReasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(h),
        "CurrPcieLinkGeneration": lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h),
        "CurrPcieLinkWidth": lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h),
        "ComputeRunningProcesses": lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
        "MemoryErrorCounter DRAM corrected": lambda: nv.nvmlDeviceGetMemoryErrorCounter(h, 0, 0, 2),
        "MarginTemperature": lambda: nv.nvmlDeviceGetMarginTemperature(h),
        "RowRemapperHistogram": lambda: nv.nvmlDeviceGetRowRemapperHistogram(h),
        "ECC fields 3,4,5,6": lambda: nv.nvmlDeviceGetFieldValues(
            h, [(f, 0) for f in (3, 4, 5, 6)]
        ),
        "ECC fields 11,12": lambda: nv.nvmlDeviceGetFieldValues(h, [(11, 0), (12, 0)]),
        "field 230 recovery action": lambda: nv.nvmlDeviceGetFieldValues(h, [(230, 0)]),
        "ClockInfo MEM": lambda: nv.nvmlDeviceGetClockInfo(h, 2),
        "TemperatureV": lambda: nv.nvmlDeviceGetTemperatureV(h, 0),
        "MemoryInfo v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "temperature mem field 82": lambda: nv.nvmlDeviceGetFieldValues(h, [(82, 0)]),
    }
    out = {}
    for name, fn in cands.items():
        try:
            cpu, wall, outcome = cost(fn, args.repeat, args.gap)
        except Exception as exc:  # a pynvml without the wrapper
            print(f"{name:45s} unavailable: {exc!r}")
            continue
        out[name] = {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1), "outcome": outcome}
        print(f"{name:45s} cpu {cpu:9.1f} us  wall {wall:9.1f} us  {outcome}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
