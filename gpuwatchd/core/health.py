"""One health verdict per GPU, and the exit codes every command shares.

A GPU's health is what ``status``, ``check``, the demo's summary, the status API
(``gpus[].health``) and the metrics (``gpuwatchd_gpu_health``) show; each of them calls
``gpu_health`` with the GPU's poll status and the alerts firing on it, so they cannot
disagree:

- ``lost``, ``stale``, ``error``: the poll status when the GPU does not answer (its last
  readings are not current, and are shown as such if at all);
- ``failing``: a ``page`` fires on the GPU;
- ``degraded``: a ``ticket`` fires on it (and no page);
- ``ok``: it answers and nothing but ``info`` alerts fire on it.

The rule names that made it ``failing`` or ``degraded`` go with the verdict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

EXIT_OK = 0
"""The command did what was asked; for ``status`` and ``check``: the node is healthy."""
EXIT_UNHEALTHY = 1
"""The node is not healthy, or the command failed (an invalid config, a refused request)."""
EXIT_CANNOT_TELL = 2
"""No answer to give: the daemon cannot be reached or does not answer usefully."""
EXIT_USAGE = 64
"""A usage error: an unknown command or option, a bad argument (EX_USAGE)."""

OK, DEGRADED, FAILING = "ok", "degraded", "failing"
HEALTH_STATES = (OK, DEGRADED, FAILING, "lost", "stale", "error")
"""Every value ``gpu_health`` gives, in the order the metrics list them."""

_RANK = {"page": 3, "ticket": 2, "info": 1}


@dataclass(frozen=True)
class GpuHealth:
    health: str  # one of HEALTH_STATES
    rules: tuple[str, ...] = ()  # firing page and ticket rules on the GPU, pages first

    @property
    def answers(self) -> bool:
        """The GPU answered its last poll (its readings are current)."""
        return self.health in (OK, DEGRADED, FAILING)

    def text(self) -> str:
        """``failing (GpuTemperatureHigh)``, ``lost``, ``ok``."""
        return f"{self.health} ({', '.join(self.rules)})" if self.rules else self.health

    def as_dict(self) -> dict[str, Any]:
        return {"health": self.health, "health_rules": list(self.rules)}


def gpu_health(status: str, firing: Iterable[tuple[str, str]] = ()) -> GpuHealth:
    """The verdict on a GPU from its poll status (ok, lost, stale, error) and the
    ``(rule, severity)`` of every alert firing on it."""
    best: dict[str, int] = {}
    for rule, severity in firing:
        rank = _RANK.get(severity, 0)
        if rank >= _RANK["ticket"] and rank > best.get(rule, 0):
            best[rule] = rank
    rules = tuple(sorted(best, key=lambda r: (-best[r], r)))
    if status != OK:
        return GpuHealth(status, rules)
    top = max(best.values(), default=0)
    if top >= _RANK["page"]:
        return GpuHealth(FAILING, rules)
    if top >= _RANK["ticket"]:
        return GpuHealth(DEGRADED, rules)
    return GpuHealth(OK, rules)


def firing_by_gpu(alerts: Iterable[Mapping[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """The ``(rule, severity)`` of firing alerts by their ``gpu`` label (the status API's
    ``alerts`` entries: ``{"rule", "severity", "labels"}``); node-level ones under ``""``."""
    out: dict[str, list[tuple[str, str]]] = {}
    for a in alerts:
        gpu = str((a.get("labels") or {}).get("gpu") or "")
        out.setdefault(gpu, []).append((str(a.get("rule", "?")), str(a.get("severity", "?"))))
    return out
