"""The recording driver of ``simulate``, ``demo`` and rule tests: never touches the
scheduler, says what the configured mode would have done (not a ``drain.mode``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuwatchd.actions.drain.drivers.base import (
    DrainResult,
    Gate,
)


class RecordDriver:
    """``simulate``: never touches the scheduler; says what it would have done."""

    reads_state = False
    recording = True  # the controller treats its drains as a dry run's

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def drain(
        self, incident: Mapping[str, Any], reason: str, dry_run: bool, *, gate: Gate | None = None
    ) -> DrainResult:
        return DrainResult("dry_run", f"recorded ({self.mode}): drain, reason {reason!r}")

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        return None

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        return DrainResult("dry_run", f"recorded ({self.mode}): resume")

    def close(self) -> None:
        pass
