"""Keep a kernel-log reader alive: an unexpected error restarts it, visibly.

A reader thread that dies of an error nobody expected used to end in silence: its
heartbeat was closed like a clean stop, ``/healthz`` stayed ok, and every later XID was
ignored. ``run_with_restarts`` runs the reader's loop; when the loop raises, it

- logs the error with its traceback,
- counts it (``gpuwatchd_kernel_log_errors_total``),
- marks the source down with the reason (``gpuwatchd_source_up`` 0, ``/api/v1/status``),
- makes the reader's heartbeat report the failure (``/healthz`` fails at once, and the
  systemd watchdog stops its pings if the reader stays dead),
- and runs the loop again after 1, 2, 4 ... at most 60 seconds. The restarted loop
  resumes from the saved position, so nothing the kernel logged meanwhile is lost.

A loop that returns (stopped, or its source is unavailable) ends the thread normally.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gpuwatchd.core.heartbeat import Heartbeat

log = logging.getLogger(__name__)

MAX_RESTART_DELAY = 60.0


def run_with_restarts(
    name: str,
    loop: Callable[[], None],
    *,
    stop: threading.Event,
    heartbeat: Callable[[], Heartbeat | None],
    on_crash: Callable[[str], None],
) -> None:
    """Run ``loop`` until it returns or ``stop`` is set, restarting it after a crash."""
    crashes = 0
    while not stop.is_set():
        try:
            loop()
        except Exception as exc:
            delay = min(MAX_RESTART_DELAY, 2.0**crashes)
            crashes += 1
            reason = f"{type(exc).__name__}: {str(exc)[:200]}"
            log.exception("%s reader crashed (%s); restarting it in %gs", name, reason, delay)
            hb = heartbeat()
            if hb is not None:
                hb.fail(f"reader crashed ({reason}); restart {crashes} in {delay:g}s")
            on_crash(f"reader crashed ({reason}); restarting in {delay:g}s")
            if stop.wait(delay):
                break
            continue
        break
    hb = heartbeat()
    if hb is not None:
        hb.close()  # ended on purpose (stopped or unavailable): not a wedged worker
