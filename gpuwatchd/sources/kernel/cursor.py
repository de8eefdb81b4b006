"""A source's resume position, saved atomically in the state directory."""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuwatchd.core.atomicfile import write_atomic
from gpuwatchd.core.statefile import read_state_file

log = logging.getLogger(__name__)
MAX_BYTES = 64 * 1024  # a position is a few dozen bytes; anything larger is not ours


class PositionFile:
    """A small JSON document replaced atomically (write a temp file, fsync, rename)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.durable = True  # False while saves fail (disk full, read-only)
        self.errors = 0
        self.problem = ""

    def load(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            data = json.loads(read_state_file(self.path, MAX_BYTES).decode("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable position file %s: %s", self.path, exc)
            return None
        return data if isinstance(data, dict) else None

    def save(self, data: dict[str, Any]) -> None:
        if self.path is None:
            return
        try:
            write_atomic(self.path, json.dumps(data))
        except OSError as exc:
            self.errors += 1
            self.problem = exc.strerror or str(exc)
            if self.durable:  # once per streak: the reader saves after every batch
                log.error(
                    "cannot save the kernel-log position to %s: %s (kept in memory; a "
                    "restart meanwhile may re-read or skip lines)",
                    self.path,
                    self.problem,
                )
            self.durable = False
            return
        if not self.durable:
            log.warning("kernel-log position saved to %s again", self.path)
        self.durable = True
        self.problem = ""
