"""Actions: where alert decisions leave the node - pages and scheduler drains.

``build_actions(config, clock)`` returns the ``ActionsSink`` for the pipeline when the
config has receivers or a drain mode, else ``None``. See docs/actions.md.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping

import httpx

from gpuwatchd.actions.drivers import DrainError, DrainResult
from gpuwatchd.actions.secrets import SecretError
from gpuwatchd.actions.sink import ActionsSink
from gpuwatchd.config.loader import Config
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import GpuwatchdError


class ActionsError(GpuwatchdError):
    """The actions stage cannot start (unreadable secret, unusable state directory)."""


def build_actions(
    config: Config,
    clock: Clock,
    *,
    transport: httpx.BaseTransport | None = None,
    environ: Mapping[str, str] | None = None,
) -> ActionsSink | None:
    """The started sink, or None when nothing is configured to receive actions."""
    if not config.receivers and config.drain.mode == "none":
        return None
    try:
        return ActionsSink(config, clock, transport=transport, environ=environ)
    except (SecretError, DrainError) as exc:
        raise ActionsError(str(exc)) from None
    except (OSError, sqlite3.Error) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ActionsError(f"cannot open the outbox in {config.state_dir}: {reason}") from None


__all__ = [
    "ActionsError",
    "ActionsSink",
    "DrainError",
    "DrainResult",
    "SecretError",
    "build_actions",
]
