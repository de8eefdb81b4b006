"""The drain hook: one drain per incident, after a grace period, within a rate limit.

An *incident* is one firing transition of a rule that asks for a drain (``drain=True``);
its key is that transition's idempotency key, so the same transition handed over twice
(a restart, a replay) is one incident. Incidents are rows in the outbox database, written
in the same transaction as the transition, so a restart neither forgets nor repeats one.

    pending --(grace over)--> drained | already | kept_admin | noted | dry_run
       |  ^                      \\--> rate_limited (page) | failed after N tries (page)
       |  \\-- over_budget: the fleet budget is spent (page once per window); asks again
       \\--(alert resolved first)--> cancelled

While an incident is pending the node shows ``drain_pending`` in status, metrics and the
health file (``drain.state_file``), and ``drain.notify_command`` runs once per drain (not
once per alert of a cascade). While an incident is active the node is held out of service
(``hold``, every ``drain.hold_interval``): if another owner resumes it, gpuwatchd drains it
again; if another owner drained it, gpuwatchd's reason is added next to theirs. Resume
(only with ``drain.resume``) waits until no drain incident is unresolved and
``resume_hold`` has passed since the last one resolved, and then only undoes a drain (or a
note) gpuwatchd owns. Dry-run counts exactly like the real run: after a "would drain", the
node counts as drained by gpuwatchd until a "would resume".
"""

from __future__ import annotations

import logging
import random
import sqlite3
import threading
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from gpuwatchd.actions.drain.drivers.base import (
    DrainError,
    DrainResult,
    Driver,
    Gate,
)
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
    hold_back,
    last_resolved,
    mark_done,
    mark_failed,
    mark_owned,
    mark_rate_limited,
    mark_resolved,
    next_pending_due,
    note,
    oldest_drain_since,
    open_incident,
    open_or_closed_since,
    pending_with_result,
    read_node_drain,
    schedule_retry,
    set_note,
    set_notified,
    silenced_active,
    to_announce,
    unsilence,
)
from gpuwatchd.actions.drain.notify import announce
from gpuwatchd.actions.drain.report import HealthFile, drain_families, incident_summary, node_state
from gpuwatchd.actions.drain.resume import RESUME_RESULTS, resume
from gpuwatchd.actions.fleet import (
    FleetBudget,
    FleetView,
    claimed_xids,
    correlated,
    xid_counts,
    xid_of_reason,
)
from gpuwatchd.actions.model import short_reason, xid_of
from gpuwatchd.actions.store import Store
from gpuwatchd.config.actions import DrainConfig
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.families import Families
from gpuwatchd.core.records import DrainOutcome, DrainOutcomeKind

# the logger keeps the name it had as one module (docs/config.md names it)
log = logging.getLogger("gpuwatchd.actions.drain")

PENDING = "pending"
# Incident states in which gpuwatchd holds (or may hold) the node drained.
DRAINED_STATES = ("drained", "already")
RESULTS = (
    "drained",
    "already",
    "kept_admin",
    "noted",
    "dry_run",
    "failed",
    "rate_limited",
    "over_budget",
    "cancelled",
)
OVER_BUDGET = "over_budget"
# the shipped rules that page on the drain's outcomes (rules/drain.yaml)
LIMIT_RULE = "GpuwatchdDrainLimitReached"
FAILED_RULE = "GpuwatchdDrainFailed"
RETRY_BASE = 5.0
RETRY_MAX = 300.0
RECHECK_MAX_FACTOR = 8.0  # a held-back incident asks at least every 8 x fleet.recheck


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
        base = min(RETRY_MAX, RETRY_BASE * 2.0 ** max(0, attempts - 1))
        return base * (0.5 + self.rng.random() / 2)

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
        for inc in due(self.store, PENDING, now):
            pages.extend(self._drain(inc, now))
        pages.extend(self._limit_alert(now))
        pages.extend(self._budget_resolved(now))
        self._hold(now)
        for inc in gave_up_since(self.store, self.cfg.attempts, now - 86400.0):
            pages.extend(self._failing_resolved(inc, now))
        for inc in failed_and_resolved(self.store):
            with self.store.tx() as conn:
                set_notified(conn, inc.key, 2)
            summary = f"the fault behind the failed drain of {self.node} has resolved"
            pages.append(self._outcome(DrainOutcomeKind.FAILED, False, inc, now, summary))
        if self.cfg.resume:
            self._resume(now)
        self.write_health(now)
        for outcome in pages:
            self.report(outcome)
        return self._next_due(now)

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

    def _meta(self, name: str) -> str | None:
        return note(self.store, name)

    @property
    def _pretend(self) -> bool:
        """Drains are not done, only said (dry-run; ``simulate``'s recording driver)."""
        return self.cfg.dry_run or bool(getattr(self.driver, "recording", False))

    def _dry_run_drained(self) -> str | None:
        """In dry-run (and ``simulate``): the reason of the drain gpuwatchd would hold now
        (None: none). A cascade's later alerts find it "already" drained, as the daemon
        does."""
        if not self._pretend:
            return None
        return self._meta("dry_run_drained") or None

    def _gate(self, reason: str) -> Gate | None:
        fleet = self.fleet
        if fleet is None:
            return None

        def gate() -> str | None:
            verdict = fleet.check(reason)
            return None if verdict.allowed else f"fleet drain budget spent: {verdict.detail}"

        return gate

    def _confirm(self, inc: Incident, result: DrainResult) -> DrainResult:
        """A drain of ours found without a record of it (a restart between the drain and
        writing it down): re-count; above the budget, release it at once. A release that
        fails is an error: the incident tries again, and re-counts again."""
        assert self.fleet is not None
        verdict = self.fleet.confirm()
        if verdict.allowed:
            return result
        try:
            released = self.driver.resume(inc.as_mapping(), False)
        except DrainError as exc:
            raise DrainError(
                f"over the fleet budget ({verdict.detail}), and the release failed: {exc}"
            ) from None
        if released.result == "resumed":
            try:
                self.fleet.released()
            except DrainError as exc:  # the claim expires by itself (CLAIM_TTL)
                log.warning("fleet budget: could not take %s's claim off: %s", self.node, exc)
        return DrainResult(
            OVER_BUDGET,
            f"fleet drain budget spent: released after the re-count ({released.result}): "
            f"{verdict.detail}",
        )

    def _drain(self, inc: Incident, now: float) -> list[DrainOutcome]:
        owned = read_node_drain(self.store)
        would = self._dry_run_drained()
        try:
            if owned.owned and not self.driver.reads_state:
                # The node is drained by gpuwatchd already (a cascade: XID 79, then GPU
                # lost): one drain per node, not one hook call per alert.
                result = DrainResult(
                    "already", f"node already drained by gpuwatchd ({owned.reason})"
                )
            elif would is not None:
                # Dry-run counts like the real run: the cascade's first alert "drained" it.
                result = DrainResult("already", f"node would be drained by gpuwatchd ({would})")
            elif self._window_count(now) >= self.cfg.max_drains:
                # Over the limit nothing may change; a driver that can read the node may
                # still find there is nothing to do (drained already, or by an admin).
                probe = (
                    self.driver.drain(inc.as_mapping(), inc.reason, True)
                    if self.driver.reads_state
                    else None
                )
                if probe is None or probe.counts:
                    return self._rate_limited(inc, now)
                result = probe
            else:
                result = self.driver.drain(
                    inc.as_mapping(), inc.reason, self.cfg.dry_run, gate=self._gate(inc.reason)
                )
                # "already" on a node gpuwatchd has no record of draining: it drained, then
                # stopped before writing it down (a crash, a restart); re-count now. A drain
                # made now was admitted by its claim before it was written.
                recount = result.result == "already" and not owned.owned
                if recount and self.fleet is not None:
                    result = self._confirm(inc, result)
        except DrainError as exc:
            self.last_error = str(exc)
            attempts = inc.attempts + 1
            if attempts >= self.cfg.attempts and xid_of(inc.record) is not None:
                return self._keep_trying(inc, now, attempts, exc)
            if attempts >= self.cfg.attempts:
                with self.store.tx() as conn:
                    mark_failed(conn, inc.key, attempts, str(exc), now)
                self._record("drain", inc, "failed", f"gave up after {attempts} attempts: {exc}")
                return [
                    self._outcome(
                        DrainOutcomeKind.FAILED,
                        True,
                        inc,
                        now,
                        f"gpuwatchd could not drain {self.node}: {exc}",
                    )
                ]
            with self.store.tx() as conn:
                schedule_retry(conn, inc.key, attempts, str(exc), now + self._backoff(attempts))
            log.warning("drain %s: attempt %d failed: %s", self.node, attempts, exc)
            return []
        pages = self._failing_resolved(inc, now)
        if result.result == OVER_BUDGET:
            return pages + self._over_budget(inc, now, result)
        self._held_times.pop(inc.key, None)
        self._hold_next = now + self.cfg.hold_interval
        with self.store.tx() as conn:
            drained_at = now if result.counts else None
            mark_done(conn, inc.key, result.result, result.detail, drained_at)
            if result.owns:
                mark_owned(conn, inc.reason, now, result.result)
            if self._pretend and result.result == "dry_run":
                set_note(conn, "dry_run_drained", inc.reason)
        self._record("drain", inc, result)
        return pages

    def _keep_trying(
        self, inc: Incident, now: float, attempts: int, exc: DrainError
    ) -> list[DrainOutcome]:
        """A drain for an XID is never given up: the scheduler being unreachable for a while
        (a restart, an outage) must not leave a node with a fatal XID in service. After
        ``attempts`` failures it pages once and goes on trying, at most every RETRY_MAX."""
        with self.store.tx() as conn:
            schedule_retry(conn, inc.key, attempts, str(exc), now + self._backoff(attempts))
        log.warning("drain %s: attempt %d failed (trying again): %s", self.node, attempts, exc)
        if attempts != self.cfg.attempts:
            return []
        self._record("drain", inc, "failed", f"{attempts} attempts failed, trying again: {exc}")
        with self.store.tx() as conn:
            set_note(conn, f"failing:{inc.key}", "firing")
        summary = (
            f"gpuwatchd could not drain {self.node} after {attempts} attempts and keeps "
            f"trying: {exc}"
        )
        return [self._outcome(DrainOutcomeKind.FAILED, True, inc, now, summary)]

    def _failing_resolved(self, inc: Incident, now: float) -> list[DrainOutcome]:
        """The drain that kept failing went through (or its fault ended): resolve its page."""
        if self._meta(f"failing:{inc.key}") != "firing":
            return []
        with self.store.tx() as conn:
            set_note(conn, f"failing:{inc.key}", "")
        summary = f"the drain of {self.node} that kept failing is no longer failing"
        return [self._outcome(DrainOutcomeKind.FAILED, False, inc, now, summary)]

    # -- the fleet budget -------------------------------------------------------------
    def _over_budget(self, inc: Incident, now: float, result: DrainResult) -> list[DrainOutcome]:
        """Not drained: the incident stays pending and asks again after ``recheck``."""
        first = not str(inc.result or "").startswith(OVER_BUDGET)
        # while the budget stays full, ask again less often (up to 8 times recheck), each
        # at a random moment of its interval, so held-back nodes do not ask in step
        held = 1 if first else self._held_times.get(inc.key, 1) + 1
        self._held_times[inc.key] = held
        wait = self.cfg.fleet.recheck * min(2.0 ** (held - 1), RECHECK_MAX_FACTOR)
        wait *= self.rng.uniform(0.75, 1.0)
        with self.store.tx() as conn:
            hold_back(conn, inc.key, f"{OVER_BUDGET}: {result.detail}", now + wait)
        if first:
            self._record("drain", inc, result)
        else:
            log.info("drain %s: still over the fleet budget: %s", self.node, result.detail)
        return self._budget_page(inc, now)

    def _budget_page(self, inc: Incident, now: float) -> list[DrainOutcome]:
        fleet = self.fleet
        if fleet is None or fleet.last is None:
            return []
        if fleet.last.tripped and self._meta("breaker_alert") != "firing":
            return self._breaker_page(inc, now)
        if fleet.last.stopped:
            return []  # the fleet is stopped: one page says so (the breaker's), not each node
        if self._meta("fleet_alert") == "firing":
            return []
        last = self._meta("fleet_page_at")
        every = self.cfg.fleet.window or self.cfg.window
        if last and now - float(last) < every:
            return []
        verdict = fleet.last
        drains = verdict.census.drains
        mine = xid_of_reason(inc.reason)
        # other nodes waiting for a place say which XID they want to drain for
        extra = claimed_xids(verdict.census, fleet.wall(), self.node)
        extra += [f"{self.node}|{mine}"] if mine else []
        xids = xid_counts(drains)
        xids.update(item.partition("|")[2] for item in extra)
        seen = ", ".join(f"XID {x} on {n}" for x, n in sorted(xids.items(), key=lambda p: -p[1]))
        drained = len([d for d in drains if d.node != self.node])
        summary = (
            f"fleet drain budget of {verdict.limit} nodes reached: {drained} drained by "
            f"gpuwatchd at the last count ({verdict.nodes} nodes known); not draining "
            f"{self.node} for {inc.reason}" + (f" (XIDs: {seen})" if seen else "")
        )
        notes: dict[str, str] = {"xids": seen, "drained_nodes": str(drained)}
        common = correlated(drains, self.cfg.fleet, fleet.wall(), extra)
        if common:
            xid, nodes = common[0]
            window = f"{self.cfg.fleet.correlate / 60:g}m"
            cause = (
                f"XID {xid} on {nodes} nodes within {window}: likely a software or driver event "
                f"(a driver or firmware roll-out, a shared job), not {nodes} hardware faults"
            )
            notes["likely_cause"] = cause
            summary += ". " + cause
        with self.store.tx() as conn:
            set_note(conn, "fleet_alert", "firing")
            set_note(conn, "fleet_page_at", repr(now))
        return [self._outcome(DrainOutcomeKind.OVER_BUDGET, True, None, now, summary, notes)]

    def _held_back(self) -> int:
        return pending_with_result(self.store, PENDING, OVER_BUDGET)

    def _breaker_page(self, inc: Incident, now: float) -> list[DrainOutcome]:
        """This node tripped the breaker (first of those that did): one page for the fleet,
        naming the XIDs and the share of nodes that wanted to drain."""
        fleet = self.fleet
        assert fleet is not None and fleet.last is not None
        verdict = fleet.last
        census = verdict.census
        mine = xid_of_reason(inc.reason)
        extra = claimed_xids(census, fleet.wall(), self.node)
        extra += [f"{self.node}|{mine}"] if mine else []
        xids = xid_counts(d for d in census.drains if d.node != self.node)
        xids.update(item.partition("|")[2] for item in extra)
        wanting = len({d.node for d in census.drains} | {i.partition("|")[0] for i in extra})
        share = 100.0 * wanting / max(1, verdict.nodes)
        seen = ", ".join(f"XID {x} on {n}" for x, n in sorted(xids.items(), key=lambda p: -p[1]))
        summary = (
            f"fleet drain breaker tripped: {wanting} of {verdict.nodes} nodes ({share:.0f} %) "
            f"want to drain at once, above the budget of {verdict.limit}"
            + (f" ({seen})" if seen else "")
            + "; gpuwatchd drains no more nodes until an operator runs `gpuwatchd fleet reset`"
        )
        notes = {"xids": seen, "nodes_wanting": str(wanting), "share_percent": f"{share:.1f}"}
        with self.store.tx() as conn:
            set_note(conn, "breaker_alert", "firing")
        return [self._outcome(DrainOutcomeKind.BREAKER_OPEN, True, None, now, summary, notes)]

    def _budget_resolved(self, now: float) -> list[DrainOutcome]:
        out: list[DrainOutcome] = []
        fleet = self.fleet
        if self._meta("breaker_alert") == "firing" and (
            not self._held_back() or (fleet and fleet.last and not fleet.last.stopped)
        ):
            with self.store.tx() as conn:
                set_note(conn, "breaker_alert", "")
            summary = "the fleet drain breaker was reset: gpuwatchd drains again"
            out.append(self._outcome(DrainOutcomeKind.BREAKER_OPEN, False, None, now, summary))
        if self._meta("fleet_alert") != "firing" or self._held_back():
            return out
        with self.store.tx() as conn:
            set_note(conn, "fleet_alert", "")
        summary = f"no drain of {self.node} waits for the fleet drain budget any more"
        return [*out, self._outcome(DrainOutcomeKind.OVER_BUDGET, False, None, now, summary)]

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
        step = hold(self.store, self.driver, now, inc, self._gate(inc.reason))
        if step.error is not None:
            self.last_error = step.error
            self._record("hold", inc, "failed", step.error)
        elif step.result is not None:
            self._record("hold", inc, step.result)

    def _rate_limited(self, inc: Incident, now: float) -> list[DrainOutcome]:
        self.rate_limited += 1
        with self.store.tx() as conn:
            limited = f"{self.cfg.max_drains} drains in {self.cfg.window:g}s already"
            mark_rate_limited(conn, inc.key, limited, now)
        self._record(
            "drain",
            inc,
            "rate_limited",
            f"limit of {self.cfg.max_drains} drains per {self.cfg.window:g}s reached; not draining",
        )
        return self._fire_limit(inc, now)

    def _outcome(
        self,
        kind: DrainOutcomeKind,
        holds: bool,
        inc: Incident | None,
        now: float,
        summary: str,
        notes: dict[str, str] | None = None,
    ) -> DrainOutcome:
        """An outcome (or its end) for the rule stage, which decides whether it pages
        (``rules/drain.yaml``). A failed drain is one per incident and names its GPU."""
        gpu: int | None = None
        uuid = pci = None
        if inc is not None:
            src = inc.record.get("labels") or {}
            text = str(src.get("gpu", ""))
            gpu = int(text) if text.isdigit() else None
            uuid = str(src["uuid"]) if src.get("uuid") else None
            pci = str(src["pci_bus_id"]) if src.get("pci_bus_id") else None
        if kind is DrainOutcomeKind.LIMIT_REACHED:
            with self.store.tx() as conn:
                set_note(conn, "limit_alert", "firing" if holds else "")
        return DrainOutcome(
            timestamp=now,
            kind=kind,
            node=self.node,
            holds=holds,
            key=inc.key if inc is not None and kind is DrainOutcomeKind.FAILED else "",
            reason=inc.reason if inc is not None else "",
            summary=summary,
            counts=MappingProxyType(dict(notes or {})),
            gpu=gpu,
            uuid=uuid,
            pci_bus_id=pci,
        )

    def _fire_limit(self, inc: Incident, now: float) -> list[DrainOutcome]:
        if self._meta("limit_alert") == "firing":
            return []
        summary = (
            f"drain limit reached on {self.node}: {self.cfg.max_drains} drains within "
            f"{self.cfg.window:g}s; not draining for {inc.reason}"
        )
        t = self._outcome(DrainOutcomeKind.LIMIT_REACHED, True, None, now, summary)
        return [t]

    def _limit_alert(self, now: float) -> list[DrainOutcome]:
        if self._meta("limit_alert") != "firing" or self._window_count(now) >= self.cfg.max_drains:
            return []
        return [
            self._outcome(
                DrainOutcomeKind.LIMIT_REACHED,
                False,
                None,
                now,
                f"drain limit on {self.node} has room again",
            )
        ]

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
            "fleet": self._fleet_summary(),
            "incidents": [incident_summary(i) for i in incidents],
        }

    def _fleet_summary(self) -> dict[str, Any] | None:
        if self.fleet is None:
            return None
        last = self.fleet.last
        return {
            "max_nodes": self.cfg.fleet.max_nodes,
            "max_percent": self.cfg.fleet.max_percent,
            "held_back": self._held_back(),
            "budget": last.limit if last else None,
            "drained": last.count if last else None,
            "nodes": last.nodes if last else None,
        }

    def write_health(self, now: float) -> None:
        self.health.path = self.cfg.state_file  # a reload may have moved it
        if self.health.path is not None:
            self.health.write(self.summary(now), now)

    def families(self, fams: Families, now: float) -> None:
        with self._count_lock:
            counts = sorted(self.actions.items())
        drain_families(fams, self.summary(now), counts, self.rate_limited)
