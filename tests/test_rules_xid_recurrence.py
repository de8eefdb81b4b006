"""XID episodes, independent repeats, recurrence, and node-wide XIDs (``xid_recurrence``)."""

from __future__ import annotations

from pathlib import Path

from rulekit import Node

from gpuwatchd.rules.loader import load_rule_set

ROOT = Path(__file__).resolve().parent.parent

HOUR = 3600.0
DAY = 86400.0
RULES = """
rules:
- name: Xid92Recurring
  severity: page
  condition:
    xid_recurrence: {codes: [92], window: 2d, history: 21d, alpha: 0.001, min_repeats: 3}
  annotations: {summary: 'XID {xid}: {repeats} in {window}, p={p_value}'}
- name: XidOnManyGpus
  severity: ticket
  condition:
    xid_recurrence: {codes: [92, 13], signal: node}
  annotations: {summary: 'XID {xid} on GPUs {gpus}'}
"""


def _xids(n: Node, gpu: int, every: float, until: float, step: float = 600.0, **kw: object) -> None:
    nxt = n.t + every
    while n.t + step <= until:
        n.clock.advance(step)
        while nxt <= n.t:
            n.xid(gpu, 92, **kw)
            nxt += every
        n.poll()


def test_xid_92_weekly_then_daily_then_every_few_hours_pages_within_a_day() -> None:
    n = Node(RULES, gpus=4)
    n.poll()
    _xids(n, 2, 7 * DAY, 21 * DAY)  # weekly for three weeks
    _xids(n, 2, DAY, 26 * DAY)  # then daily
    pages = [e for e in n.events("firing") if e[1] == "Xid92Recurring"]
    assert not pages  # daily alone, against weekly: not yet significant
    _xids(n, 2, 3 * HOUR, 27 * DAY)  # then every few hours: pages within a day
    pages = [e for e in n.events("firing") if e[1] == "Xid92Recurring"]
    assert pages and pages[0][3] == "2" and pages[0][0] < 27 * DAY
    assert not [e for e in n.events("firing") if e[1] == "XidOnManyGpus"]


def test_one_job_printing_many_lines_is_one_episode() -> None:
    n = Node(RULES, gpus=2)
    n.poll()
    _xids(n, 1, 7 * DAY, 14 * DAY)
    for _ in range(3):  # a job prints the XID every minute for hours, three times a day
        for _ in range(300):
            n.xid(1, 92, pid=4242)
            n.clock.advance(60)
        n.poll()
        n.clock.advance(2 * HOUR)
        n.poll()
    assert not [e for e in n.events("firing") if e[1] == "Xid92Recurring"]


def test_the_same_xid_on_several_gpus_at_once_is_a_node_event() -> None:
    n = Node(RULES, gpus=4)
    n.poll()
    for day in range(10):
        for gpu in (0, 1, 2):  # a driver fault: every GPU at once, ever more often
            n.xid(gpu, 92)
        n.clock.advance(DAY / (day + 1))
        n.poll()
    assert not [e for e in n.events("firing") if e[1] == "Xid92Recurring"]
    node = [tr for _, tr in n.transitions if tr.rule == "XidOnManyGpus"]
    assert node and "gpu" not in node[0].labels
    assert node[0].annotations["summary"] == "XID 92 on GPUs 0, 1, 2"


def test_the_fleet_profile_loads_with_the_defaults_and_tickets_a_first_xid_92(
    tmp_path: Path,
) -> None:
    profile = ROOT / "rules" / "profiles" / "fleet.yaml"
    ruleset = load_rule_set([str(profile)], disable=["GpuXidMemoryDegrading"])
    names = ruleset.names()
    assert "GpuXidMemoryDegrading" not in names and "FleetXidMemoryRecurring" in names
    n = Node(ruleset, gpus=4)
    n.poll()
    n.xid(1, 92)
    n.step(60)
    firing = {(r, g) for r, g in n.firing() if r.startswith("Fleet") or "Xid" in r}
    assert firing == {("FleetXidMemoryFirstSeen", "1")}
