"""Reloading receivers, routing and drain settings on SIGHUP.

``prepare_reload(actions, new_config)`` does everything that can fail first: it reads the
new receivers' secrets, compiles the routing and builds the drain driver. Any problem
raises ``ConfigError`` and nothing changes. Otherwise it returns the function that swaps
them in (called by the daemon once every reload hook agreed): new messages go to the new
receivers; messages already queued for a receiver that is still configured go out with
its new settings; a receiver that left the config loses its queue (logged).

Some changes only a restart can apply: turning the drain on or off, or turning actions
on when the daemon started without any. ``prepare_reload`` refuses those with
``RestartRequired`` (a ``ConfigError``: the whole reload is refused, with a clear log
line), and the sink's ``gpuwatchd_actions_restart_required`` gauge says 1 until a later
reload succeeds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gpuwatchd.actions.drivers import DrainError, Driver
from gpuwatchd.actions.routing import Router
from gpuwatchd.actions.secrets import SecretError
from gpuwatchd.config.loader import Config
from gpuwatchd.core.errors import ConfigError, Location

if TYPE_CHECKING:
    from gpuwatchd.actions.sink import ActionsSink

log = logging.getLogger(__name__)


class RestartRequired(ConfigError):
    """The reloaded config changes actions in a way only a restart applies."""


def _where(config: Config) -> Location:
    return Location(config.source or "<built-in config>", 1, 1)


def prepare_reload(
    actions: ActionsSink | None,
    new: Config,
    *,
    environ: Mapping[str, str] | None = None,
) -> Callable[[], None]:
    """Validate ``new``'s receivers, routing and drain; the function that applies them.
    Raises ``ConfigError`` (``RestartRequired`` for changes only a restart applies)."""
    from gpuwatchd.actions import wanted
    from gpuwatchd.actions.sink import build_receivers, drain_driver

    if actions is None:
        if wanted(new):
            raise RestartRequired.at(
                _where(new),
                "receivers or drain: the daemon started without actions; "
                "restart it to turn them on",
            )
        return lambda: None
    old = actions.config
    if (old.drain.mode == "none") != (new.drain.mode == "none"):
        actions.restart_required = True
        raise RestartRequired.at(
            _where(new),
            f"drain.mode: {old.drain.mode} -> {new.drain.mode} takes a restart "
            "(the running daemon keeps its receivers, routing and drain settings)",
        )
    try:
        receivers = build_receivers(new.receivers, environ, actions.sender.needs_secrets)
        Router(new.routing, receivers)  # compiles every match_re
        driver: Driver | None = None
        if new.drain.mode != "none" and new.drain != old.drain:
            driver = drain_driver(new.drain, new.drain.node or old.node_name, actions.clock)
    except (SecretError, DrainError) as exc:
        raise ConfigError.at(_where(new), str(exc)) from None

    def commit() -> None:
        actions.apply(new, receivers, driver)
        actions.restart_required = False

    return commit
