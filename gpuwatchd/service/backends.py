"""Choosing the GPU backend a config names: real NVML or a scenario."""

from __future__ import annotations

from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendUnavailable
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.sources.gpu.backend import Backend


def open_backend(
    spec: str,
    clock: Clock,
    real_stalls: bool = True,
    extra_fields: tuple[ExtraField, ...] = (),
) -> Backend:
    """``nvml`` or ``scenario:PATH``; raises ``BackendUnavailable``/``ConfigError``.
    ``extra_fields`` (the config's ``fields``) are polled by NVML, settable in a scenario."""
    if spec == "nvml":
        from gpuwatchd.sources.gpu.nvml import NvmlBackend

        return NvmlBackend(clock=clock, extra_fields=extra_fields)
    if spec.startswith("scenario:"):
        from gpuwatchd.scenario.backend import ScenarioBackend
        from gpuwatchd.scenario.model import load_scenario

        return ScenarioBackend(
            load_scenario(spec.removeprefix("scenario:"), extra_fields),
            clock,
            real_stalls=real_stalls,
        )
    raise BackendUnavailable(f"unknown backend {spec!r}: use 'nvml' or 'scenario:PATH'")
