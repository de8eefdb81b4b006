"""Where one NVML poll's CPU goes: inside libnvidia-ml, in our backend's Python, on the wire.

On a lent GPU machine (the device tool), best with an NCCL all-reduce running
(``--nccl``). Wraps every ``pynvml`` function with a CPU-time counter, then runs
``NvmlBackend.sample`` for every GPU once a second on one thread (as the worker's per-GPU
threads would, one after the other), and encodes each sample for the worker's wire. Prints
per poll: CPU in total, inside pynvml calls (the library plus pynvml's own wrapper), in
our code, and the wire encoding; the calls made and every error a call raised, by
function. A poll that raises the same error every second is work to remember.

    PYTHONPATH=. python3 bench/nvml_sample_breakdown.py --seconds 40 --nccl --out "$OUT"

``--fake N`` runs the same on this VM over the shipped fake pynvml (two fake H100s with
18 NVLinks each), N poll rounds back to back with a clock that steps 1 s a round (so
the slow cadences come as they would): the fake answers in microseconds, so what is left
is our Python per poll, the wire encoding, and the daemon's decoding, as CPU time::

    PYTHONPATH=. python3 bench/nvml_sample_breakdown.py --fake 20000
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


class _SteppedClock:
    """Wall and monotonic time that move only when told (1 s a poll round)."""

    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.t += seconds
        return event.is_set()


def fake_run(rounds: int) -> list[str]:
    """Our Python, encode and decode per GPU poll on the fake NVML (CPU time)."""
    from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

    fake = FakeNvml([h100(0, nvlink=True), h100(1, nvlink=True)])
    counted = Counted(fake)
    clock = _SteppedClock()
    backend = NvmlBackend(clock, nvml=counted)
    infos = backend.open()
    for info in infos:  # the first poll reads everything once: not what a poll costs
        backend.sample(info.index)
    encoder = wire.SampleEncoder()
    decoder = wire.SampleDecoder()
    for info in infos:  # each GPU's first, whole sample
        first = wire.dumps_message({"id": 0, "sample": encoder.encode(backend.sample(info.index))})
        decoder.decode(json.loads(first)["sample"])
    counted.counting = True
    polls, total, encode, decode, size = 0, 0.0, 0.0, 0.0, 0
    for _ in range(rounds):
        clock.t += 1.0
        for info in infos:
            t0 = time.thread_time()
            sample = backend.sample(info.index)
            t1 = time.thread_time()
            data = wire.dumps_message({"id": 1, "sample": encoder.encode(sample)})
            t2 = time.thread_time()
            decoded = decoder.decode(json.loads(data)["sample"])
            t3 = time.thread_time()
            total += t1 - t0
            encode += t2 - t1
            decode += t3 - t2
            size += len(data)
            polls += 1
    counted.counting = False
    assert decoded == sample, "the decoded sample differs from the one read"
    backend.close()
    return [
        f"fake NVML: {len(infos)} GPUs, {polls} polls (one thread, 1 s a round, default cadences)",
        f"per GPU poll: sample() {total / polls * 1e6:.1f} us CPU, of which "
        f"{counted.cpu / polls * 1e6:.1f} us inside the fake pynvml and "
        f"{(total - counted.cpu) / polls * 1e6:.1f} us our Python; "
        f"encode {encode / polls * 1e6:.1f} us; decode {decode / polls * 1e6:.1f} us; "
        f"{size / polls:.0f} bytes a frame",
        "calls per poll: "
        + ", ".join(f"{k} {v / polls:.2f}" for k, v in sorted(counted.calls.items())),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--nccl", action="store_true")
    ap.add_argument("--out", default=".")
    ap.add_argument("--fake", type=int, metavar="ROUNDS", help="on the fake NVML (this VM)")
    args = ap.parse_args()
    if args.fake:
        print("\n".join(fake_run(args.fake)))
        return 0
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
