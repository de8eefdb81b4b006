"""A small scripted node for rule engine tests: real Engine, NodeState and StateStore,
samples written by hand, time on a VirtualClock. No threads, no scenario files."""

from __future__ import annotations

import textwrap
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

from gpuwatchd.core.alerts import AlertState, AlertTransition
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.families import Families
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import GpuInfo, GpuSample, GpuStatus, LinkSample, ProcessInfo, XidEvent
from gpuwatchd.rules.engine import Engine
from gpuwatchd.rules.loader import parse_rules
from gpuwatchd.rules.model import RuleSet
from gpuwatchd.rules.store import StateStore
from gpuwatchd.scenario.gpumodels import H100, at_work

if TYPE_CHECKING:
    import pytest

T0 = 1_767_225_600.0
MODEL = H100.name
# An H100 running a job (busy, warm, clocks up): the one baseline table, with the changes.
BASE: dict[str, float] = at_work(
    H100, temperature_gpu=60.0, utilization_gpu=0.9, compute_processes=1.0, sm_clock=1.98e9
)


def uuid_of(i: int) -> str:
    return f"GPU-00000000-0000-0000-0000-{i:012x}"


def pci_of(i: int) -> str:
    return f"00000000:{0x18 + 0x10 * i:02X}:00.0"


class Calls:
    """How many times a function was called since ``count_calls`` wrapped it."""

    def __init__(self) -> None:
        self.n = 0


def count_calls(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, name: str, *also: ModuleType
) -> Calls:
    """Replace ``module.name`` with a wrapper that counts its calls and calls the real
    function; ``also``: modules that may hold the same function under the same name (an
    import), patched too where they do."""
    real = getattr(module, name)
    calls = Calls()

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.n += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    for other in also:
        monkeypatch.setattr(other, name, counting, raising=False)
    return calls


def rules(text: str, path: str = "r.yaml") -> RuleSet:
    return RuleSet(tuple(parse_rules(textwrap.dedent(text), path)))


class Node:
    def __init__(
        self,
        rule_text: str | RuleSet,
        gpus: int = 4,
        *,
        links: int = 0,
        store: StateStore | None = None,
        boot_id: str = "boot-1",
        expected: int | None = None,
        start: float = T0,
    ) -> None:
        self.clock = VirtualClock(start)
        ruleset = rule_text if isinstance(rule_text, RuleSet) else rules(rule_text)
        self.store = store if store is not None else StateStore(":memory:", boot_id=boot_id)
        self.engine = Engine(ruleset, self.store, self.clock)
        self.state = NodeState("node-a", start, expected)
        self.infos = [GpuInfo(i, uuid_of(i), MODEL, pci_of(i)) for i in range(gpus)]
        self.state.set_gpus(self.infos, start)
        self.fields = [dict(BASE) for _ in range(gpus)]
        self.link_fields = [
            [{"nvlink_up": 1.0, "nvlink_crc_errors": 0.0} for _ in range(links)]
            for _ in range(gpus)
        ]
        self.status = [GpuStatus.OK] * gpus
        self.transitions: list[tuple[float, AlertTransition]] = []
        self.t0 = start

    # -- driving ----------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.clock.now() - self.t0

    def set(self, gpu: int | list[int], **fields: float) -> None:
        for g in [gpu] if isinstance(gpu, int) else gpu:
            self.fields[g].update(fields)

    def add(self, gpu: int, **fields: float) -> None:
        for k, v in fields.items():
            self.fields[gpu][k] = self.fields[gpu].get(k, 0.0) + v

    def set_link(self, gpu: int, link: int, **fields: float) -> None:
        self.link_fields[gpu][link].update(fields)

    def xid(self, gpu: int | None, code: int, **kw: Any) -> None:
        pci = kw.pop("pci_bus_id", pci_of(gpu) if gpu is not None else None)
        source = kw.pop("source", "journald")
        self.engine.observe(XidEvent(self.clock.now(), source, code, gpu=gpu, pci_bus_id=pci, **kw))

    def sample(self, gpu: int) -> GpuSample:
        info = self.infos[gpu]
        now = self.clock.now()
        if self.status[gpu] is not GpuStatus.OK:
            return GpuSample(gpu, info.uuid, now, status=self.status[gpu], error="x")
        f = self.fields[gpu]
        procs = tuple(ProcessInfo(100 + k) for k in range(int(f.get("compute_processes", 0))))
        links = tuple(
            LinkSample(i, MappingProxyType(dict(lf))) for i, lf in enumerate(self.link_fields[gpu])
        )
        return GpuSample(
            gpu, info.uuid, now, fields=MappingProxyType(dict(f)), links=links, processes=procs
        )

    def poll(self) -> list[AlertTransition]:
        """One poll of every GPU, then one evaluation (what the daemon does)."""
        for gpu in range(len(self.infos)):
            s = self.sample(gpu)
            self.state.record_sample(s)
            self.engine.observe(s)
        out = self.engine.evaluate(self.clock.now(), self.state.view())
        self.transitions.extend((self.t, tr) for tr in out)
        return out

    def step(self, seconds: float = 10.0) -> list[AlertTransition]:
        self.clock.advance(seconds)
        return self.poll()

    def run(self, seconds: float, step: float = 10.0) -> list[AlertTransition]:
        out: list[AlertTransition] = []
        end = self.t + seconds
        while self.t + step <= end + 1e-9:
            out.extend(self.step(step))
        return out

    # -- reading ----------------------------------------------------------------------
    def firing(self, rule: str | None = None) -> set[tuple[str, str | None]]:
        return {
            (a.rule, a.labels.get("gpu"))
            for a in self.engine.alerts(AlertState.FIRING)
            if rule is None or a.rule == rule
        }

    def pending(self, rule: str | None = None) -> set[tuple[str, str | None]]:
        return {
            (a.rule, a.labels.get("gpu"))
            for a in self.engine.alerts(AlertState.PENDING)
            if rule is None or a.rule == rule
        }

    def events(self, state: str | None = None) -> list[tuple[float, str, str, str | None]]:
        return [
            (t, tr.rule, tr.state.value, tr.labels.get("gpu"))
            for t, tr in self.transitions
            if state is None or tr.state.value == state
        ]

    def metrics(self) -> str:
        fams = Families()
        self.engine.families(self.state.view(), fams)
        return fams.render().decode()
