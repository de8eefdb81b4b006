"""The node-wide judgement of memory activity (``rules/node_wide.py``): its answers kept
between looks (``NodeLook``) are those of the pure functions, and a busy node does not ask
them again on every poll."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from rulekit import Node, count_calls

from gpuwatchd.rules import node_wide
from gpuwatchd.rules.evidence import BUCKET, Activity
from gpuwatchd.rules.loader import load_rule_set

FIELD = "ecc_corrected_volatile_dev"


def _snap(acts: dict[int, Activity]) -> Any:
    """What ``NodeLook.look`` reads of a snapshot: each GPU's counter history's activity."""
    return SimpleNamespace(
        gpus=[
            SimpleNamespace(
                index=i, data=SimpleNamespace(hist={FIELD: SimpleNamespace(activity=a)})
            )
            for i, a in sorted(acts.items())
        ]
    )


@pytest.mark.parametrize("seed", range(6))
def test_kept_answers_are_the_pure_functions_answers(seed: int) -> None:
    # Five GPUs whose activity grows at random, some of it together (node events), looked at
    # every 100 s over two days with a 2-day and a 1-day window: every answer NodeLook gives
    # is what has_own_activity and node_wide_gpus give on the same buckets at that look.
    rng = random.Random(seed)
    acts = {g: Activity() for g in range(5)}
    looks = {days: node_wide.NodeLook() for days in (1, 2)}
    t = 0.0
    for _ in range(1728):
        t += 100.0
        if rng.random() < 0.01:  # a node event: several GPUs at once
            for g in rng.sample(sorted(acts), rng.randint(2, 5)):
                acts[g].mark(t)
        elif rng.random() < 0.05:
            acts[rng.randrange(5)].mark(t)
        snap = _snap({g: a for g, a in acts.items() if a.buckets})
        b1 = int(t // BUCKET) + 1
        for days, look in looks.items():
            b0 = b1 - days * 144
            plain = {g: a.buckets for g, a in acts.items() if a.buckets}
            assert look.look(snap, FIELD, b0, b1) == plain
            for g in sorted(plain):
                assert look.own(g) == node_wide.has_own_activity(plain, g, b0, b1)
            assert look.node_wide() == node_wide.node_wide_gpus(plain, b0, b1)


def _node_with_tickets() -> Node:
    n = Node(load_rule_set([]), gpus=3)
    for f in n.fields:
        f["ecc_corrected_volatile"] = 0.0
        f[FIELD] = 0.0
    n.run(3600)
    for gpu in range(3):  # each GPU's own errors, hours apart: three tickets that stay firing
        n.add(gpu, ecc_corrected_volatile=1, ecc_corrected_volatile_dev=1)
        n.run(7 * 3600)
    return n


def test_a_firing_ticket_does_not_judge_the_node_again_on_every_poll(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Failed before: `GpuEccCorrectedRising` (increase, skip_node_wide) keeps firing for its
    # regime, so it is judged on every poll, and every poll asked has_own_activity again for
    # each firing GPU (360 polls an hour x 3 GPUs), though its answer can only change when a
    # GPU's activity or the window's 10-minute buckets do (6 times an hour).
    n = _node_with_tickets()
    # the version before NodeLook imported it into the windowed conditions' module
    from gpuwatchd.rules.conditions import windowed

    counted = count_calls(monkeypatch, node_wide, "has_own_activity", windowed)
    firing = {tr.labels.get("gpu") for _, tr in n.transitions if tr.rule == "GpuEccCorrectedRising"}
    assert firing == {"0", "1", "2"}
    n.run(3600)  # an hour of 10-second polls, no new error
    assert 0 < counted.n <= 3 * 8, counted.n  # once a GPU per 10-minute turn (and the hour's edges)
    before = counted.n
    n.add(1, ecc_corrected_volatile=1, ecc_corrected_volatile_dev=1)
    n.run(30)
    assert counted.n > before  # GPU 1's activity moved: judged again
