"""A source's resume position, saved atomically in the state directory."""

from __future__ import annotations

import json
import logging
from typing import Any

from ..atomicfile import write_atomic

log = logging.getLogger(__name__)


class PositionFile:
    """A small JSON document replaced atomically (write a temp file, fsync, rename)."""

    def __init__(self, path: str | None) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
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
            log.warning("cannot save position to %s: %s", self.path, exc)
