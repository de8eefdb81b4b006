"""``ActionsSink``: the pipeline's sink for alert transitions. It puts together the parts
of the actions stage and owns none of their logic:

- ``Outbox`` (``outbox.py``): commits each transition, its routing into groups and its
  drain incident in one transaction before anything leaves the node;
- ``TargetDelivery`` (``delivery.py``): sends the pending messages of one receiver target
  through a ``Sender`` (``transport.py``: HTTP, or ``recording.py``: recorded);
- ``DrainController`` (``drain/``): drains and resumes the node;
- ``Workers`` (``workers.py``): the threads, started by ``start()`` only.

Constructing a sink starts nothing and changes no global state. Without ``start()``,
``run_pending()`` does the due work in the caller (``simulate`` on its virtual clock,
deterministic tests). ``deliver`` commits and then wakes the workers, so the first
message of a new group leaves at once.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from gpuwatchd.actions.delivery import InFlight, TargetDelivery, TargetHealth
from gpuwatchd.actions.drain import DrainController
from gpuwatchd.actions.drain.drivers.base import Driver
from gpuwatchd.actions.drain.drivers.registry import build_driver
from gpuwatchd.actions.metrics import ActionMetrics
from gpuwatchd.actions.model import match_labels
from gpuwatchd.actions.outbox import Current, Outbox
from gpuwatchd.actions.receivers import Receiver, build_receiver
from gpuwatchd.actions.recording import Emit
from gpuwatchd.actions.secrets import redact
from gpuwatchd.actions.silences import SilenceView
from gpuwatchd.actions.store import Store, loads
from gpuwatchd.actions.transport import HttpSender, Sender
from gpuwatchd.actions.workers import TargetKey, Workers
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.config.receivers import ReceiverConfig
from gpuwatchd.config.stages import ActionsSettings
from gpuwatchd.core.alerts import AlertTransition
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.records import DrainOutcome
from gpuwatchd.core.statehealth import StoreHealth, state_families
from gpuwatchd.core.statusdoc import (
    ActionsState,
    Deliveries,
    DeliveryFiring,
    DrainState,
    ReceiverState,
    SilenceState,
)

log = logging.getLogger(__name__)

PRUNE_EVERY = 3600.0
CLOSE_TIMEOUT = 5.0
RUN_PENDING_MAX = 10_000  # messages one target sends in one run_pending call, at most


def build_receivers(
    configs: tuple[ReceiverConfig, ...], environ: Mapping[str, str] | None, read_secrets: bool
) -> dict[str, Receiver]:
    """Every configured receiver with its secrets read (``SecretError`` when one cannot
    be); without ``read_secrets`` placeholders stand in (nothing is really sent)."""
    return {rc.name: build_receiver(rc, environ, load_secrets=read_secrets) for rc in configs}


def drain_driver(drain: DrainConfig, node: str, clock: Clock) -> Driver:
    """The scheduler driver the config asks for (``DrainError`` when it cannot be made)."""
    return build_driver(drain, node, clock)


def _unreported(outcome: DrainOutcome) -> None:
    """Where drain outcomes go when no rule stage takes them (a sink built alone)."""
    log.error("drain outcome with no rule stage to judge it: %s", outcome.summary)


class ActionsSink:
    def __init__(
        self,
        config: ActionsSettings,
        clock: Clock,
        *,
        sender: Sender,
        store: Store,
        silences: SilenceView,
        driver: Driver | None = None,
        environ: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
        on_drain: Emit | None = None,
        run_notify: bool = True,
        report: Callable[[DrainOutcome], None] | None = None,
    ) -> None:
        """Use ``gpuwatchd.actions.build_actions``; this only puts the parts together.
        ``report`` takes the drain's outcomes to the rule stage (the hand-off), which
        decides whether they page."""
        self.config = config
        self.clock = clock
        self.node = config.node_name
        self.sender = sender
        self.store = store
        self.silences = silences
        self.environ = environ
        self.rng = rng or random.Random()
        self.receivers = build_receivers(config.receivers, environ, sender.needs_secrets)
        self.metrics = ActionMetrics(self.receivers)
        self.inflight = InFlight()
        self.outbox = Outbox(
            store, clock, self.node, config.routing, self.receivers, self.inflight.snapshot
        )
        self.health: dict[str, TargetHealth] = {n: TargetHealth() for n in self.receivers}
        self.restart_required = False  # a reload was refused: only a restart applies it
        self.drain: DrainController | None = None
        if config.drain.mode != "none":
            node = config.drain.node or config.node_name
            self.drain = DrainController(
                config.drain,
                node,
                store,
                clock,
                driver or drain_driver(config.drain, node, clock),
                report=report or _unreported,
                rng=self.rng,
                on_record=on_drain,
                run_notify=run_notify,
                silenced_by=self._silenced_by,
            )
        self.deliveries: dict[TargetKey, TargetDelivery] = {}
        for rcv in self.receivers.values():
            self._add_deliveries(rcv)
        self.workers = Workers(clock, self._schedule, self._drain_step if self.drain else None)
        self._next_prune = 0.0
        self._silence_next: float | None = None
        self.silences.refresh()
        self._refresh_queued()

    def _add_deliveries(self, rcv: Receiver) -> None:
        for i in range(len(rcv.targets)):
            self.deliveries[(rcv.name, i)] = self._delivery(rcv, i)

    def _delivery(self, rcv: Receiver, index: int) -> TargetDelivery:
        return TargetDelivery(
            rcv,
            index,
            outbox=self.outbox,
            sender=self.sender,
            clock=self.clock,
            metrics=self.metrics,
            health=self.health[rcv.name],
            inflight=self.inflight,
            rng=self.rng,
            on_change=self._refresh_queued,
        )

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Start the sender, scheduler and drain threads (idempotent)."""
        if isinstance(self.sender, HttpSender):
            self.sender.warm(self.receivers.values())
        self.workers.start(dict(self.deliveries))

    def close(self) -> None:
        busy = self.workers.stop(CLOSE_TIMEOUT)
        if not self.store.durable:
            log.error(
                "outbox in memory at shutdown (%s): %d pending deliveries are lost",
                self.store.degraded,
                self.pending(),
            )
        if busy:  # a send or a drain command still running: leave the outbox to the exit
            log.warning("actions: %s still busy at shutdown; pending work resumes on restart", busy)
            return
        self.sender.close()
        if self.drain is not None:
            self.drain.driver.close()
        self.store.close()

    def use_current(self, current: Current) -> None:
        """Fill every message about a firing alert with its current annotations and value
        (the rule engine's ``current``), as Prometheus re-renders at every evaluation."""
        self.outbox.current = current

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret the receivers hold: the caller scrubs them from every log line
        (read it again after a reload)."""
        return tuple(s for r in self.receivers.values() for s in r.secrets)

    def apply(
        self, new: ActionsSettings, receivers: dict[str, Receiver], driver: Driver | None
    ) -> None:
        """Swap in reloaded receivers, routing and drain settings (``prepare_reload``)."""
        for key in list(self.deliveries):
            rcv = receivers.get(key[0])
            if rcv is None or key[1] >= len(rcv.targets):
                self.workers.remove_target(key)
                del self.deliveries[key]
        gone = sorted(set(self.receivers) - set(receivers))
        for name in self.receivers:
            self.sender.forget(name)
        self.receivers = receivers
        self.outbox.configure(new.routing, receivers)
        for name, rcv in receivers.items():
            self.metrics.add_receiver(name)
            self.health.setdefault(name, TargetHealth())
            for i in range(len(rcv.targets)):
                current = self.deliveries.get((name, i))
                if current is not None:
                    current.receiver = rcv
                else:
                    self.deliveries[(name, i)] = self._delivery(rcv, i)
                    self.workers.add_target((name, i), self.deliveries[(name, i)])
        for name in gone:
            dropped = self.outbox.drop_receiver(name, self.clock.now())
            if dropped:
                log.warning(
                    "reload: receiver %s is no longer configured; %d queued message(s) dropped",
                    name,
                    dropped,
                )
        if self.drain is not None and driver is not None:
            old = self.drain.driver
            self.drain.cfg = new.drain
            self.drain.node = new.drain.node or self.node
            self.drain.driver = driver
            old.close()
        self.config = dataclasses.replace(
            self.config, receivers=new.receivers, routing=new.routing, drain=new.drain
        )
        self._refresh_queued()
        self.workers.wake()

    # -- the Sink protocol -------------------------------------------------------------
    def deliver(self, transitions: list[AlertTransition], now: float) -> None:
        """Commit transitions to the outbox (routing and drain incidents in the same
        transaction; groups that may speak now become deliveries), then wake the workers."""
        self.silences.refresh()
        done = self.outbox.commit(transitions, self._silenced_by, self.drain)
        with self.metrics.lock:
            self.metrics.transitions += done.new
            self.metrics.duplicates += done.duplicates
            self.metrics.silenced += done.muted
        self._count_drops(done.drops)
        if done.new:
            self.workers.wake()
            self._refresh_queued()

    def _silenced_by(self, rec: Mapping[str, Any], now: float) -> str | None:
        silence = self.silences.match(match_labels(rec), now)
        return None if silence is None else silence.id

    def families(self, view: NodeView, fams: Families) -> None:
        now = self.clock.now()
        with self.metrics.lock:
            self.metrics.silences_active = len(self.silences.active(now))
        self.metrics.families(fams)
        fams.get(
            "gpuwatchd_actions_restart_required",
            "gauge",
            "1 when the last reload changed receivers, routing or drain settings in a way "
            "that only a restart applies (the reload was refused).",
            [],
        ).add([], 1.0 if self.restart_required else 0.0)
        if self.drain is not None:
            self.drain.families(fams, now)
        state_families(fams, [self.state_health()])

    def state_health(self) -> StoreHealth:
        return self.store.health()

    def _count_drops(self, drops: list[tuple[str, str]]) -> None:
        for receiver, reason in drops:
            if receiver in self.receivers:
                self.metrics.add_dropped(receiver, reason)

    def _refresh_queued(self) -> None:
        counts = self.outbox.queued()
        with self.metrics.lock:
            for name in self.metrics.queued:
                self.metrics.queued[name] = counts.get(name, 0)

    # -- the scheduler -----------------------------------------------------------------
    def _schedule(self) -> float | None:
        """Flush due groups, re-route alerts whose silence ended, prune; the monotonic
        time of the next group timer or silence change."""
        self.store.maintain()  # the disk under the outbox: damaged? back after trouble?
        now, mono = self.clock.now(), self.clock.monotonic()
        changed = self.silences.refresh()
        if changed or (self._silence_next is not None and now >= self._silence_next):
            for rule in self.outbox.unmute(self._silenced_by):
                log.info("silence over for %s: notifying", rule)
        self._silence_next = self.silences.next_change(now)
        drops = self.outbox.flush_due(self._silenced_by)
        self._count_drops(drops)
        if mono >= self._next_prune:
            self.outbox.prune()
            self._next_prune = mono + PRUNE_EVERY
        self._refresh_queued()
        self.workers.wake_senders()
        times = [self.outbox.next_flush_at()]
        if self._silence_next is not None:
            times.append(mono + max(0.0, self._silence_next - now))
        due = [t for t in times if t is not None]
        return min(due) if due else None

    def _drain_step(self) -> float | None:
        assert self.drain is not None
        now = self.clock.now()
        until = self.drain.step(now)  # the drain controller speaks wall-clock time
        return None if until is None else self.clock.monotonic() + max(0.0, until - now)

    # -- synchronous driving (simulate, tests) -----------------------------------------
    def run_pending(self, now: float | None = None) -> None:
        """Do everything due now in this thread: flush, send, drain. ``now`` is accepted
        for the caller's convenience; the sink reads its clock."""
        self._schedule()
        self._send_due()
        if self.drain is not None:
            self.drain.step(self.clock.now())
            self._schedule()
            self._send_due()

    def _send_due(self) -> None:
        for delivery in list(self.deliveries.values()):
            for _ in range(RUN_PENDING_MAX):
                until = delivery.step()
                if until is None or until > self.clock.monotonic():
                    break

    def pending(self) -> int:
        return self.outbox.pending()

    def wait_idle(self, timeout: float) -> bool:
        """Real time: wait until nothing is pending (tests, bench)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pending() == 0:
                return True
            time.sleep(0.005)
        return self.pending() == 0

    # -- status ------------------------------------------------------------------------
    def status(self) -> ActionsState:
        """Pending deliveries, silences and drain state, the actions stage's part of the
        status document (no secrets)."""
        now, mono = self.clock.now(), self.clock.monotonic()
        secrets = self.secrets
        receivers = []
        for name, rcv in self.receivers.items():
            count, oldest = self.outbox.oldest(name)
            health = self.health[name]
            receivers.append(
                ReceiverState(
                    name=name,
                    type=rcv.kind,
                    pending=count,
                    oldest_pending_seconds=None if oldest is None else round(mono - oldest, 3),
                    last_error=redact(health.last_error, secrets) if health.last_error else None,
                    more={"targets": len(rcv.targets), "last_success": health.last_success},
                )
            )
        queue = []
        for r in self.outbox.queue(50):
            body = loads(r["body"])
            queue.append(
                {
                    "id": r["id"],
                    "receiver": r["receiver"],
                    "target": r["target"],
                    "kind": r["kind"],
                    "status": body["status"],
                    "alerts": [a["rule"] for a in body["alerts"]],
                    "attempts": r["attempts"],
                    # shown on the wall clock; kept on the monotonic one
                    "next_attempt": now + (float(r["next_attempt"]) - mono),
                    "age_seconds": round(mono - float(r["created"]), 3),
                    "last_error": redact(r["last_error"], secrets) if r["last_error"] else None,
                }
            )
        firing = []
        for r in self.outbox.firing():
            rec = loads(r["record"])
            firing.append(
                DeliveryFiring(
                    rule=rec["rule"],
                    severity=rec["severity"],
                    labels=rec["labels"],
                    since=rec["active_since"],
                    silenced_by=r["silenced"],
                )
            )
        deliveries = Deliveries(
            pending=self.pending(),
            state_problem=self.store.degraded,
            receivers=tuple(receivers),
            firing=tuple(firing),
            more={"durable": self.store.durable, "queue": queue},
        )
        silences = tuple(
            SilenceState.from_json(s.as_dict(now))
            for s in self.silences.all()
            if s.active(now) or now - s.end < 86400.0
        )
        drain = (
            DrainState.from_json(self.drain.summary(now))
            if self.drain is not None
            else DrainState(mode="none")
        )
        return ActionsState(deliveries=deliveries, silences=silences, drain=drain)
