"""Provoke real XID 31s on a lent GPU and save the kernel log lines they produce.

This is how the ``captured on a lent GPU`` rows of ``xid_lines.tsv`` were obtained. It is
not a test and is not collected by pytest. Run it through the device tool as root::

    python3 tests/data/xid_capture_on_gpu.py "$OUT"

Each fault is a separate child process that loads a one-instruction PTX kernel storing to
virtual address 0x10: an application fault (XID 31, MMU fault). The GPU stays healthy; no
setting is changed and nothing is reset. The child renames itself first (prctl
PR_SET_NAME) so the kernel line carries process names with colons and brackets, as real
workers (``ray::...``, ``VLLM::Worker``) do. Only ctypes and the driver's libcuda are used.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time

PTX = b"""
.version 7.0
.target sm_70
.address_size 64
.visible .entry bad()
{
    .reg .u64 %rd<2>;
    .reg .u32 %r<2>;
    mov.u64 %rd1, 16;
    mov.u32 %r1, 42;
    st.global.u32 [%rd1], %r1;
    ret;
}
"""

PR_SET_NAME = 15


def fault(name: str) -> int:
    libc = ctypes.CDLL(None)
    libc.prctl(PR_SET_NAME, name.encode(), 0, 0, 0)
    cuda = ctypes.CDLL("libcuda.so.1")
    dev = ctypes.c_int()
    ctx = ctypes.c_void_p()
    mod = ctypes.c_void_p()
    fn = ctypes.c_void_p()
    assert cuda.cuInit(0) == 0
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
    assert cuda.cuModuleLoadData(ctypes.byref(mod), PTX) == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"bad") == 0
    rc = cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, None, None)
    rc2 = cuda.cuCtxSynchronize()
    print(f"{name}: launch={rc} sync={rc2} (700 = illegal address)", flush=True)
    return 0


def read_kmsg() -> list[str]:
    fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    records = []
    try:
        while True:
            try:
                records.append(os.read(fd, 8192).decode("utf-8", "replace"))
            except BlockingIOError:
                break
            except BrokenPipeError:
                continue
    finally:
        os.close(fd)
    return records


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return fault(sys.argv[2])
    out = sys.argv[1]
    for name in ("xidprobe", "ray::Wkr[0]", "py:gpu[main]"):
        subprocess.run([sys.executable, __file__, "--child", name], check=False, timeout=60)
        time.sleep(1.0)
    time.sleep(2.0)
    records = read_kmsg()
    with open(os.path.join(out, "kmsg_all.txt"), "w") as f:
        f.writelines(r if r.endswith("\n") else r + "\n" for r in records)
    with open(os.path.join(out, "kmsg_nvrm.txt"), "w") as f:
        f.writelines(r if r.endswith("\n") else r + "\n" for r in records if "NVRM" in r)
    if shutil.which("dmesg"):
        variants = {
            "dmesg.txt": [],
            "dmesg_T.txt": ["-T"],
            "dmesg_x.txt": ["-x"],
            "dmesg_x_iso.txt": ["-x", "--time-format", "iso"],
            "dmesg_r.txt": ["-r"],
        }
        for fname, extra in variants.items():
            res = subprocess.run(["dmesg", *extra], capture_output=True, text=True, check=False)
            with open(os.path.join(out, fname), "w") as f:
                f.write(res.stdout + res.stderr)
    for cmd in (
        ["nvidia-smi", "--query-gpu=name,driver_version,pci.bus_id,uuid", "--format=csv"],
        ["uname", "-r"],
    ):
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        with open(os.path.join(out, "info.txt"), "a") as f:
            f.write(" ".join(cmd) + "\n" + res.stdout + res.stderr + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
