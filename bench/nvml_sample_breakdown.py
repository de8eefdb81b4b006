"""Where one NVML poll's CPU goes: inside libnvidia-ml, in our backend's Python, on the wire.

On a lent GPU machine (the device tool), best with an NCCL all-reduce running
(``--nccl``). Wraps every ``pynvml`` function with a CPU-time counter, then runs
``NvmlBackend.sample`` for every GPU once a second on one thread (as the worker's per-GPU
threads would, one after the other), and encodes each sample for the worker's wire. Prints
per poll: CPU in total, inside pynvml calls (the library plus pynvml's own wrapper), in
our code, and the wire encoding; the calls made and every error a call raised, by
function. A poll that raises the same error every second is work to remember.

    PYTHONPATH=. python3 bench/nvml_sample_breakdown.py --seconds 40 --nccl --out "$OUT"
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import start_nccl

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.sources.gpu import workerwire as wire
from gpuwatchd.sources.gpu.nvml import NvmlBackend


class Counted:
    """``pynvml`` with every ``nvml*`` function timed (thread CPU) and counted."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.cpu = 0.0
        self.calls: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.counting = False

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (callable(value) and name.startswith("nvml")) or isinstance(value, type):
            return value

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.counting:
                return value(*args, **kwargs)
            self.calls[name] += 1
            t0 = time.thread_time()
            try:
                return value(*args, **kwargs)
            except Exception as exc:
                self.errors[f"{name}: {type(exc).__name__}"] += 1
                raise
            finally:
                self.cpu += time.thread_time() - t0

        return timed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--nccl", action="store_true")
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import pynvml

    counted = Counted(pynvml)
    backend = NvmlBackend(SystemClock(), nvml=counted)
    infos = backend.open()
    nccl = None
    if args.nccl:
        gpus = ",".join(str(i.index) for i in infos)
        nccl = start_nccl(gpus, args.seconds + 60)
        time.sleep(15)
    for info in infos:  # the first poll reads everything once: not what a poll costs
        backend.sample(info.index)
    time.sleep(1.0)
    counted.counting = True
    polls, total, encode, changes = 0, 0.0, 0.0, 0.0
    encoder = wire.SampleEncoder()  # what the worker sends: each GPU's changes
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        for info in infos:
            t0 = time.thread_time()
            sample = backend.sample(info.index)
            t1 = time.thread_time()
            json.dumps({"id": 1, "sample": wire.sample_to_wire(sample)}, separators=(",", ":"))
            t2 = time.thread_time()
            json.dumps({"id": 1, "sample": encoder.encode(sample)}, separators=(",", ":"))
            t3 = time.thread_time()
            total += t1 - t0
            encode += t2 - t1
            changes += t3 - t2
            polls += 1
        time.sleep(max(0.0, tick + 1.0 - time.monotonic()))
    counted.counting = False
    if nccl is not None:
        nccl.kill()
    lines = [
        f"{len(infos)} GPUs, {polls} polls over {args.seconds:g} s (one thread), "
        f"NCCL {'on' if args.nccl else 'off'}, default cadences",
        f"per poll: {total / polls * 1e6:.0f} us CPU in sample(), of which "
        f"{counted.cpu / polls * 1e6:.0f} us inside pynvml calls and "
        f"{(total - counted.cpu) / polls * 1e6:.0f} us in our code; "
        f"wire encoding {encode / polls * 1e6:.0f} us whole, "
        f"{changes / polls * 1e6:.0f} us as the worker sends it (the changes)",
        "calls per poll: "
        + ", ".join(f"{k} {v / polls:.2f}" for k, v in sorted(counted.calls.items())),
        "errors per poll: "
        + (", ".join(f"{k} {v / polls:.2f}" for k, v in counted.errors.most_common()) or "none"),
        f"threads alive: {threading.active_count()}",
    ]
    (out / "breakdown.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
