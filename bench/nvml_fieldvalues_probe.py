"""Probe: does nvmlDeviceGetFieldValues write past the values it was given?

Calls the C function directly with an array larger than the count it is told, fills the
spare tail with a canary pattern, and reports whether the driver touched it, for batches
of different sizes and with/without per-link scoped NVLink fields. Used to find the cause
of heap corruption seen on a 2 x H200 NVLink machine (docs/real-gpu.md).
"""

from __future__ import annotations

import ctypes
import sys

import pynvml as nv

GPU_FIELDS = [1, 2, 3, 4, 5, 6, 29, 30, 31, 82, 83, 94, 142, 143, 144, 145, 230]
LINK_FIELDS = [161, 162, 163, 165]


def probe(handle: object, ids: list[tuple[int, int]], spare: int = 64) -> tuple[int, int]:
    n = len(ids)
    arr = (nv.c_nvmlFieldValue_t * (n + spare))()
    raw = ctypes.cast(ctypes.byref(arr), ctypes.POINTER(ctypes.c_ubyte))
    size = ctypes.sizeof(nv.c_nvmlFieldValue_t)
    for i in range(n * size, (n + spare) * size):
        raw[i] = 0xA5
    for i, (fid, scope) in enumerate(ids):
        arr[i].fieldId = fid
        arr[i].scopeId = scope
    fn = nv._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    ret = fn(handle, ctypes.c_int32(n), ctypes.byref(arr))
    touched = sum(1 for i in range(n * size, (n + spare) * size) if raw[i] != 0xA5)
    return ret, touched


def main() -> int:
    nv.nvmlInit()
    for g in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(g)
        links = 0
        try:
            v = nv.nvmlDeviceGetFieldValues(h, [91])
            links = v[0].value.uiVal if v[0].nvmlReturn == 0 else 0
        except nv.NVMLError:
            pass
        print(f"GPU {g}: links={links} sizeof(field value)={ctypes.sizeof(nv.c_nvmlFieldValue_t)}")
        cases = {
            "gpu fields": [(f, 0) for f in GPU_FIELDS],
            "one link field x1": [(161, 0)],
            "link 161 all links": [(161, k) for k in range(links)],
            "link 165 all links": [(165, k) for k in range(links)],
            "all links 4 fields": [(f, k) for k in range(links) for f in LINK_FIELDS],
            "everything": [(f, 0) for f in GPU_FIELDS]
            + [(f, k) for k in range(links) for f in LINK_FIELDS],
        }
        for fid in LINK_FIELDS:
            cases[f"field {fid} link 0"] = [(fid, 0)]
        for name, ids in cases.items():
            ret, touched = probe(h, ids)
            print(f"  {name:24s} n={len(ids):3d} ret={ret} bytes past the end written={touched}")
    return 0


if __name__ == "__main__" and len(sys.argv) == 1:
    sys.exit(main())


def stress(mode: str, seconds: float = 8.0) -> None:
    """Two or more threads polling their own GPU concurrently (run as a separate process:
    a crash aborts it). mode: all | gpu-only | links-locked | links-only."""
    import threading
    import time

    nv.nvmlInit()
    lock = threading.Lock()
    handles = [nv.nvmlDeviceGetHandleByIndex(g) for g in range(nv.nvmlDeviceGetCount())]
    stop = time.monotonic() + seconds
    counts = [0] * len(handles)

    def work(g: int) -> None:
        h = handles[g]
        gpu_ids = [(f, 0) for f in GPU_FIELDS]
        link_ids = [(f, k) for k in range(18) for f in LINK_FIELDS]
        while time.monotonic() < stop:
            if mode == "all":
                nv.nvmlDeviceGetFieldValues(h, gpu_ids + link_ids)
            elif mode == "gpu-only":
                nv.nvmlDeviceGetFieldValues(h, gpu_ids)
            elif mode == "links-only":
                nv.nvmlDeviceGetFieldValues(h, link_ids)
            else:
                nv.nvmlDeviceGetFieldValues(h, gpu_ids)
                with lock:
                    nv.nvmlDeviceGetFieldValues(h, link_ids)
            counts[g] += 1

    threads = [threading.Thread(target=work, args=(g,)) for g in range(len(handles))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"stress {mode}: survived, calls per GPU {counts}", flush=True)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "stress":
    stress(sys.argv[2])


def stress_backend(mode: str, seconds: float = 15.0, slow: float = 0.0) -> None:
    """Threads calling NvmlBackend.sample() per GPU, as the daemon does.
    mode: free | lock-batch (field values serialised) | lock-rest (all but field values
    serialised) | lock-all."""
    import os
    import threading
    import time

    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.sources.gpu import nvml as backend_mod

    if os.environ.get("PROBE_RAW") == "0":
        original = backend_mod.read_field_values
        backend_mod.read_field_values = lambda v, raw=True: original(v, raw=False)  # type: ignore[assignment]
    backend = backend_mod.NvmlBackend(clock=SystemClock(), slow_interval_s=slow)
    infos = backend.open()[: int(os.environ.get("PROBE_GPUS", "99"))]
    lock = threading.RLock()
    if mode in ("lock-batch", "lock-all"):
        inner = backend._read_batch

        def locked_batch(*a: object, **k: object) -> object:
            with lock:
                return inner(*a, **k)

        backend._read_batch = locked_batch  # type: ignore[method-assign]
    if mode in ("lock-rest", "lock-all"):
        inner_poll = backend._poll
        inner_batch = backend._read_batch

        def unlocked_batch(*a: object, **k: object) -> object:
            lock.release()
            try:
                return inner_batch(*a, **k)
            finally:
                lock.acquire()

        if mode == "lock-rest":
            backend._read_batch = unlocked_batch  # type: ignore[method-assign]

        def locked_poll(*a: object, **k: object) -> object:
            with lock:
                return inner_poll(*a, **k)

        backend._poll = locked_poll  # type: ignore[method-assign]
    stop = time.monotonic() + seconds
    counts = [0] * len(infos)

    def work(g: int) -> None:
        while time.monotonic() < stop:
            backend.sample(g)
            counts[g] += 1

    if os.environ.get("PROBE_MAIN") == "1":
        work(infos[0].index)
    else:
        if os.environ.get("PROBE_STACK_MB"):
            threading.stack_size(int(os.environ["PROBE_STACK_MB"]) * 1024 * 1024)
        threads = [threading.Thread(target=work, args=(i.index,)) for i in infos]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    print(f"backend {mode}: survived, samples per GPU {counts}", flush=True)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "backend":
    stress_backend(
        sys.argv[2],
        seconds=float(__import__("os").environ.get("PROBE_SECONDS", "15")),
        slow=float(sys.argv[3]) if len(sys.argv) > 3 else 0.0,
    )


def probe_backend_batches() -> None:
    """The canary check on the exact batches the backend sends (fast and full)."""
    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.sources.gpu import nvml as backend_mod

    backend = backend_mod.NvmlBackend(clock=SystemClock())
    infos = backend.open()
    for info in infos:
        backend.sample(info.index)
        handle = nv.nvmlDeviceGetHandleByIndex(info.index)
        for full in (True, False):
            ids = backend.field_batch(info.index, full=full)
            for _ in range(200):
                ret, touched = probe(handle, ids)
                if touched:
                    break
            print(
                f"GPU {info.index} {'full' if full else 'fast'} batch n={len(ids)} ret={ret} "
                f"bytes past the end written={touched}",
                flush=True,
            )


if __name__ == "__main__" and len(sys.argv) == 2 and sys.argv[1] == "batches":
    probe_backend_batches()


def loop(mode: str, seconds: float = 12.0) -> None:
    """One thread, GPU 0, the backend's batch shapes through pynvml, back to back."""
    import time

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    fast_gpu = [(f, 0) for f in (82, 3, 4, 5, 6, 142, 143, 144, 145, 230)]
    full_gpu = [(82, 0), (83, 0), *fast_gpu[1:], (94, 0)]
    links = [(f, k) for k in range(18) for f in (165, 161, 162, 163)]
    batches = {
        "fast1": [fast_gpu + links],
        "fast2": [fast_gpu, links],
        "links": [links],
        "fastgpu": [fast_gpu],
        "full1": [full_gpu + links],
    }[mode]
    stop = time.monotonic() + seconds
    n = 0
    while time.monotonic() < stop:
        for ids in batches:
            nv.nvmlDeviceGetFieldValues(h, ids)
        n += 1
    print(f"loop {mode}: survived {n} rounds", flush=True)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "loop":
    loop(sys.argv[2], seconds=float(__import__("os").environ.get("PROBE_SECONDS", "12")))


class _Without:
    """pynvml with some functions answering NOT_SUPPORTED (so the backend drops them)."""

    def __init__(self, names: set[str]) -> None:
        self._names = names

    def __getattr__(self, name: str) -> object:
        if name in self._names:

            def unsupported(*args: object, **kwargs: object) -> object:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_SUPPORTED)

            return unsupported
        return getattr(nv, name)


def without(names: str, seconds: float = 12.0) -> None:
    import time

    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.sources.gpu import nvml as backend_mod

    backend = backend_mod.NvmlBackend(
        clock=SystemClock(), nvml=_Without(set(names.split(","))), slow_interval_s=10.0
    )
    backend.open()
    stop = time.monotonic() + seconds
    n = 0
    while time.monotonic() < stop:
        backend.sample(0)
        n += 1
    print(f"without {names}: survived {n} samples", flush=True)


if __name__ == "__main__" and len(sys.argv) > 2 and sys.argv[1] == "without":
    without(sys.argv[2], seconds=float(__import__("os").environ.get("PROBE_SECONDS", "12")))
