"""``peer_deviation``: a gauge far from the median of the node's other GPUs (median and MAD,
an absolute floor, ``for``, at least ``min_peers`` peers), and the shipped GpuHotterThanPeers."""

from __future__ import annotations

from pathlib import Path

import pytest
from rulekit import Node, rules

from gpuwatchd.core.errors import ConfigError
from gpuwatchd.rules.conditions.peer_deviation import PeerDeviation, deviations, peer_stats
from gpuwatchd.rules.loader import load_rule_set

ROOT = Path(__file__).resolve().parent.parent.parent
RULE = """
rules:
- name: Hot
  severity: ticket
  for: 15m
  condition:
    peer_deviation: {field: temperature_gpu, direction: above, k: 3, floor: 10, min_peers: 3}
  annotations:
    summary: '{value:.0f} C, {deviation:.1f} above {peers_median:.1f} (limit {limit:.1f})'
"""


def _run(n: Node, minutes: int, temps: dict[int, float]) -> None:
    for gpu, t in temps.items():
        n.set(gpu, temperature_gpu=t)
    n.run(minutes * 60.0, step=60.0)


def test_one_hot_gpu_fires_after_for_and_says_by_how_much() -> None:
    n = Node(RULE, gpus=8)
    n.set(list(range(8)), temperature_gpu=62.0)
    n.set([0, 2, 4], temperature_gpu=64.0)  # positional spread: a few degrees
    n.poll()
    _run(n, 14, {5: 77.0})
    assert n.pending("Hot") == {("Hot", "5")} and not n.firing()
    _run(n, 2, {})
    assert n.firing() == {("Hot", "5")}
    tr = next(tr for _, tr in n.transitions if tr.state.value == "firing")
    assert tr.annotations["summary"] == "77 C, 15.0 above 62.0 (limit 10.0)"
    _run(n, 2, {5: 63.0})  # cooled down: resolves
    assert not n.firing()


def test_all_gpus_hot_together_is_not_an_outlier() -> None:
    n = Node(RULE, gpus=8)
    n.set(list(range(8)), temperature_gpu=62.0)
    n.poll()
    _run(n, 30, dict.fromkeys(range(8), 84.0))
    assert not n.pending() and not n.firing()


def test_a_difference_within_the_floor_is_not_an_outlier() -> None:
    n = Node(RULE, gpus=8)
    n.set(list(range(8)), temperature_gpu=62.0)  # peers agree exactly: no spread at all
    n.poll()
    _run(n, 30, {3: 71.5})
    assert not n.pending() and not n.firing()
    _run(n, 16, {3: 72.5})  # beyond the floor: the spread alone would have fired at 62.1
    assert n.firing() == {("Hot", "3")}


def test_a_noisy_node_needs_k_spreads() -> None:
    # peers 50..70 C: median 60, MAD 5, robust spread 7.4; 3 spreads = 22.2 > the floor
    temps = {0: 50.0, 1: 55.0, 2: 55.0, 3: 60.0, 4: 65.0, 5: 65.0, 6: 70.0}
    n = Node(RULE, gpus=8)
    n.set(list(range(8)), temperature_gpu=60.0)
    n.poll()
    _run(n, 20, {**temps, 7: 80.0})  # 20 above the median: within 3 spreads
    assert not n.pending() and not n.firing()
    _run(n, 16, {7: 83.0})  # 23 above
    assert n.firing() == {("Hot", "7")}


def test_too_few_peers_never_fire() -> None:
    n = Node(RULE, gpus=3)  # two peers each, the rule needs three
    n.set([0, 1, 2], temperature_gpu=60.0)
    n.poll()
    _run(n, 30, {1: 95.0})
    assert not n.pending() and not n.firing()


def test_when_compares_loaded_gpus_with_loaded_gpus_only() -> None:
    ruleset = load_rule_set([str(ROOT / "rules" / "gpu.yaml")])
    n = Node(ruleset, gpus=8)
    n.set(list(range(8)), utilization_gpu=0.0, temperature_gpu=35.0)  # idle node
    n.set(2, utilization_gpu=0.97, temperature_gpu=70.0)  # one single-GPU job: fine
    n.poll()
    n.run(30 * 60.0, step=60.0)
    assert not n.firing("GpuHotterThanPeers")
    n.set(list(range(8)), utilization_gpu=0.97, temperature_gpu=66.0, power=400.0)  # a job on all
    n.set(6, temperature_gpu=79.0, power=420.0)  # a failing fan (a little more leakage)
    n.run(16 * 60.0, step=60.0)
    assert n.firing("GpuHotterThanPeers") == {("GpuHotterThanPeers", "6")}


def test_below_and_both_directions() -> None:
    c = PeerDeviation("sm_clock", floor=100e6, direction="below", k=3.0, min_peers=3)
    values = [1.98e9, 1.98e9, 1.6e9, 1.98e9, 2.2e9]
    assert [f[0] for f in deviations(values, c) if f] == [2]
    both = PeerDeviation("sm_clock", floor=100e6, direction="both", k=3.0, min_peers=3)
    assert [f[0] for f in deviations(values, both) if f] == [2, 4]
    assert peer_stats([1.0, 2.0, 3.0, 4.0, 100.0]) == (3.0, pytest.approx(1.4826))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "{field: ecc_corrected_volatile, floor: 10}",
            "r.yaml:5:29: rule 'R'.condition.peer_deviation.field: 'ecc_corrected_volatile' is a "
            "counter; peer_deviation compares gauges (for a counter's growth use peer_outlier "
            "with a window, or peer_share)",
        ),
        ("{field: temperature_gpu}", "missing required key 'floor'"),
        ("{field: temperature_gpu, floor: 0}", "floor: must be above 0"),
        ("{field: temperature_gpu, floor: 10, min_peers: 1}", "min_peers: must be >= 2, got 1"),
        (
            "{field: temperature_gpu, floor: 10, direction: up}",
            "direction: 'up' is not one of above, below, both",
        ),
    ],
)
def test_bad_bodies_are_errors_at_their_place(body: str, message: str) -> None:
    text = f"rules:\n- name: R\n  severity: ticket\n  condition:\n    peer_deviation: {body}\n"
    with pytest.raises(ConfigError) as info:
        rules(text)
    (line,) = info.value.lines()
    assert message in line, line


def test_similar_load_limits_the_peers() -> None:
    """Issue 22: a GPU one job works harder (power) is compared only with GPUs as busy."""
    from gpuwatchd.rules.conditions.peer_deviation import PeerDeviation, deviations, similar

    c = PeerDeviation("temperature_gpu", 10.0, similar_field="power", similar_within=0.25)
    temps = [60.0, 76.0, 60.0, 61.0, 60.0]
    even = [300.0, 310.0, 300.0, 305.0, 295.0]
    uneven = [300.0, 650.0, 300.0, 305.0, 295.0]
    assert [f[0] for f in deviations(temps, c, even) if f] == [1]
    assert [f[0] for f in deviations(temps, c, uneven) if f] == []  # no similar peers
    assert [f[0] for f in deviations(temps, c) if f] == [1]  # without loads: all peers
    throttled = [300.0, 150.0, 300.0, 305.0, 295.0]  # hotter on less power: still compared
    assert [f[0] for f in deviations(temps, c, throttled) if f] == [1]
    assert similar(300.0, 370.0, 0.25) and not similar(300.0, 420.0, 0.25)
    assert similar(0.0, 0.0, 0.25)
    assert similar(150.0, 300.0, 0.25, "above") and not similar(650.0, 300.0, 0.25, "above")
