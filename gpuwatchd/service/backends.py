"""Choosing the GPU backend a config names: real NVML or a scenario."""

from __future__ import annotations

from gpuwatchd.configfile.loader import PollConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendUnavailable
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.sources.gpu.backend import Backend


def open_backend(
    spec: str,
    clock: Clock,
    real_stalls: bool = True,
    extra_fields: tuple[ExtraField, ...] = (),
    poll: PollConfig | None = None,
    nvml_events: bool = True,
) -> Backend:
    """``nvml`` or ``scenario:PATH``; raises ``BackendUnavailable``/``ConfigError``.
    ``extra_fields`` (the config's ``fields``) are polled by NVML, settable in a scenario.
    NVML runs in a supervised worker process unless ``poll.worker`` is off."""
    if spec == "nvml":
        from gpuwatchd.sources.gpu.worker import WorkerBackend, WorkerSettings

        poll = poll or PollConfig()
        settings = WorkerSettings(
            slow_interval_s=poll.slow_interval,
            link_interval_s=poll.nvlink_counters_interval,
            state_interval_s=poll.state_interval,
            nvlink=poll.nvlink,
            processes=poll.processes,
            events=nvml_events,
            extra_fields=extra_fields,
            hang_s=poll.worker_hang_timeout,
        )
        if poll.worker:
            return WorkerBackend(clock, settings)
        from gpuwatchd.sources.gpu.nvml import NvmlBackend

        return NvmlBackend(clock=clock, **settings.backend_kwargs())
    if spec.startswith("scenario:"):
        from gpuwatchd.scenario.backend import ScenarioBackend
        from gpuwatchd.scenario.model import load_scenario

        return ScenarioBackend(
            load_scenario(spec.removeprefix("scenario:"), extra_fields),
            clock,
            real_stalls=real_stalls,
        )
    raise BackendUnavailable(f"unknown backend {spec!r}: use 'nvml' or 'scenario:PATH'")
