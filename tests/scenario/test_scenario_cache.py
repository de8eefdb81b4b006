"""Scenario.values_at keeps per-GPU caches (values that hold still until the next timeline
change, link samples while no link counter moves). They must never change an answer: each
shipped scenario is compared, at random times in random order, with the values computed
straight from its compiled series."""

from __future__ import annotations

import glob
import os
import random
from typing import Any

import pytest

from gpuwatchd.core.fields import add_derived_fields
from gpuwatchd.scenario.model import Scenario, bundled_scenario_path, load_scenario
from gpuwatchd.scenario.series import clamp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FILES = [
    *sorted(glob.glob(os.path.join(ROOT, "scenarios", "*.yaml"))),
    bundled_scenario_path("demo"),
    os.path.join(ROOT, "tests", "data", "steady-4gpu.yaml"),
]


def reference(s: Scenario, gpu: int, t: float) -> tuple[dict[str, float], list[Any]]:
    """The values at ``t`` from the series, without any cache (the definition)."""
    t = min(max(t, 0.0), s.duration)
    fields: dict[str, float] = {}
    for name, series in s._series[gpu].items():
        value = series.value(t)
        if value is None:
            continue
        amplitude = s.jitter.get(name)
        if amplitude:
            value += amplitude * s._noise(gpu, name, t)
            value = round(value) if name.startswith("temperature_") else round(value, 3)
        fields[name] = clamp(name, value)
    # Derived as the NVML backend derives them; the GPU margin from the slowdown limit.
    spec = s.gpus[gpu]
    add_derived_fields(fields, spec.memory_max_temperature)
    if spec.slowdown_temperature is not None and "temperature_gpu" in fields:
        fields["temperature_gpu_margin"] = spec.slowdown_temperature - fields["temperature_gpu"]
    links = [
        (link, {n: v for n, ser in series.items() if (v := ser.value(t)) is not None})
        for link, series in enumerate(s._links[gpu])
    ]
    return fields, links


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_cached_values_equal_the_series(path: str) -> None:
    s = load_scenario(path)
    rng = random.Random(path)
    edges = [0.0, s.duration, *(n.t for n in s.notes)]
    times = [rng.uniform(-10, s.duration + 10) for _ in range(150)]
    times += [e + d for e in edges for d in (-1e-6, 0.0, 1e-6, 1.0)]
    rng.shuffle(times)
    for gpu in range(len(s.gpus)):
        for t in times:
            fields, links, processes = s.values_at(gpu, t)
            want_fields, want_links = reference(s, gpu, t)
            assert fields == want_fields and list(fields) == list(want_fields), (gpu, t)
            assert [(ls.link, dict(ls.fields)) for ls in links] == want_links, (gpu, t)
            assert len(processes) == int(fields.get("compute_processes", 0))


def test_link_samples_are_shared_while_nothing_moves() -> None:
    s = load_scenario(os.path.join(ROOT, "scenarios", "nvlink-crc-storm.yaml"))
    assert s.values_at(0, 100.0)[1] is s.values_at(0, 200.0)[1]  # quiet: the same tuple
    assert s.values_at(1, 3500.0)[1] is not s.values_at(1, 3510.0)[1]  # link 7 storming
