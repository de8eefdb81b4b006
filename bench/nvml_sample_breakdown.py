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
import contextlib
import gc
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
from gpuwatchd.core.records import GpuSample
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

        setattr(self, name, timed)  # built once: a closure per call would count as ours
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


class Recorded:
    """``pynvml`` with every ``nvml*`` call recorded (function, arguments), to replay."""

    def __init__(self, module: Any) -> None:
        self._module = module
        self.log: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._module, name)
        if not (callable(value) and name.startswith("nvml")) or isinstance(value, type):
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.log.append((value, args, kwargs))
            self.calls[name] += 1
            return value(*args, **kwargs)

        setattr(self, name, recorded)  # built once, not per poll
        return recorded


def fake_run(rounds: int) -> list[str]:
    """Our Python, encode and decode per GPU poll on the fake NVML (CPU time).

    A wrapper that times each call costs more than the fake's answer, so here the polls
    run twice: once recording every call, once timed with the bare fake; the recorded
    calls are then replayed on their own, and our Python is the difference."""
    from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

    def poll_all(nvml: Any) -> tuple[float, list[GpuSample]]:
        clock = _SteppedClock()
        backend = NvmlBackend(clock, nvml=nvml)
        infos = backend.open()
        for info in infos:  # the first poll reads everything once: not what a poll costs
            backend.sample(info.index)
        if isinstance(nvml, Recorded):
            nvml.log.clear()  # only the polls measured below
        samples = []
        started = time.thread_time()
        for _ in range(rounds):
            clock.t += 1.0
            for info in infos:
                samples.append(backend.sample(info.index))
        spent = time.thread_time() - started
        backend.close()
        return spent, samples

    def gpus() -> FakeNvml:
        return FakeNvml([h100(0, nvlink=True), h100(1, nvlink=True)])

    gc.disable()  # the samples kept for the wire below would make the collector's work ours
    recorder = Recorded(gpus())
    poll_all(recorder)
    total, samples = poll_all(gpus())
    # replay the recorded polls' calls (the open and first polls' ones dropped)
    started = time.thread_time()
    for fn, args, kwargs in recorder.log:
        with contextlib.suppress(Exception):
            fn(*args, **kwargs)
    inside = time.thread_time() - started
    polls = len(samples)
    encoder = wire.SampleEncoder()
    started = time.thread_time()
    frames = [wire.dumps_message({"id": 1, "sample": encoder.encode(s)}) for s in samples]
    encode = time.thread_time() - started
    decoder = wire.SampleDecoder()
    started = time.thread_time()
    decoded = [decoder.decode(json.loads(f)["sample"]) for f in frames]
    decode = time.thread_time() - started
    gc.enable()
    assert decoded == samples, "a decoded sample differs from the one read"
    return [
        f"fake NVML: 2 GPUs, {polls} polls (one thread, 1 s a round, default cadences)",
        f"per GPU poll: sample() {total / polls * 1e6:.1f} us CPU, of which about "
        f"{inside / polls * 1e6:.1f} us the fake's answers (replayed) and "
        f"{(total - inside) / polls * 1e6:.1f} us our Python; "
        f"encode {encode / polls * 1e6:.1f} us; decode {decode / polls * 1e6:.1f} us; "
        f"{sum(len(f) for f in frames) / polls:.0f} bytes a frame",
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
    polls, total, encode, changes, decode = 0, 0.0, 0.0, 0.0, 0.0
    encoder = wire.SampleEncoder()  # what the worker sends: each GPU's changes
    decoder = wire.SampleDecoder()  # and what the daemon makes of them
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        tick = time.monotonic()
        for info in infos:
            t0 = time.thread_time()
            sample = backend.sample(info.index)
            t1 = time.thread_time()
            json.dumps({"id": 1, "sample": wire.sample_to_wire(sample)}, separators=(",", ":"))
            t2 = time.thread_time()
            frame = wire.dumps_message({"id": 1, "sample": encoder.encode(sample)})
            t3 = time.thread_time()
            decoder.decode(json.loads(frame)["sample"])
            t4 = time.thread_time()
            total += t1 - t0
            encode += t2 - t1
            changes += t3 - t2
            decode += t4 - t3
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
        f"{changes / polls * 1e6:.0f} us as the worker sends it (the changes), "
        f"decoded in the daemon {decode / polls * 1e6:.0f} us",
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
