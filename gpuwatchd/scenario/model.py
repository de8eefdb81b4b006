"""Scenarios: a scripted GPU node for tests, ``simulate``, ``demo``, drills and backtesting.

A scenario file names a node (its GPUs, their model and NVLink links), the idle values of
every field, and a timeline of things that happen to it: a job starts, a counter starts to
leak, clocks are held down, a GPU falls off the bus, a call hangs, a kernel-log line or an
NVML XID event appears. docs/scenarios.md describes the format.

Loading validates the whole file and reports every mistake as ``PATH:LINE:COL: message``
(a ``ConfigError``). The timeline is then compiled into closed-form series: each field of
each GPU (and each NVLink link) is a list of segments ``value = base + rate * (t - start)``,
so the value at any scenario time is a pure function of that time. Sampling every second
or every hour gives the same counter values at the same instants, and two runs give the
same output.

The package holds one module per concern; this one is its entry point (``parse_scenario``,
``load_scenario``) and names what the rest of gpuwatchd uses:

- ``scenario.parser``: the file, validated (``ScenarioParser``);
- ``scenario.spec``: the parsed GPUs and timeline events;
- ``scenario.compile``: events into series, derived fields, default identities;
- ``scenario.series``: the compiled ``Scenario`` and its queries;
- ``scenario.gpumodels``: the GPU models and the H100/H200 baseline table;
- ``scenario.bundled``: the shipped scenarios by name.
"""

from __future__ import annotations

from gpuwatchd.config.yamlsrc import load_file, parse
from gpuwatchd.core.fields import (
    ExtraField,
)
from gpuwatchd.core.units import format_duration
from gpuwatchd.scenario.bundled import bundled_scenario_path, bundled_scenarios
from gpuwatchd.scenario.gpumodels import KNOWN_MODELS, GpuModel
from gpuwatchd.scenario.parser import ScenarioParser
from gpuwatchd.scenario.series import (
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_TIMEOUT,
    GpuSpec,
    GpuState,
    Note,
    Scenario,
)
from gpuwatchd.scenario.spec import TRANSPORTS

__all__ = [
    "KNOWN_MODELS",
    "NVML_ERROR_GPU_IS_LOST",
    "NVML_ERROR_TIMEOUT",
    "TRANSPORTS",
    "GpuModel",
    "GpuSpec",
    "GpuState",
    "Note",
    "Scenario",
    "bundled_scenario_path",
    "bundled_scenarios",
    "format_duration",
    "load_scenario",
    "parse_scenario",
]


def parse_scenario(
    text: str, path: str = "<scenario>", extra_fields: tuple[ExtraField, ...] = ()
) -> Scenario:
    """Parse and validate scenario YAML; raises ``ConfigError`` listing every problem.

    ``extra_fields`` (the config's ``fields`` section) are settable like built-in fields."""
    return ScenarioParser(path, extra_fields).scenario(parse(text, path))


def load_scenario(path: str, extra_fields: tuple[ExtraField, ...] = ()) -> Scenario:
    """Load, validate and compile a scenario file; raises ``ConfigError``."""
    return ScenarioParser(path, extra_fields).scenario(load_file(path))
