#!/usr/bin/env python3
"""What the config's ``fields`` section costs per poll: NvmlBackend.sample() with 0, 16 and
64 extra field ids, measured side by side in one run (rounds interleaved, so drift hits all
alike), plus the number of nvmlDeviceGetFieldValues calls per poll (should stay 1).

    python3 bench/extra_fields_cost.py            # real GPU 0 (needs the NVIDIA driver)
    python3 bench/extra_fields_cost.py --fake     # no GPU: fake pynvml; measures only
                                                  # gpuwatchd's own Python work per id

On a real GPU the driver's cost per id comes on top (about 10 us for most ids, several
milliseconds for energy and violation counters: mark such ids ``slow: true``).
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any

from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.sources.gpu.nvml import NvmlBackend

# Ids to add, cheap ones a Hopper answers first (ECC totals, HBM temperature, PCIe replays,
# remap counters, thresholds), then a run of others; the report shows how many of them the
# driver kept in the batch (NOT_SUPPORTED ones are dropped after the first poll).
IDS = [3, 4, 5, 6, 11, 12, 82, 94, 142, 143, 144, 145, 193, 194, 195, 196, *range(20, 68)]


def extras(n: int) -> tuple[ExtraField, ...]:
    return tuple(ExtraField(IDS[i], f"extra_{i}", "gauge") for i in range(n))


class CountingNvml:
    """Passes every attribute through to the module and counts field-values calls."""

    def __init__(self, module: Any) -> None:
        self._m = module
        self.field_value_calls = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._m, name)
        if name != "nvmlDeviceGetFieldValues":
            return value

        def counted(*args: Any) -> Any:
            self.field_value_calls += 1
            return value(*args)

        return counted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fake", action="store_true", help="fake pynvml (no GPU)")
    ap.add_argument("--polls", type=int, default=2000, help="polls per variant per round")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.fake:
        from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

        module: Any = FakeNvml([h100(0)])
        gpu = module.gpus[0]
        for fid in IDS:  # the fake answers every id it has a value for
            gpu.field_values.setdefault((fid, 0), (3, 0))
            gpu.not_supported_fields.discard(fid)
    else:
        import pynvml

        module = pynvml
    variants = {}
    for n in (0, 16, 64):
        counting = CountingNvml(module)
        backend = NvmlBackend(SystemClock(), nvml=counting, extra_fields=extras(n))
        backend.open()
        backend.sample(0)  # first poll learns what is not supported
        variants[n] = (backend, counting)
    cpu = dict.fromkeys(variants, 0.0)
    calls = dict.fromkeys(variants, 0)
    for _ in range(args.rounds):
        for n, (backend, counting) in variants.items():
            before = counting.field_value_calls
            t0 = time.process_time()
            for _ in range(args.polls):
                backend.sample(0)
            cpu[n] += time.process_time() - t0
            calls[n] += counting.field_value_calls - before
    polls = args.polls * args.rounds
    print(f"machine: {platform.node()} {platform.machine()} {platform.python_version()}")
    print(f"backend: {'fake pynvml' if args.fake else 'real NVML, GPU 0'}; {polls} polls each")
    base = cpu[0] / polls
    for n in variants:
        per = cpu[n] / polls
        print(
            f"{n:3d} extra ids: {per * 1e6:8.1f} us CPU per poll ({per / base:4.2f}x), "
            f"{calls[n] / polls:.2f} field-values calls per poll, "
            f"{len(variants[n][0].field_batch(0, full=False))} ids in the fast batch"
        )
    for backend, _ in variants.values():
        backend.close()


if __name__ == "__main__":
    main()
