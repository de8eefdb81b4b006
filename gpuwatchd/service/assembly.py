"""The composition root: one place that builds a node's whole pipeline.

``Node(config, clock, backend, wiring)`` builds the node state, the rule engine, the
actions (outbox, receivers, drain), the XID intake (kernel log, NVML events, incident
merger), the hand-off between them and the metrics renderer, for every way gpuwatchd
runs: ``run`` and ``demo`` drive it with threads (``service.daemon.Daemon``), ``simulate``
and ``rules test`` step it on a virtual clock (``harness.simulate.Simulation``). Only the
clock, the backend and the ``Wiring`` differ, so a backtest behaves as production does
(``gpus.ignore`` included).

Nothing here starts a thread; the runners do.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuwatchd import __version__
from gpuwatchd.config.stages import ActionsSettings
from gpuwatchd.configfile.loader import Config
from gpuwatchd.configfile.stages import for_actions, for_rules
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import Clock
from gpuwatchd.core.errors import BackendError
from gpuwatchd.core.families import Families
from gpuwatchd.core.fieldcheck import FieldCheck, field_status
from gpuwatchd.core.fields import decode_clock_event_reasons
from gpuwatchd.core.health import HEALTH_STATES, firing_by_gpu, gpu_health
from gpuwatchd.core.nodestate import GpuState, NodeState, NodeView
from gpuwatchd.core.records import GpuInfo, GpuStatus
from gpuwatchd.core.reloading import Prepared, RestartOnly, SectionOwner
from gpuwatchd.core.statehealth import StoreHealth, state_families
from gpuwatchd.core.statusdoc import (
    ActionsState,
    FiringAlert,
    GpuEntry,
    SourceEntry,
    StatusDocument,
)
from gpuwatchd.exposition.metrics import GPU_LABELS, MetricsRenderer, gpu_label_text
from gpuwatchd.rules.stage import SIMULATE_BOOT_ID, RulesStage, rules_stage
from gpuwatchd.service.handoff import Handoff, Record
from gpuwatchd.service.pipeline import Pipeline, Stage
from gpuwatchd.sources.gpu.backend import Backend, SupervisedBackend
from gpuwatchd.sources.gpu.poller import Poller
from gpuwatchd.sources.intake import XidIntake

if TYPE_CHECKING:  # actions (and httpx) load only when a config has receivers or a drain
    import httpx

    from gpuwatchd.actions import ActionsSink

log = logging.getLogger(__name__)

Recorder = Callable[[dict[str, Any]], None]
ExtraFamilies = Callable[[NodeView, Families], None]

STATUS_FIELDS = (
    "temperature_gpu",
    "temperature_memory",
    "power",
    "sm_clock",
    "utilization_gpu",
    "ecc_corrected_volatile",
    "ecc_uncorrected_volatile",
    "ecc_corrected_aggregate",
    "ecc_uncorrected_aggregate",
    "remapped_rows_pending",
    "remapped_rows_failure",
    "pcie_replay",
    "pcie_link_generation",
    "pcie_link_width",
    "compute_processes",
    "recovery_action",
)


@dataclass(frozen=True)
class Wiring:
    """What differs between ``run``, ``demo``, ``simulate`` and ``rules test``; nothing else
    does.

    - ``durable``: alert states, the outbox and kernel-log positions live in ``state_dir``
      (``run``); otherwise in memory.
    - ``threaded``: actions deliver on their own worker thread (``run``, ``demo``); else
      the stepping loop calls ``run_pending`` (``simulate``).
    - ``record``: pages and drains are handed to this function instead of being sent or
      executed (``demo``, ``simulate``); ``send_recorded`` still sends the pages
      (``simulate --send``), drains never run.
    - ``rules``: a rule stage built elsewhere (rule unit tests bring their own rule set);
      by default the config's rules.
    """

    durable: bool = True
    threaded: bool = True
    record: Recorder | None = None
    send_recorded: bool = False
    actions_db: str | None = None  # where a non-durable outbox lives (default: memory)
    transport: httpx.BaseTransport | None = None
    environ: Mapping[str, str] | None = None
    rules: Stage | None = None
    extra_stages: tuple[Stage, ...] = ()
    extra_families: tuple[ExtraFamilies, ...] = field(default_factory=tuple)


@dataclass
class WithoutActions:
    """The owner of ``receivers``, ``routing`` and ``drain`` in a daemon started without
    any action: turning one on takes a restart (the actions stage was never built)."""

    running: ActionsSettings
    sections: tuple[str, ...] = ("receivers", "routing", "drain")

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        if not dataclasses.replace(self.running, **new).wanted:
            return Prepared()
        why = "the daemon started without receivers or drain; a restart turns them on"
        return Prepared(refused={key: why for key in changed})


def filter_ignored(infos: list[GpuInfo], ignore: tuple[str, ...]) -> list[GpuInfo]:
    skip = {s.upper() for s in ignore}
    return [i for i in infos if i.uuid.upper() not in skip and i.pci_bus_id.upper() not in skip]


def gpu_status_dict(g: GpuState) -> dict[str, Any]:
    out: dict[str, Any] = {
        **g.info.as_dict(),
        "status": g.status.value,
        "status_since": g.status_since,
        "last_success": g.last_success,
    }
    if g.sample is not None:
        fields = g.sample.fields
        readings = {k: fields[k] for k in STATUS_FIELDS if k in fields}
        if g.status is GpuStatus.OK:
            out["readings"] = readings
            mask = fields.get("clock_event_reasons")
            if mask is not None:
                out["clock_event_reasons"] = decode_clock_event_reasons(int(mask))
            down = [ls.link for ls in g.sample.links if ls.fields.get("nvlink_up") == 0.0]
            out["nvlink_links_down"] = down
        else:  # never shown as current: what the GPU said before it stopped answering
            out["last_readings"] = readings
            out["last_readings_at"] = g.sample.timestamp
    return out


def build_node_actions(
    config: Config, clock: Clock, wiring: Wiring, handoff: Handoff
) -> ActionsSink | None:
    """The actions stage for this wiring, or None when nothing is configured to receive.
    The drain's outcomes go onto ``handoff`` for the rule stage to judge."""
    settings = for_actions(config)
    if not settings.wanted:
        return None
    from gpuwatchd.actions import build_actions, build_recording_actions

    if wiring.record is None and wiring.durable:
        return build_actions(
            settings,
            clock,
            transport=wiring.transport,
            environ=wiring.environ,
            report=handoff.put,
        )
    import random

    return build_recording_actions(
        settings,
        clock,
        wiring.record,
        send=wiring.send_recorded,
        transport=wiring.transport,
        environ=wiring.environ,
        db_path=wiring.actions_db or ":memory:",
        rng=random.Random(0),
        report=handoff.put,
    )


class Node:
    """One node's pipeline: sources feed the hand-off, the rule engine judges, actions leave."""

    def __init__(
        self, config: Config, clock: Clock, backend: Backend, wiring: Wiring | None = None
    ) -> None:
        wiring = wiring or Wiring()
        self.config = config
        self.clock = clock
        self.backend = backend
        self.wiring = wiring
        self.state = NodeState(config.node_name, clock.now(), config.gpus.expected)
        self.rules: Stage = wiring.rules or rules_stage(
            for_rules(config), clock, durable=wiring.durable
        )
        handoff = Handoff()
        self.actions = build_node_actions(config, clock, wiring, handoff)
        self.pipeline = Pipeline(
            [self.rules, *wiring.extra_stages],
            [self.actions] if self.actions else [],
            handoff=handoff,
        )
        if self.actions is not None and isinstance(self.rules, RulesStage):
            self.actions.use_current(self.rules.engine.current)
        self.listeners: list[Callable[[Record], None]] = []
        self.xids = XidIntake(
            config.sources,
            config.poll.interval,
            config.state_dir if wiring.durable else None,
            backend,
            clock,
            self.state,
            self,
        )
        self.renderer = MetricsRenderer.for_config(
            self.state.view,
            config.metrics,
            (
                self.pipeline.families,
                self._input_families,
                self._health_families,
                *wiring.extra_families,
            ),
            config.fields,
        )
        self.fieldcheck = FieldCheck(config.fields)
        self.infos: list[GpuInfo] = []
        if isinstance(backend, SupervisedBackend):
            backend.set_status(self.source_status)

    def owners(self) -> list[SectionOwner]:
        """Who applies each config section this node was built from at a reload, or says
        that only a restart can (the daemon adds the HTTP server's and the log's)."""
        owners: list[SectionOwner] = [
            RestartOnly(
                ("node_name", "state_dir"), "the node's name and state files are set at start"
            ),
            RestartOnly(
                ("backend", "poll", "gpus", "fields"),
                "the GPU backend, its poll batches and the GPU list are built at start",
            ),
            RestartOnly(("metrics",), "the metrics renderer is built at start"),
            self.xids,
        ]
        if isinstance(self.rules, RulesStage):
            owners.append(self.rules)
        else:
            owners.append(RestartOnly(("rules", "xid"), "the rule set was given at start"))
        if self.wiring.record is None and self.actions is not None:
            from gpuwatchd.actions.reload import ActionsOwner

            owners.append(
                ActionsOwner(self.actions, for_actions(self.config), environ=self.wiring.environ)
            )
        elif self.wiring.record is None:  # the actions package (httpx) stays unloaded
            owners.append(WithoutActions(for_actions(self.config)))
        else:
            owners.append(
                RestartOnly(("receivers", "routing", "drain"), "this run records pages and drains")
            )
        return owners

    # -- sources -------------------------------------------------------------------------
    def open_gpus(self) -> bool:
        """Open the backend; on failure the nvml source is down and False is returned."""
        try:
            infos = self.backend.open()
        except BackendError as exc:
            self.source_status("nvml", False, str(exc))
            log.error("GPU backend %s unavailable: %s", self.backend.name, exc)
            return False
        self.infos = filter_ignored(infos, self.config.gpus.ignore)
        self.xids.set_gpus(infos)
        self.state.set_gpus(self.infos, self.clock.now())
        log.info(
            "backend %s: %d GPU(s): %s",
            self.backend.name,
            len(self.infos),
            ", ".join(f"{i.index}={i.pci_bus_id}" for i in self.infos),
        )
        return True

    def poller(self, interval: float, call_timeout: float) -> Poller:
        return Poller(
            self.backend, self.infos, self.state, self.clock, interval, call_timeout, self.emit
        )

    def emit(self, record: Record) -> None:
        """Every record from every source passes here: to the rule engine's hand-off and
        to the listeners (the demo's narrator, simulate's printer)."""
        self.pipeline.observe(record)
        for listener in self.listeners:
            listener(record)

    def source_status(self, name: str, up: bool, detail: str) -> None:
        self.state.source(name, up=up, now=self.clock.now(), detail=detail)

    def set_pci_gpus(self, count: int | None) -> None:
        """The PCI watcher's count of NVIDIA GPUs on the bus; a change is judged at once."""
        self.state.set_pci_gpus(count)
        self.pipeline.handoff.wake()

    # -- judging -------------------------------------------------------------------------
    def evaluate(self) -> None:
        view = self.state.view()
        self.pipeline.evaluate(self.clock.now(), view)
        self.fieldcheck.check(view)  # a configured field no GPU answers: logged once
        self.state.touch()

    # -- reading -------------------------------------------------------------------------
    def _input_families(self, view: NodeView, fams: Families) -> None:
        self.xids.families(fams)
        if isinstance(self.backend, SupervisedBackend):
            self.backend.families(fams)
        state_families(fams, self.state_health())

    def _health_families(self, view: NodeView, fams: Families) -> None:
        """Each GPU's health verdict (the one ``status`` and ``check`` show) as a state set."""
        fam = fams.get(
            "gpuwatchd_gpu_health",
            "gauge",
            "The GPU's health as a state set: ok; degraded (a ticket fires on it); failing "
            "(a page fires on it); lost, stale or error (it does not answer). The verdict "
            "that gpuwatchd status, gpuwatchd check and the status API show.",
            [*GPU_LABELS, "health"],
        )
        by_gpu = firing_by_gpu(self.firing())
        for g in view.gpus:
            verdict = gpu_health(g.status.value, by_gpu.get(str(g.info.index), ()))
            base = gpu_label_text(g.info)
            for state in HEALTH_STATES:
                fam.add_text(f'{base},health="{state}"', 1.0 if verdict.health == state else 0.0)

    def state_health(self) -> list[StoreHealth]:
        """The rule engine's store and the kernel-log position (the outbox reports its own)."""
        out = []
        if isinstance(self.rules, RulesStage):
            store = self.rules.engine.store
            if store.boot_id != SIMULATE_BOOT_ID:  # in memory on purpose (demo, simulate)
                out.append(store.health())
        position = self.xids.state_health()
        if position is not None:
            out.append(position)
        return out

    def firing(self) -> list[dict[str, Any]]:
        """The alerts firing now, from the rule engine (whatever receivers exist)."""
        if not isinstance(self.rules, RulesStage):
            return []
        return [
            {
                "rule": a.rule,
                "severity": a.severity.value,
                "labels": dict(a.labels),
                "since": a.active_since,
                "value": a.value,
                "summary": a.annotations.get("summary"),
                "fingerprint": a.fingerprint,
                "fired_at": a.fired_at,
                "annotations": dict(a.annotations),
            }
            for a in self.rules.engine.alerts(AlertState.FIRING)
        ]

    def status_document(self) -> StatusDocument:
        """The node's status, built here and only here (``core.statusdoc``): the status
        API, the status socket, ``gpuwatchd status`` and the status page all show it."""
        view = self.state.view()
        now = self.clock.now()
        firing = self.firing()
        if isinstance(self.rules, RulesStage):  # what the trend rules judged, for the page
            for alert in firing:
                judged = self.rules.engine.history(alert["rule"], alert["fingerprint"])
                if judged is not None:
                    alert["history"] = judged
        by_gpu = firing_by_gpu(firing)
        gpus = []
        for g in view.gpus:
            d = gpu_status_dict(g)
            if g.sample is not None:
                d["readings_age_seconds"] = round(now - g.sample.timestamp, 3)
            health = gpu_health(g.status.value, by_gpu.get(str(g.info.index), ()))
            gpus.append(dataclasses.replace(GpuEntry.from_json(d), health=health))
        actions = self.actions.status() if self.actions else ActionsState()
        return StatusDocument(
            node=view.node_name,
            version=__version__,
            backend=self.backend.name,
            now=now,
            started_at=view.started_at,
            gpus=tuple(gpus),
            gpus_expected=view.expected_gpus,
            sources={
                k: SourceEntry.from_json(v.as_dict()) for k, v in sorted(view.sources.items())
            },
            xid_counts=tuple(
                {"gpu": gpu, "xid": xid, "count": n}
                for (gpu, xid), n in sorted(
                    view.xid_counts.items(), key=lambda kv: (kv[0][0] or -1, kv[0][1])
                )
            ),
            alerts=tuple(FiringAlert.from_json(a) for a in firing),
            nvml_worker=(
                self.backend.health() if isinstance(self.backend, SupervisedBackend) else None
            ),
            # the config's extra field ids, and the GPUs that lack them
            fields=field_status(view, self.config.fields) if self.config.fields else None,
            actions=actions,  # pending deliveries, silences, drain state
        )

    def status(self) -> dict[str, Any]:
        return self.status_document().as_json()

    def close(self) -> None:
        self.pipeline.close()
        try:
            self.backend.close()
        except BackendError as exc:  # pragma: no cover - shutdown best effort
            log.warning("closing backend: %s", exc)
