"""Which NVML calls corrupt the heap on a busy multi-GPU host: one variant per process.

Each variant hammers libnvidia-ml in its own way for ``--seconds`` and exits 0 if it
survived; run every variant side by side under glibc's malloc checker
(``LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3``) while an NCCL all-reduce keeps
compute processes on the GPUs (``bench/nccl_load.py``). ``bench/nvml_heap_matrix.sh``
does exactly that and prints one line per variant; docs/real-gpu.md has the results.

Variants (``--variant``):
  procs-threads        one thread per GPU, each calling nvmlDeviceGetComputeRunningProcesses
  procs-threads-locked the same, every call under one process-wide lock
  procs-one-thread     one thread asking every GPU in turn
  procs-events         procs-threads plus one thread waiting in nvmlEventSetWait
  fields-threads       one thread per GPU, nvmlDeviceGetFieldValues with ``--ids`` (default:
                       ECC, temperature, energy and every NVLink counter on 18 links)
  fields-canary        the same, but the array passed holds ``--ids`` followed by a guard
                       of 8 entries that NVML must not touch: does it write past the end?
  getters-threads      one thread per GPU, the plain getters (temperature, power, clocks,
                       utilization, memory, NVLink state), no process lists, no field values
  procs-canary         one thread; the process list into an exactly sized buffer with a
                       guard area after it: does the library write past ``count`` entries?
  backend-threads      gpuwatchd's NvmlBackend.sample() on one thread per GPU, as shipped
  backend-threads-proclock  the same with the process-list calls under one process-wide lock
  backend-proxy        NvmlBackend.sample() per thread through a pynvml proxy set by ``--ids``:
                       ``lock=all`` (every call under one lock), ``lock=NAME+NAME``,
                       ``fail=NAME+NAME`` (those answer NOT_SUPPORTED), ``canary`` (field
                       values into a guarded array, counted when NVML writes past it)
  calls-threads        one thread per GPU looping over the getters named in ``--ids``
                       (names of pynvml functions with the backend's arguments)
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml as nv

PROC_SIZE = ctypes.sizeof(nv.c_nvmlProcessInfo_t)


def _loop(deadline: float, body: Callable[[], None], counts: list[int], i: int) -> None:
    while time.monotonic() < deadline:
        body()
        counts[i] += 1


def _procs(handle: Any, lock: threading.Lock | None) -> Callable[[], None]:
    def body() -> None:
        try:
            if lock is None:
                nv.nvmlDeviceGetComputeRunningProcesses(handle)
            else:
                with lock:
                    nv.nvmlDeviceGetComputeRunningProcesses(handle)
        except nv.NVMLError:
            pass

    return body


DEFAULT_IDS = [(i, 0) for i in (1, 2, 3, 4, 5, 6, 32, 40, 41, 42, 81, 82, 83, 84, 99, 100)] + [
    (f, link) for link in range(18) for f in (160, 161, 162, 163, 164, 165)
]


def parse_ids(spec: str) -> list[tuple[int, int]]:
    """``"230,94,161@0-17"``: field ids, ``@a-b`` for every scope (link) a..b."""
    out: list[tuple[int, int]] = []
    for part in spec.split(","):
        fid, _, scopes = part.partition("@")
        if scopes:
            lo, _, hi = scopes.partition("-")
            out += [(int(fid), s) for s in range(int(lo), int(hi or lo) + 1)]
        else:
            out.append((int(fid), 0))
    return out


def _fields_canary(handle: Any, ids: list[tuple[int, int]], hits: list[str]) -> Callable[[], None]:
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    n = len(ids)
    size = ctypes.sizeof(nv.c_nvmlFieldValue_t)

    def body() -> None:
        arr = (nv.c_nvmlFieldValue_t * (n + 8))()
        ctypes.memset(ctypes.byref(arr, n * size), 0xAB, 8 * size)
        for i, (fid, scope) in enumerate(ids):
            arr[i].fieldId, arr[i].scopeId = fid, scope
        fn(handle, ctypes.c_int32(n), ctypes.byref(arr))
        tail = ctypes.string_at(ctypes.addressof(arr) + n * size, 8 * size)
        if tail != b"\xab" * (8 * size) and len(hits) < 20:
            first = next(i for i, b in enumerate(tail) if b != 0xAB)
            hits.append(f"wrote into the guard at byte {first} past {n} entries")

    return body


def _fields(handle: Any, ids: list[tuple[int, int]]) -> Callable[[], None]:
    def body() -> None:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlDeviceGetFieldValues(handle, ids)

    return body


def _getters(handle: Any) -> Callable[[], None]:
    def body() -> None:
        for fn, args in (
            (nv.nvmlDeviceGetTemperature, (0,)),
            (nv.nvmlDeviceGetPowerUsage, ()),
            (nv.nvmlDeviceGetClockInfo, (1,)),
            (nv.nvmlDeviceGetUtilizationRates, ()),
            (nv.nvmlDeviceGetMemoryInfo, ()),
            (nv.nvmlDeviceGetCurrentClocksEventReasons, ()),
            (nv.nvmlDeviceGetNvLinkState, (0,)),
        ):
            with contextlib.suppress(nv.NVMLError):
                fn(handle, *args)

    return body


def _events(handles: list[Any], deadline: float, counts: list[int], i: int) -> None:
    es = nv.nvmlEventSetCreate()
    for h in handles:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
    while time.monotonic() < deadline:
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlEventSetWait(es, 200)
        counts[i] += 1


class _LockedProcs:
    """pynvml with its process-list calls under one lock (everything else passes through)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        fn = getattr(nv, name)
        if not name.startswith("nvmlDeviceGetComputeRunningProcesses"):
            return fn

        def locked(*args: Any) -> Any:
            with self._lock:
                return fn(*args)

        return locked


class _Proxy:
    """pynvml as the backend sees it, with some calls locked, failing or guarded."""

    def __init__(self, spec: str) -> None:
        self.lock = threading.Lock()
        self.lock_all = spec == "lock=all"
        self.locked = set(spec[5:].split("+")) if spec.startswith("lock=") else set()
        self.failing = set(spec[5:].split("+")) if spec.startswith("fail=") else set()
        self.canary = spec == "canary"
        self.hits: list[str] = []

    def __getattr__(self, name: str) -> Any:
        fn = getattr(nv, name)
        if not name.startswith("nvml") or not callable(fn) or name.startswith("nvmlInit"):
            return fn
        if name in self.failing:

            def failing(*args: Any, **kw: Any) -> Any:
                raise nv.NVMLError(3)

            return failing
        if self.canary and name == "nvmlDeviceGetFieldValues":
            return self._guarded_fields
        if self.lock_all or name in self.locked:

            def locked(*args: Any, **kw: Any) -> Any:
                with self.lock:
                    return fn(*args, **kw)

            return locked
        return fn

    def _guarded_fields(self, handle: Any, ids: list[tuple[int, int]]) -> Any:
        n = len(ids)
        size = ctypes.sizeof(nv.c_nvmlFieldValue_t)
        arr = (nv.c_nvmlFieldValue_t * (n + 8))()
        ctypes.memset(ctypes.byref(arr, n * size), 0xAB, 8 * size)
        for i, (fid, scope) in enumerate(ids):
            arr[i].fieldId, arr[i].scopeId = fid, scope
        ret = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")(
            handle, ctypes.c_int32(n), ctypes.byref(arr)
        )
        tail = ctypes.string_at(ctypes.addressof(arr) + n * size, 8 * size)
        if tail != b"\xab" * (8 * size):
            print(f"canary: NVML wrote past {n} entries ({ids})", flush=True)
            self.hits.append("x")
        if ret != 0:
            raise nv.NVMLError(ret)
        out = (nv.c_nvmlFieldValue_t * n)()
        ctypes.memmove(out, arr, n * size)
        return out


GETTERS: dict[str, tuple[Any, ...]] = {
    "nvmlDeviceGetTemperatureV": (0,),
    "nvmlDeviceGetMemoryInfo": (),
    "nvmlDeviceGetViolationStatus": (0,),
    "nvmlDeviceGetMarginTemperature": (),
    "nvmlDeviceGetRowRemapperHistogram": (),
    "nvmlDeviceGetCurrPcieLinkGeneration": (),
    "nvmlDeviceGetCurrPcieLinkWidth": (),
    "nvmlDeviceGetMaxPcieLinkGeneration": (),
    "nvmlDeviceGetMaxPcieLinkWidth": (),
    "nvmlDeviceGetClockInfo": (2,),
    "nvmlDeviceGetMemoryErrorCounter": (0, 0, 2),
    "nvmlDeviceGetTotalEnergyConsumption": (),
    "nvmlDeviceGetComputeRunningProcesses": (),
    "nvmlDeviceGetPowerUsage": (),
    "nvmlDeviceGetUtilizationRates": (),
    "nvmlDeviceGetCurrentClocksEventReasons": (),
}


def _calls(handle: Any, names: list[str]) -> Callable[[], None]:
    def body() -> None:
        for name in names:
            kw = {"version": nv.nvmlMemory_v2} if name == "nvmlDeviceGetMemoryInfo" else {}
            with contextlib.suppress(nv.NVMLError):
                getattr(nv, name)(handle, *GETTERS[name], **kw)

    return body


def canary(handles: list[Any], deadline: float) -> int:
    """Calls the C function with an exactly sized buffer; returns how many calls wrote past it."""
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
    guard = 4096
    overruns = calls = nonempty = 0
    while time.monotonic() < deadline:
        for h in handles:
            count = ctypes.c_uint(0)
            ret = fn(h, ctypes.byref(count), None)
            if ret != 7:  # INSUFFICIENT_SIZE: there are processes
                continue
            n = count.value
            nonempty += 1
            buf = (ctypes.c_ubyte * (n * PROC_SIZE + guard))(*([0xAB] * (n * PROC_SIZE + guard)))
            c = ctypes.c_uint(n)
            ret = fn(h, ctypes.byref(c), buf)
            calls += 1
            tail = bytes(buf[n * PROC_SIZE :])
            if tail != b"\xab" * guard:
                last = max(i for i, b in enumerate(tail) if b != 0xAB)
                overruns += 1
                if overruns <= 5:
                    print(f"canary: {n} processes, ret {ret}, wrote {last + 1} bytes past the end")
    print(
        f"canary: {calls} sized calls on GPUs with processes ({nonempty} non-empty), "
        f"{overruns} wrote past the buffer; struct size {PROC_SIZE}"
    )
    return overruns


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", required=True)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--ids", default="", help="field ids for fields-*: 230,94,161@0-17")
    ap.add_argument("--name", default="", help="label for the output line")
    args = ap.parse_args()
    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    deadline = time.monotonic() + args.seconds
    counts = [0] * (len(handles) + 1)
    threads: list[threading.Thread] = []
    v = args.variant
    if v == "procs-canary":
        return 1 if canary(handles, deadline) else 0
    proxy: _Proxy | None = None
    if v == "calls-threads":
        names = [n if n.startswith("nvml") else "nvmlDeviceGet" + n for n in args.ids.split(",")]
        bodies = [_calls(h, names) for h in handles]
    elif v.startswith("backend"):
        sys.path.insert(0, ".")
        from gpuwatchd.core.clock import SystemClock
        from gpuwatchd.sources.gpu.nvml import NvmlBackend

        module: Any = None
        if v == "backend-threads-proclock":
            module = _LockedProcs()
        if v == "backend-proxy":
            module = proxy = _Proxy(args.ids)
        backend = NvmlBackend(SystemClock(), nvml=module, slow_interval_s=0)
        backend.open()
        if args.ids == "one-thread" and proxy is None:
            bodies = [lambda: [backend.sample(i) for i in range(len(handles))] and None]
        else:
            bodies = [lambda i=i: backend.sample(i) for i in range(len(handles))]
    elif v in ("procs-threads", "procs-events"):
        bodies = [_procs(h, None) for h in handles]
    elif v == "procs-threads-locked":
        lock = threading.Lock()
        bodies = [_procs(h, lock) for h in handles]
    elif v == "procs-one-thread":
        each = [_procs(h, None) for h in handles]
        bodies = [lambda: [b() for b in each] and None]
    elif v == "fields-threads":
        ids = parse_ids(args.ids) if args.ids else DEFAULT_IDS
        bodies = [_fields(h, ids) for h in handles]
    elif v == "fields-canary":
        ids = parse_ids(args.ids) if args.ids else DEFAULT_IDS
        hits: list[str] = []
        bodies = [_fields_canary(h, ids, hits) for h in handles]
    elif v == "getters-threads":
        bodies = [_getters(h) for h in handles]
    else:
        print(f"unknown variant {v}")
        return 2
    for i, body in enumerate(bodies):
        threads.append(threading.Thread(target=_loop, args=(deadline, body, counts, i)))
    if v == "procs-events":
        threads.append(
            threading.Thread(target=_events, args=(handles, deadline, counts, len(handles)))
        )
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if proxy is not None and proxy.hits:
        print(f"{v} {args.name}: NVML wrote past the field-values array {len(proxy.hits)} times")
        return 1
    if v == "fields-canary" and hits:
        print("\n".join(hits))
        print(f"{v} {args.name}: NVML wrote past the array ({len(hits)}+ times)")
        return 1
    print(f"{v} {args.name}: survived {args.seconds:g} s, calls per thread {counts}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
