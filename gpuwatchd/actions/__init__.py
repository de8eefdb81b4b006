"""Actions: where alert decisions leave the node - pages and scheduler drains.

The public builder (its signature is stable; the composition root calls it with the
stage's own part of the config, ``config.stages.for_actions(config)``)::

    actions = build_actions(settings, clock, transport=None, environ=None)
    if actions is not None:
        actions.start()                 # threads: senders, scheduler, drain
        pipeline.sinks.append(actions)  # deliver(transitions, now), families(view, fams)
        for s in actions.secrets:       # the caller registers them for log redaction
            register_secret(s)
        ...
        actions.close()

``build_actions`` returns None when the config has no receivers and no drain mode. It
starts no thread and changes no global state; without ``start()``, ``run_pending(now)``
does the due work in the caller (``simulate`` on its virtual clock). Optional keywords:
``sender`` (a ``Sender``; default HTTP through httpx with ``transport``), ``db_path``
(default ``<state_dir>/actions.db``; ``":memory:"`` keeps nothing), ``silences`` (read the
silences file in the state directory; default True), ``driver`` (the drain driver; default
the one the config names), ``rng``, ``on_drain`` (called with each drain record) and
``run_notify`` (run ``drain.notify_command``; default True).

``build_recording_actions(config, clock, emit, send=..., db_path=...)`` is the variant for
``simulate`` and ``demo``: notifications and drains are handed to ``emit`` as records,
nothing is sent (unless ``send``), no secret is read and the scheduler is never touched.

``prepare_reload(actions, new_settings, environ=...)`` validates reloaded receivers,
routing and drain settings and returns the function that swaps them in; it raises
``ConfigError`` to refuse. ``ActionsOwner`` is the stage's owner of those three sections
at a SIGHUP (``core.reloading``). See docs/actions.md.
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections.abc import Callable, Mapping

import httpx

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver
from gpuwatchd.actions.drain.drivers.record import RecordDriver
from gpuwatchd.actions.recording import Emit, RecordingSender
from gpuwatchd.actions.reload import ActionsOwner, RestartRequired, prepare_reload
from gpuwatchd.actions.secrets import SecretError
from gpuwatchd.actions.silences import SilenceView, path_in
from gpuwatchd.actions.sink import ActionsSink
from gpuwatchd.actions.store import DB_NAME, Store
from gpuwatchd.actions.transport import HttpSender, Outgoing, Sender
from gpuwatchd.config.stages import ActionsSettings
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import GpuwatchdError
from gpuwatchd.core.records import DrainOutcome


class ActionsError(GpuwatchdError):
    """The actions stage cannot start (unreadable secret, unusable drain driver)."""


def wanted(config: ActionsSettings) -> bool:
    """Whether the config asks for any action (a receiver or a drain mode)."""
    return config.wanted


def build_actions(
    config: ActionsSettings,
    clock: Clock,
    *,
    transport: httpx.BaseTransport | None = None,
    environ: Mapping[str, str] | None = None,
    sender: Sender | None = None,
    db_path: str | None = None,
    silences: bool = True,
    driver: Driver | None = None,
    rng: random.Random | None = None,
    on_drain: Emit | None = None,
    run_notify: bool = True,
    report: Callable[[DrainOutcome], None] | None = None,
) -> ActionsSink | None:
    """The actions sink (not started), or None when nothing is configured to receive
    actions. ``ActionsError`` when a secret or the drain driver cannot be had."""
    if not wanted(config):
        return None
    store = Store(db_path or os.path.join(config.state_dir, DB_NAME))
    try:
        return ActionsSink(
            config,
            clock,
            sender=sender or HttpSender(transport),
            store=store,
            silences=SilenceView(path_in(config.state_dir) if silences else None),
            driver=driver,
            environ=environ,
            rng=rng,
            on_drain=on_drain,
            run_notify=run_notify,
            report=report,
        )
    except (SecretError, DrainError) as exc:
        store.close()
        raise ActionsError(str(exc)) from None
    except (OSError, sqlite3.Error) as exc:
        store.close()
        reason = getattr(exc, "strerror", None) or exc
        raise ActionsError(f"cannot use the outbox in {config.state_dir}: {reason}") from None


def build_recording_actions(
    config: ActionsSettings,
    clock: Clock,
    emit: Emit | None,
    *,
    send: bool = False,
    transport: httpx.BaseTransport | None = None,
    environ: Mapping[str, str] | None = None,
    db_path: str = ":memory:",
    rng: random.Random | None = None,
    report: Callable[[DrainOutcome], None] | None = None,
) -> ActionsSink | None:
    """``simulate``, ``demo`` and rule tests: notifications become records for ``emit``
    (with ``send``, or without ``emit``, they really go out over HTTP), drains are only
    recorded (``emit`` gets them), the silences file and ``notify_command`` are left
    alone, the outbox is in memory unless ``db_path`` says otherwise."""
    recording = emit is not None and not send
    return build_actions(
        config,
        clock,
        transport=transport,
        environ=environ,
        sender=RecordingSender(emit) if recording else None,
        db_path=db_path,
        silences=False,
        driver=RecordDriver(config.drain.mode),
        rng=rng,
        on_drain=emit,
        run_notify=False,
        report=report,
    )


__all__ = [
    "ActionsError",
    "ActionsOwner",
    "ActionsSink",
    "DrainError",
    "DrainResult",
    "HttpSender",
    "Outgoing",
    "RecordingSender",
    "RestartRequired",
    "SecretError",
    "Sender",
    "build_actions",
    "build_recording_actions",
    "prepare_reload",
    "wanted",
]
