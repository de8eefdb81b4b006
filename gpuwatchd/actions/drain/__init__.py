"""The drain stage: one drain per incident, held, resumed, within the node's and fleet's limits.

``machine`` holds the per-incident state machine, ``controller`` its schedule (see their
docstrings); the names below are the stage's
public face, importable as ``gpuwatchd.actions.drain`` as before the stage became a package.
"""

from __future__ import annotations

from gpuwatchd.actions.drain.controller import FAILED_RULE, LIMIT_RULE, DrainController
from gpuwatchd.actions.drain.hold import HELD_STATES, HOLD_RESULTS
from gpuwatchd.actions.drain.machine import DRAINED_STATES, OVER_BUDGET, PENDING, RESULTS
from gpuwatchd.actions.drain.resume import RESUME_RESULTS

__all__ = [
    "DRAINED_STATES",
    "FAILED_RULE",
    "HELD_STATES",
    "HOLD_RESULTS",
    "LIMIT_RULE",
    "OVER_BUDGET",
    "PENDING",
    "RESULTS",
    "RESUME_RESULTS",
    "DrainController",
]
