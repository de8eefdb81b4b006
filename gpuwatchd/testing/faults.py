"""Faults injected into a running daemon, for tests and watchdog drills.

``gpuwatchd run`` reads ``$GPUWATCHD_TEST_FAULT`` (and only then imports this module)::

    GPUWATCHD_TEST_FAULT=wedge-evaluator:N    after N rule evaluations, the next one never
                                              returns (until shutdown)

A wedged evaluation holds the pipeline lock, as a rule stuck in a pathological regex
would: the evaluator stops, then the poll workers block handing over their samples, then
the poll scheduler blocks reporting them stale. The watchdog must notice and stop
pinging systemd. Nothing else in the daemon knows about this hook.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from ..alerts import AlertTransition
from ..exposition import Families
from ..poller import Record
from ..snapshot import NodeView

__all__ = ["ENV", "WedgeStage", "stages_from_environ"]

ENV = "GPUWATCHD_TEST_FAULT"


class WedgeStage:
    """A pipeline ``Stage`` whose evaluation number ``after + 1`` blocks until ``close()``."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.evaluations = 0
        self.wedged = threading.Event()
        self._release = threading.Event()

    def observe(self, record: Record) -> None:
        return None

    def evaluate(self, now: float, view: NodeView) -> list[AlertTransition]:
        self.evaluations += 1
        if self.evaluations > self.after:
            self.wedged.set()
            self._release.wait()
        return []

    def families(self, view: NodeView, fams: Families) -> None:
        return None

    def close(self) -> None:
        self._release.set()


def stages_from_environ(environ: Mapping[str, str]) -> list[WedgeStage]:
    """The fault stages ``$GPUWATCHD_TEST_FAULT`` asks for; ``ValueError`` if malformed."""
    spec = environ.get(ENV, "")
    if not spec:
        return []
    kind, _, arg = spec.partition(":")
    if kind == "wedge-evaluator" and arg.isdigit():
        return [WedgeStage(int(arg))]
    raise ValueError(f"{ENV}={spec!r}: expected wedge-evaluator:N")
