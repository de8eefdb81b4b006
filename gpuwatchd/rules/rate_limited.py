"""XID 92 read as "this GPU's corrected-error count is rate-limited".

XID 92 (high single-bit ECC error rate) is the driver saying that corrected errors come
faster than it reports them: while it has been seen, the corrected counters of that GPU
(``RATE_LIMITED_FIELDS``) count at most what happened, so a count or a rate read from them
over a window that holds an XID 92 of the GPU is a lower bound. Verdicts stay as they are
(a lower bound that crosses a threshold crosses it; one that does not proves nothing), and
the alert says so: the ``{rate_limited}`` placeholder of the counter rules and of
``memory_trend`` is ``RATE_LIMITED_NOTE`` then, and empty otherwise. It looks back over the
rule's window, at most ``LOOKBACK`` (a day): the engine keeps XIDs for the longest span a
rule asks for, and every XID rule scans them, so asking for a 3-day window would triple them.
"""

from __future__ import annotations

from gpuwatchd.rules.snapshot import Snapshot

XID_RATE_LIMITED = 92
RATE_LIMITED_FIELDS = frozenset(
    {"ecc_corrected_volatile", "ecc_corrected_volatile_dev", "ecc_corrected_aggregate"}
)
LOOKBACK = 86400.0
RATE_LIMITED_NOTE = " (a lower bound: XID 92 in the window, the driver rate-limits this count)"


def rate_limited(snap: Snapshot, gpu: int, since: float) -> bool:
    """Whether GPU ``gpu`` reported XID 92 at or after ``since`` (the XIDs the engine keeps:
    the longest window a rule asks for; read only for a rule that holds)."""
    return any(
        x.event.xid == XID_RATE_LIMITED
        and x.event.kind != "sxid"
        and x.event.timestamp >= since
        and snap.gpu_of(x.event) == gpu
        for x in snap.xids.events
    )


def lookback(field: str, window: float) -> float:
    """How long XIDs must be kept for ``note`` on a rule over ``field`` and ``window``."""
    return min(window, LOOKBACK) if field in RATE_LIMITED_FIELDS else 0.0


def note(snap: Snapshot, field: str, gpu: int, now: float, window: float) -> str:
    """The ``{rate_limited}`` text of ``field`` on GPU ``gpu`` for a window of ``window``
    ending at ``now``."""
    if field in RATE_LIMITED_FIELDS and rate_limited(snap, gpu, now - min(window, LOOKBACK)):
        return RATE_LIMITED_NOTE
    return ""
