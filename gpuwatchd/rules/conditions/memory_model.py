"""The ``memory_trend`` condition's parameters (``MemoryTrend``) and its signals: what the
kind (``memory_trend.py``), the judge (``memory_judge.py``), the acceleration test
(``memory_acceleration.py``) and its bounds (``memory_bounds.py``) all read. The keys are
described in ``memory_trend.py``'s docstring and docs/rules.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuwatchd.rules.evidence import BUCKET
from gpuwatchd.rules.model import Condition

Signal = Literal["acceleration", "activity", "corroborated", "certified", "node", "stream"]
SIGNALS: tuple[Signal, ...] = (
    "acceleration",
    "activity",
    "corroborated",
    "certified",
    "node",
    "stream",
)


@dataclass(frozen=True)
class MemoryTrend(Condition):
    """See the module docstring; durations in seconds."""

    signal: Signal = "acceleration"
    field: str = "ecc_corrected_volatile_dev"
    windows: tuple[float, ...] = (86400.0, 3 * 86400.0)
    factor: float = 1.0
    alpha: float = 3e-3
    min_active: int = 3
    min_episodes: int = 3
    min_baseline: float = 86400.0
    quiet: float = 28 * 86400.0
    peak_ratio: float = 0.3
    dispersion: bool = False
    session_veto: bool = False
    scan: float = 0.0  # the scan's step; 0: no scan
    scan_alpha: float = 0.1
    scan_baseline: float = 7 * 86400.0
    scan_ratio: float = 1.5
    stream: float = 2 * 86400.0  # signal stream: how long an episode runs before it counts

    @property
    def window(self) -> float:
        """The longest recent window."""
        return max(self.windows)

    @property
    def window_widths(self) -> tuple[int, ...]:
        """The recent windows in buckets (the acceleration's fixed windows)."""
        return tuple(int(w // BUCKET) for w in self.windows)

    @property
    def scan_step(self) -> int:
        """The change-point scan's step in buckets (at least one): its widths are multiples."""
        return max(int(self.scan // BUCKET), 1)
