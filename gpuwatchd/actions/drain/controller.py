"""The drain hook: one drain per incident, after a grace period, within a rate limit.

An *incident* is one firing transition of a rule that asks for a drain (``drain=True``);
its key is that transition's idempotency key, so the same transition handed over twice
(a restart, a replay) is one incident. Incidents are rows in the outbox database, written
in the same transaction as the transition, so a restart neither forgets nor repeats one.

The controller opens and cancels incidents (inside the outbox transaction) and, on the
drain thread, decides what is due: each due incident takes one step of the state machine
(``machine.py``: its states and transitions), the node is held out of service
(``hold.py``) and resumed (``resume.py``), and ``drain.notify_command`` announces a
pending drain once per drain (``notify.py``). It counts and logs what the steps did,
hands their outcomes to the rule stage, and reports (``report.py``): while an incident
is pending the node shows ``drain_pending`` in status, metrics and the health file
(``drain.state_file``). Dry-run counts exactly like the real run: after a "would drain",
the node counts as drained by gpuwatchd until a "would resume".
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver
from gpuwatchd.actions.drain.hold import HOLD_RESULTS, held, hold, to_hold
from gpuwatchd.actions.drain.incidents import (
    Incident,
    cancel_pending,
    drained_since,
    due,
    ensure_node_drain,
    failed_and_resolved,
    gave_up_since,
    has_note,
    last_resolved,
    mark_resolved,
    next_pending_due,
    oldest_drain_since,
    open_incident,
    open_or_closed_since,
    read_node_drain,
    set_notified,
    silenced_active,
    to_announce,
    unsilence,
)
from gpuwatchd.actions.drain.machine import (
    PENDING,
    RESULTS,
    Drive,
    Step,
    backoff,
    drain_step,
    dry_run_drained,
    failing_resolved,
    gate_for,
)
from gpuwatchd.actions.drain.notify import announce
from gpuwatchd.actions.drain.pages import budget_resolved, held_back, limit_room, outcome
from gpuwatchd.actions.drain.report import (
    HealthFile,
    drain_families,
    fleet_summary,
    incident_summary,
    node_state,
)
from gpuwatchd.actions.drain.resume import RESUME_RESULTS, resume
from gpuwatchd.actions.fleet import FleetBudget, FleetView
from gpuwatchd.actions.model import short_reason
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.records import DrainOutcome, DrainOutcomeKind

# the logger keeps the name it had as one module (docs/config.md names it)
log = logging.getLogger("gpuwatchd.actions.drain")

# the shipped rules that page on the drain's outcomes (rules/drain.yaml)
LIMIT_RULE = "GpuwatchdDrainLimitReached"
FAILED_RULE = "GpuwatchdDrainFailed"


class DrainController:
    def __init__(
        self,
        cfg: DrainConfig,
        node: str,
        store: Store,
        clock: Clock,
        driver: Driver,
        *,
        report: Callable[[DrainOutcome], None],
        rng: random.Random | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
        run_notify: bool = True,
        fleet: FleetBudget | None = None,
        silenced_by: Callable[[dict[str, Any], float], str | None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.node = node
        self.store = store
        self.clock = clock
        self.driver = driver
        self.report = report  # the outcomes go to the rule stage (the hand-off)
        self.rng = rng or random.Random()
        self.on_record = on_record
        self.run_notify = run_notify
        self.actions: dict[tuple[str, str], int] = {
            **{("drain", r): 0 for r in RESULTS},
            **{("resume", r): 0 for r in RESUME_RESULTS},
            **{("hold", r): 0 for r in HOLD_RESULTS},
        }
        self.silenced_by = silenced_by  # a silence lets an operator keep the node in service
        self._given_fleet = fleet
        self._fleet: FleetBudget | None = None
        self._fleet_for: tuple[Driver, Any, str] | None = None
        self._hold_next = 0.0
        self._held_times: dict[str, int] = {}  # incident -> checks in a row over the budget
        self.rate_limited = 0
        self._count_lock = threading.Lock()  # counters move on the drain and the submit thread
        self.health = HealthFile(cfg.state_file)
        self.last_error: str | None = None
        with store.tx() as conn:
            ensure_node_drain(conn)

    @property
    def fleet(self) -> FleetBudget | None:
        """The fleet budget for the current settings and driver (a reload may change
        both: it is built again then)."""
        if self._given_fleet is not None:
            return self._given_fleet
        key = (self.driver, self.cfg.fleet, self.node)
        old = self._fleet_for
        if old is None or old[0] is not key[0] or old[1:] != key[1:]:
            self._fleet_for = key
            self._fleet = None
            if self.cfg.fleet.enabled:
                make: Callable[[Any], FleetView] | None = getattr(self.driver, "fleet_view", None)
                if make is not None:
                    self._fleet = FleetBudget(self.cfg.fleet, make(self.cfg.fleet), self.node)
                else:
                    log.error(
                        "drain.fleet: the %s drain mode cannot count the fleet", self.driver.mode
                    )
        return self._fleet

    # -- called inside the outbox transaction ------------------------------------------
    def grace_for(self, rec: dict[str, Any]) -> float:
        from gpuwatchd.config.actions import parse_duration_text

        ann = (rec.get("annotations") or {}).get("drain_grace")
        if ann is not None:
            seconds = parse_duration_text(str(ann))
            if seconds is not None:
                return seconds
            log.warning("rule %s: drain_grace annotation %r is not a duration", rec["rule"], ann)
        return self.cfg.rule_grace.get(str(rec["rule"]), self.cfg.grace)

    def admit(
        self, conn: sqlite3.Connection, rec: dict[str, Any], silenced: str | None, now: float
    ) -> None:
        """A firing transition of a drain rule: open its incident (once)."""
        grace = self.grace_for(rec)
        state = "silenced" if silenced else PENDING
        # with a fleet budget the first check waits a random moment: a fault seen by every
        # node in the same second reaches the scheduler spread out (docs/fleet.md)
        jitter = self.rng.uniform(0.0, self.cfg.fleet.jitter) if self.cfg.fleet.enabled else 0.0
        opened = open_incident(
            conn,
            rec,
            short_reason(rec),
            state,
            now,
            drain_at=now + grace,
            closed=now if silenced else None,
            next_attempt=now + grace + jitter,
        )
        if opened and silenced:
            log.warning("drain for %s not done: silenced by %s", short_reason(rec), silenced)

    def resolved(self, conn: sqlite3.Connection, fingerprint: str, now: float) -> None:
        cancelled = cancel_pending(conn, fingerprint, PENDING, now)
        if cancelled:  # the alert cleared within its grace: no drain
            with self._count_lock:
                self.actions[("drain", "cancelled")] += cancelled
            log.warning("drain of %s cancelled: the alert resolved within the grace", self.node)
        mark_resolved(conn, fingerprint, now)

    # -- the drain worker ------------------------------------------------------------
    def _backoff(self, attempts: int) -> float:
        return backoff(self.rng, attempts)

    def _window_count(self, now: float) -> int:
        return drained_since(self.store, now - self.cfg.window)

    def _record(
        self, action: str, inc: Incident | None, result: DrainResult | str, detail: str = ""
    ) -> None:
        name = result.result if isinstance(result, DrainResult) else result
        text = result.detail if isinstance(result, DrainResult) else detail
        with self._count_lock:
            self.actions[(action, name)] = self.actions.get((action, name), 0) + 1
        how = self.driver.mode + (", dry run" if self.cfg.dry_run else "")
        msg = f"{action} {self.node} ({how}): {name}: {text}"
        if name in ("failed", "rate_limited"):
            log.error("%s", msg)
        else:
            log.warning("%s", msg)
        if self.on_record is not None:
            out: dict[str, Any] = {
                "record": "drain",
                "action": action,
                "mode": self.driver.mode,
                "node": self.node,
                "result": name,
                "detail": text,
                "dry_run": self.cfg.dry_run,
            }
            if inc is not None:
                out["incident"] = inc.key
                out["reason"] = inc.reason
            self.on_record(out)

    def step(self, now: float) -> float | None:
        """Do what is due; returns when there is more to do (None: nothing scheduled)."""
        pages: list[DrainOutcome] = []
        self._unsilence(now)
        for inc in to_announce(self.store, PENDING):
            self._notify(inc)
        self._hold(now)  # first: a held incident it reopens is due in this step
        for inc in due(self.store, PENDING, now):
            pages.extend(self._drain(inc, now))
        pages.extend(limit_room(self.store, self.cfg, self.node, now))
        pages.extend(budget_resolved(self.store, self.node, self.fleet, now))
        for inc in gave_up_since(self.store, self.cfg.attempts, now - 86400.0):
            pages.extend(failing_resolved(self.store, self.node, inc, now))
        for inc in failed_and_resolved(self.store):
            with self.store.tx() as conn:
                set_notified(conn, inc.key, 2)
            summary = f"the fault behind the failed drain of {self.node} has resolved"
            pages.append(outcome(self.node, DrainOutcomeKind.FAILED, False, inc, now, summary))
        if self.cfg.resume:
            self._resume(now)
        self.write_health(now)
        for page in pages:
            self.report(page)
        return self._next_due(now)

    def _drain(self, inc: Incident, now: float) -> tuple[DrainOutcome, ...]:
        """One step of the state machine for the due ``inc``; count and log what it did."""
        drive = Drive(
            self.cfg, self.node, self.store, self.driver, self.fleet, self.rng, self._pretend
        )
        step: Step = drain_step(drive, inc, now, self._held_times.get(inc.key, 0))
        if step.error is not None:
            self.last_error = step.error
        if step.rate_limited:
            self.rate_limited += 1
        if step.held:
            self._held_times[inc.key] = step.held
        if step.done:
            self._held_times.pop(inc.key, None)
            self._hold_next = now + self.cfg.hold_interval
        if step.result:
            self._record("drain", inc, step.result, step.detail)
        return step.outcomes

    def _unsilence(self, now: float) -> None:
        """A drain a silence held back, whose alert still fires once no silence covers it
        any more: it is due now (after its grace, counted from now)."""
        if self.silenced_by is None:
            return
        for inc in silenced_active(self.store):
            if self.silenced_by(inc.record, now) is not None:
                continue
            with self.store.tx() as conn:
                unsilence(conn, inc.key, PENDING, now + self.grace_for(inc.record))
            log.warning("drain for %s: the silence is over and it still fires", inc.reason)

    def _notify(self, inc: Incident) -> None:
        announce(
            self.store,
            inc,
            self.node,
            self.cfg,
            pending=PENDING,
            pretend_drained=self._dry_run_drained() is not None,
            run=self.run_notify,
        )

    @property
    def _pretend(self) -> bool:
        """Drains are not done, only said (dry-run; ``simulate``'s recording driver)."""
        return self.cfg.dry_run or bool(getattr(self.driver, "recording", False))

    def _dry_run_drained(self) -> str | None:
        return dry_run_drained(self.store, self._pretend)

    # -- holding the node out of service ---------------------------------------------
    def _held(self) -> list[Incident]:
        return held(self.store)

    def _hold(self, now: float) -> None:
        """While a drain incident is active, keep the node out of service whoever else
        drained or resumed it (slurm, kubernetes; not in dry-run): ``hold.py``."""
        if not self.driver.reads_state or self.cfg.dry_run or now < self._hold_next:
            return
        inc = to_hold(self.store, now, self.silenced_by)
        if inc is None:
            return
        self._hold_next = now + self.cfg.hold_interval
        step = hold(self.store, self.driver, now, inc, gate_for(self.fleet, inc.reason))
        if step.error is not None:
            self.last_error = step.error
            self._record("hold", inc, "failed", step.error)
        elif step.result is not None:
            self._record("hold", inc, step.result)

    def _resume(self, now: float) -> None:
        """Undo gpuwatchd's drain once no drain incident is unresolved and the hold is
        over: ``resume.py``."""
        step = resume(
            self.store,
            self.driver,
            now,
            self.cfg,
            pretend_drained=self._dry_run_drained() is not None,
            backoff=self._backoff,
        )
        if step is None:
            return
        if step.error is not None or step.result is None:
            self.last_error = step.error
            self._record("resume", step.incident, "failed", step.error or "")
            return
        self._record("resume", step.incident, step.result)
        if self.fleet is not None and step.result.result == "resumed":
            try:
                self.fleet.released()
            except DrainError as exc:  # the place expires by itself (docs/fleet.md)
                log.warning("fleet budget: could not give back %s's place: %s", self.node, exc)

    def _next_due(self, now: float) -> float | None:
        times: list[float] = []
        due = next_pending_due(self.store, PENDING)
        if due is not None:
            times.append(due)
        if self.cfg.resume:
            last = last_resolved(self.store)
            if last is not None:
                times.append(max(last + self.cfg.resume_hold, now + 1.0))
        if self.driver.reads_state and not self.cfg.dry_run and self._held():
            times.append(max(self._hold_next, now + 1.0))
        if has_note(self.store, "limit_alert") and self.cfg.window:
            oldest = oldest_drain_since(self.store, now - self.cfg.window)
            if oldest is not None:
                times.append(float(oldest) + self.cfg.window)
        return min(times) if times else None

    # -- the report: status, metrics and the health file (report.py) -----------------
    def summary(self, now: float) -> dict[str, Any]:
        node = read_node_drain(self.store)
        incidents = open_or_closed_since(self.store, now - 86400.0)
        pending = [i for i in incidents if i.state == PENDING]
        return {
            "mode": self.driver.mode,
            "dry_run": self.cfg.dry_run,
            "node": self.node,
            "state": node_state(node, pending),
            "drain_at": min((i.drain_at for i in pending), default=None),
            "reason": (pending[0].reason if pending else node.reason) or None,
            "owned": node.owned,
            "drains_in_window": self._window_count(now),
            "max_drains": self.cfg.max_drains,
            "window_seconds": self.cfg.window,
            "last_error": self.last_error,
            "fleet": fleet_summary(self.cfg.fleet, self.fleet, held_back(self.store)),
            "incidents": [incident_summary(i) for i in incidents],
        }

    def write_health(self, now: float) -> None:
        self.health.path = self.cfg.state_file  # a reload may have moved it
        if self.health.path is not None:
            self.health.write(self.summary(now), now)

    def families(self, fams: Families, now: float) -> None:
        with self._count_lock:
            counts = sorted(self.actions.items())
        drain_families(fams, self.summary(now), counts, self.rate_limited)
