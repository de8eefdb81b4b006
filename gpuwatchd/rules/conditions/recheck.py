"""Look again only when something moved: what the counter conditions whose verdict changes
only when a counter moves or time passes (``trend``, ``memory_trend``, ``peer_outlier``)
keep between evaluations."""

from __future__ import annotations

from gpuwatchd.rules.history import CounterHistory
from gpuwatchd.rules.snapshot import Snapshot


class Recheck:
    """The rule's last look at the node, and per series the version and time of its last
    look that found nothing; either is trusted for ``every`` seconds."""

    __slots__ = ("clean", "every", "last_look")

    def __init__(self, every: float) -> None:
        self.every = every
        self.last_look: float | None = None
        self.clean: dict[CounterHistory, tuple[int, float]] = {}  # no hit at (version, t)

    def node_quiet(self, snap: Snapshot, field: str, now: float) -> bool:
        """True when no GPU's ``field`` moved since a look less than ``every`` ago (nothing
        can have changed); otherwise this is a look: note it and return False."""
        last = self.last_look
        if not snap.field_moved(field) and last is not None and now - last < self.every:
            return True
        self.last_look = now
        return False

    def unchanged(self, series: CounterHistory, version: int, now: float) -> bool:
        """True when ``series`` found nothing at this ``version`` less than ``every`` ago."""
        seen = self.clean.get(series)
        return seen is not None and seen[0] == version and now - seen[1] < self.every

    def record(self, series: CounterHistory, version: int, now: float, hit: bool) -> None:
        """What a look at ``series`` found: a hit is looked at again next time."""
        if hit:
            self.clean.pop(series, None)
        else:
            self.clean[series] = (version, now)
