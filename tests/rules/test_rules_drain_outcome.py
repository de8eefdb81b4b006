"""The ``drain_outcome`` condition: the drain stage reports what a drain came to (failed,
limit reached, over the fleet budget, breaker open) as records on the hand-off, and a rule
decides whether that pages. It fires while the outcome holds and resolves when it ends."""

from __future__ import annotations

import pytest
from rulekit import Node, pci_of, rules

from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.records import DrainOutcome, DrainOutcomeKind
from gpuwatchd.service.handoff import Handoff

RULES = """
rules:
- name: DrainFailed
  severity: page
  condition:
    drain_outcome: {outcome: [failed]}
  annotations: {summary: '{summary}', description: '{summary}'}
- name: FleetBudget
  severity: page
  condition:
    drain_outcome: {outcome: [over_budget]}
  annotations: {summary: '{summary}', xids: '{xids}', likely_cause: '{likely_cause}'}
"""


def outcome(n: Node, kind: DrainOutcomeKind, holds: bool = True, **kw: object) -> None:
    n.engine.observe(DrainOutcome(n.clock.now(), kind, "node-a", holds, **kw))  # type: ignore[arg-type]


def test_a_failed_drain_pages_on_its_gpu_and_resolves_when_it_ends() -> None:
    n = Node(RULES)
    n.poll()
    assert n.firing() == set()
    text = "gpuwatchd could not drain node-a: exited with status 3"
    outcome(n, DrainOutcomeKind.FAILED, key="k1", summary=text, pci_bus_id=pci_of(2))
    n.step()
    assert n.firing() == {("DrainFailed", "2")}
    fired = n.transitions[-1][1]
    assert fired.annotations["summary"] == text
    assert fired.labels["node"] == "node-a" and fired.labels["pci_bus_id"] == pci_of(2)
    n.step()
    assert n.firing() == {("DrainFailed", "2")}  # holds until the drain stage says it ended
    outcome(n, DrainOutcomeKind.FAILED, False, key="k1")
    n.step()
    assert n.firing() == set()


def test_a_node_outcome_is_the_nodes_series_with_its_counts() -> None:
    n = Node(RULES)
    n.poll()
    counts = {"xids": "XID 79 on 3", "likely_cause": "likely a software or driver event"}
    outcome(n, DrainOutcomeKind.OVER_BUDGET, summary="fleet drain budget of 4", counts=counts)
    outcome(n, DrainOutcomeKind.LIMIT_REACHED, summary="no rule asks for this one")
    n.step()
    assert n.firing() == {("FleetBudget", None)}
    fired = n.transitions[-1][1]
    assert fired.labels == {"node": "node-a"}
    assert fired.annotations["xids"] == "XID 79 on 3"
    assert fired.annotations["likely_cause"] == "likely a software or driver event"
    outcome(n, DrainOutcomeKind.OVER_BUDGET, False)
    n.step()
    assert n.firing() == set()


def test_an_outcome_that_never_held_ending_changes_nothing() -> None:
    n = Node(RULES)
    n.poll()
    outcome(n, DrainOutcomeKind.FAILED, False, key="never")
    assert n.step() == []


def test_an_unknown_outcome_is_a_located_load_error() -> None:
    text = """
    rules:
    - name: R
      severity: page
      condition:
        drain_outcome: {outcome: [faild]}
    """
    with pytest.raises(ConfigError) as info:
        rules(text)
    assert "r.yaml:6:31: " in str(info.value)
    assert "'faild' is not one of failed, limit_reached" in str(info.value)
    assert "did you mean 'failed'?" in str(info.value)


def test_a_drain_outcome_wakes_the_evaluator() -> None:
    h = Handoff()
    h.put(DrainOutcome(0.0, DrainOutcomeKind.BREAKER_OPEN, "node-a"))
    assert h.wakeup.is_set()
