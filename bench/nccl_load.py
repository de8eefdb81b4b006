"""A busy NVLink node: an NCCL all-reduce loop on some GPUs, for the given time.

The NVML heap-corruption hunt and the soak need GPUs with compute processes on them and
NVLink traffic, as on a training node. Each rank is its own process on its own GPU.

    python3 bench/nccl_load.py --gpus 1,2,3 --seconds 600 [--mib 256]

Keep NCCL_NVLS_ENABLE=0 (the lent machines have no NVLink multicast); it is set here.
Prints one line per rank at the end: rounds and GB/s of bus bandwidth.
"""

from __future__ import annotations

import argparse
import os
import time


def _rank(rank: int, gpus: list[int], seconds: float, mib: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(gpus[rank])
    dist.init_process_group("nccl", rank=rank, world_size=len(gpus))
    x = torch.ones(mib * 1024 * 1024 // 4, device="cuda")
    rounds = 0
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        dist.all_reduce(x)
        rounds += 1
        if rounds % 50 == 0:
            torch.cuda.synchronize()
            x.fill_(1.0)
    torch.cuda.synchronize()
    took = time.monotonic() - start
    n = len(gpus)
    busbw = rounds * mib * 2 * (n - 1) / n / 1024 / took
    print(
        f"nccl rank {rank} gpu {gpus[rank]}: {rounds} all-reduces, bus {busbw:.1f} GB/s", flush=True
    )
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gpus", default="1,2,3")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    for key in ("NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS"):
        os.environ[key] = "0" if key == "NCCL_NVLS_ENABLE" else "1"
    os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
    import torch.multiprocessing as mp

    gpus = [int(g) for g in args.gpus.split(",")]
    mp.spawn(_rank, args=(gpus, args.seconds, args.mib, args.port), nprocs=len(gpus), join=True)


if __name__ == "__main__":
    main()
