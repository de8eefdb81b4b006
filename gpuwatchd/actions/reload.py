"""Reloading receivers, routing and drain settings on SIGHUP.

``ActionsOwner`` owns the ``receivers``, ``routing`` and ``drain`` sections at a reload
(``core.reloading``). ``prepare_reload(actions, new_settings)`` does everything that can
fail first: it reads the new receivers' secrets, compiles the routing and builds the
drain driver. Any problem raises ``ConfigError`` and nothing changes. Otherwise it
returns the function that swaps them in (called once every owner agreed): new messages go to the new
receivers; messages already queued for a receiver that is still configured go out with
its new settings; a receiver that left the config loses its queue (logged).

Some changes only a restart can apply: turning the drain on or off, or turning actions
on when the daemon started without any. ``prepare_reload`` refuses those with
``RestartRequired`` (a ``ConfigError``). At a SIGHUP, ``ActionsOwner`` refuses only the
sections concerned instead (the ``drain`` section keeps its running value, new receivers
and routing are applied; the daemon logs, counts and shows the refusal), and the sink's
``gpuwatchd_actions_restart_required`` gauge says 1 until a later reload puts the running
drain mode back.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gpuwatchd.actions.drain.drivers.base import DrainError, Driver
from gpuwatchd.actions.routing import Router
from gpuwatchd.actions.secrets import SecretError
from gpuwatchd.config.stages import ActionsSettings
from gpuwatchd.core.errors import ConfigError, Location
from gpuwatchd.core.reloading import Prepared

if TYPE_CHECKING:
    from gpuwatchd.actions.sink import ActionsSink

log = logging.getLogger(__name__)


class RestartRequired(ConfigError):
    """The reloaded config changes actions in a way only a restart applies."""


def _where(source: str | None) -> Location:
    return Location(source or "<built-in config>", 1, 1)


def prepare_reload(
    actions: ActionsSink | None,
    new: ActionsSettings,
    *,
    environ: Mapping[str, str] | None = None,
) -> Callable[[], None]:
    """Validate ``new``'s receivers, routing and drain; the function that applies them.
    Raises ``ConfigError`` (``RestartRequired`` for changes only a restart applies)."""
    from gpuwatchd.actions.sink import build_receivers, drain_driver

    if actions is None:
        if new.wanted:
            raise RestartRequired.at(
                _where(new.source),
                "receivers or drain: the daemon started without actions; "
                "restart it to turn them on",
            )
        return lambda: None
    old = actions.config
    if (old.drain.mode == "none") != (new.drain.mode == "none"):
        actions.restart_required = True
        raise RestartRequired.at(
            _where(new.source),
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
        raise ConfigError.at(_where(new.source), str(exc)) from None

    def commit() -> None:
        actions.apply(new, receivers, driver)
        actions.restart_required = False

    return commit


class ActionsOwner:
    """The owner of ``receivers``, ``routing`` and ``drain`` at a SIGHUP.

    Receivers are rebuilt at every reload (a secret file may have changed under an
    unchanged section). Turning the drain on or off refuses the ``drain`` section only.
    (A daemon started without any actions never loads this package: the composition
    root's own owner refuses turning them on.)
    """

    sections = ("receivers", "routing", "drain")

    def __init__(
        self,
        actions: ActionsSink,
        running: ActionsSettings,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.actions = actions
        self.running = running
        self.environ = environ

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        settings = dataclasses.replace(self.running, **new)
        actions = self.actions
        old = actions.config.drain.mode
        if (old == "none") != (settings.drain.mode == "none"):
            why = f"drain.mode: {old} -> {settings.drain.mode} takes a restart"
            kept = dataclasses.replace(settings, drain=actions.config.drain)
            commit = prepare_reload(actions, kept, environ=self.environ)

            def apply_but_drain() -> None:
                commit()
                actions.restart_required = True
                self.running = kept

            return Prepared(apply_but_drain, {"drain": why})
        commit = prepare_reload(actions, settings, environ=self.environ)

        def apply() -> None:
            commit()
            self.running = settings

        return Prepared(apply)
