#!/usr/bin/env python3
"""CPU of one rule evaluation on a busy, healthy node, per poll round.

The daemon's evaluator takes the samples a poll round brought (``observe``), takes a node
view and evaluates every shipped rule (``evaluate``). On a busy GPU the gauges move at
every poll (temperature, power, clocks, utilization, memory used, energy) while the
counters, row remapping, PCIe and fabric readings stay put; that is what this bench feeds
(the fake backend's busy H100 with jitter on the gauges), with NVLink links unchanged.

It prints the CPU per poll round (observe + view + evaluate) for 4 and 8 GPUs, and, with
``--compare REV`` run from two checkouts, lets you set two commits side by side; the
numbers are process CPU time over many rounds on a virtual clock one poll interval apart.

    .venv/bin/python bench/rule_eval_cost.py [--rounds 3000] [--gpus 4 8]
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.configfile.stages import for_rules
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import GpuSample, LinkSample
from gpuwatchd.rules.stage import rules_stage
from gpuwatchd.testing.fake_backend import DEFAULT_FIELDS, DEFAULT_LINK_FIELDS, make_infos

T0 = 1_767_225_600.0
DURABLE = "--durable" in sys.argv


def busy_fields(rng: random.Random, base: dict[str, float], energy: float) -> dict[str, float]:
    """One poll of a GPU in an all-reduce: the gauges move, the counters do not."""
    f = dict(base)
    f["temperature_gpu"] = float(rng.randint(55, 62))
    f["temperature_memory"] = float(rng.randint(50, 58))
    f["power"] = round(rng.uniform(380.0, 520.0), 3)
    f["energy"] = energy
    f["sm_clock"] = float(rng.choice((1.755e9, 1.785e9, 1.98e9)))
    f["utilization_gpu"] = round(rng.uniform(0.9, 1.0), 2)
    f["utilization_memory"] = round(rng.uniform(0.3, 0.6), 2)
    f["memory_used"] = float(rng.randint(60, 70)) * 1e9
    return f


def measure(gpus: int, rounds: int, interval: float, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(f"state_dir: {tmp}\n")
        config = load_config(str(path), must_exist=True)
        clock = VirtualClock(T0)
        stage = rules_stage(for_rules(config), clock, durable=DURABLE)
        infos = make_infos(gpus)
        state = NodeState("bench", T0, expected_gpus=gpus)
        state.set_gpus(infos, T0)
        links = tuple(LinkSample(n, MappingProxyType(dict(DEFAULT_LINK_FIELDS))) for n in range(18))
        base = dict(DEFAULT_FIELDS)
        energy = [1.0e6] * gpus
        cpu = 0.0
        warm = min(200, rounds // 5)
        for r in range(rounds + warm):
            now = T0 + r * interval
            clock.set(now)
            samples = []
            for i, info in enumerate(infos):
                energy[i] += 450.0 * interval
                samples.append(
                    GpuSample(
                        gpu=i,
                        uuid=info.uuid,
                        timestamp=now,
                        fields=MappingProxyType(busy_fields(rng, base, energy[i])),
                        links=links,
                    )
                )
            t = time.process_time()
            for s in samples:
                state.record_sample(s)
                stage.observe(s)
            stage.evaluate(now, state.view())
            if r >= warm:
                cpu += time.process_time() - t
        stage.close()
    return {"gpus": gpus, "rounds": rounds, "us_per_round": cpu / rounds * 1e6}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--gpus", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--durable", action="store_true", help="state in SQLite, as the daemon")
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    for n in args.gpus:
        out = measure(n, args.rounds, args.interval, args.seed)
        print(
            f"{n} GPUs: {out['us_per_round']:.1f} us of CPU per poll round "
            f"({out['us_per_round'] / n:.1f} us per GPU), {args.rounds} rounds"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
