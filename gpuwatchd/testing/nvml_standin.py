"""A ``pynvml`` stand-in for the NVML worker process (``GPUWATCHD_NVML_MODULE``), over the
shipped fake, that misbehaves as libnvidia-ml has been seen to: for the containment tests
and drills (``tests/sources/test_nvml_worker.py``).

``GPUWATCHD_STANDIN`` picks the behaviour; the GPUs are two fake H100s with 18 NVLinks
(PCI buses 18 and 29)::

    ok            behave
    abort:S       abort the process S seconds after nvmlInit (as a heap corruption does)
    hang:S        S seconds after nvmlInit, every nvmlDeviceGetFieldValues never returns
    hang-gil:S    S seconds after nvmlInit, the next field-values call holds the GIL forever
                  (a wedged worker: not even its heartbeat runs)
    hang-gpu1:S   S seconds after nvmlInit, GPU 1's power reads never return (GPU 0 keeps
                  answering: one stuck GPU in a poll round)
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

ENV = "GPUWATCHD_STANDIN"

_fake = FakeNvml([h100(0, nvlink=True), h100(1, nvlink=True)])
_kind, _, _after = os.environ.get(ENV, "ok").partition(":")
_started: float | None = None
_real_field_values = _fake.nvmlDeviceGetFieldValues


def _late() -> bool:
    return _started is not None and time.monotonic() - _started >= float(_after or 0)


def nvmlInit() -> None:
    global _started
    _fake.nvmlInit()
    _started = time.monotonic()
    if _kind == "abort":
        timer = threading.Timer(float(_after or 0), os.abort)
        timer.daemon = True
        timer.start()


def nvmlDeviceGetFieldValues(handle: Any, ids: list[Any]) -> Any:
    if _kind == "hang" and _late():
        threading.Event().wait()
    if _kind == "hang-gil" and _late():
        # a C call that holds the GIL (PyDLL does not release it): the whole worker wedges
        ctypes.PyDLL(None).sleep(1_000_000)
    return _real_field_values(handle, ids)


def nvmlDeviceGetPowerUsage(handle: Any) -> int:
    if _kind == "hang-gpu1" and _late() and _fake._gpu("nvmlDeviceGetPowerUsage", handle)[0] == 1:
        threading.Event().wait()
    return _fake.nvmlDeviceGetPowerUsage(handle)


def __getattr__(name: str) -> Any:
    return getattr(_fake, name)
