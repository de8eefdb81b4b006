"""What the fleet drain budget's tests (tests/test_fleet_*.py) set up alike: a real slurmctld
with many state-only nodes for a whole test module, drain controllers (the product's
``ActionsSink``, one per node, paging to a webhook receiver), the config they run with,
running them all at the same moment, and the pages they sent."""

from __future__ import annotations

import textwrap
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from actions_support import HttpReceiver, make_config, sink_for
from slurm_support import Slurm, start_slurm

from gpuwatchd.actions import ActionsSink
from gpuwatchd.core.clock import VirtualClock

PREFIX = "gpuwatchd:"  # the start of every drain reason gpuwatchd writes
OUR_REASON = "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"  # a drain as gpuwatchd writes it


@contextmanager
def slurm_for_module(work: Path, nodes: int) -> Iterator[Slurm]:
    """A real slurmctld with ``nodes`` state-only nodes (and one with a slurmd), with
    ``SLURM_CONF`` set for the drain controllers' sinfo/scontrol while it runs."""
    found, procs = start_slurm(work, extra=nodes)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SLURM_CONF", found.env["SLURM_CONF"])
            yield found
    finally:
        for p in reversed(procs):
            p.stop()


def module_slurm(nodes: int) -> Any:
    """A module-scoped fixture (assign it to ``cluster``) with a real slurmctld and
    ``nodes`` state-only nodes (``slurm_for_module``)."""

    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Slurm]:
        with slurm_for_module(tmp_path_factory.mktemp("slurm"), nodes) as found:
            yield found

    return cluster


def ours(cluster: Slurm) -> list[str]:
    """The nodes drained by gpuwatchd, as slurmctld says."""
    return sorted(n for n, r in cluster.reasons().items() if r.startswith(PREFIX))


def drain_config(node: str, url: str, drain: str) -> str:
    """A drain controller's config: pages to a webhook at ``url`` (one group per node and
    alert, no wait), and ``drain:`` for ``node`` (no state file) with the lines ``drain``
    adds (the mode, ``fleet``, ...: written unindented)."""
    lines = textwrap.indent(textwrap.dedent(drain).strip("\n"), "  ")
    return f"""receivers:
  - {{name: ops, type: webhook, url: "{url}/hook"}}
routing: {{group_wait: 0s, group_by: [node, alertname]}}
drain:
  node: {node}
  state_file: null
{lines}
"""


def controller(tmp_path: Path, node: str, text: str, clock: VirtualClock) -> ActionsSink:
    """The drain controller of ``node``, with the config ``text``, in its own directory
    (``tmp_path / node``, which may hold its other files already)."""
    work = tmp_path / node
    work.mkdir(exist_ok=True)
    return sink_for(make_config(work, text, name="drain.yaml"), clock)


def slurm_controller(
    tmp_path: Path, node: str, url: str, fleet: str, clock: VirtualClock
) -> ActionsSink:
    """The drain controller of ``node`` in ``slurm`` mode, resuming at once when its alert
    resolves, with ``drain.fleet`` set to ``fleet`` (a YAML flow mapping)."""
    drain = f"mode: slurm\nresume: true\nresume_hold: 0s\nfleet: {fleet}"
    return controller(tmp_path, node, drain_config(node, url, drain), clock)


def at_once(sinks: Sequence[ActionsSink], watch: Callable[[], None] | None = None) -> None:
    """Every controller acts on what was delivered to it at the same moment (one thread
    each, released together); ``watch`` runs every 50 ms until all have finished. An
    exception in any controller fails the test."""
    start = threading.Barrier(len(sinks) + 1)
    errors: list[BaseException] = []

    def run(sink: ActionsSink) -> None:
        start.wait()
        try:
            sink.run_pending()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    start.wait()
    while any(t.is_alive() for t in threads):
        if watch is not None:
            watch()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert not errors, errors


def alerts(rx: HttpReceiver, rule: str, node: str | None = None) -> list[dict[str, Any]]:
    """The alerts of ``rule`` (from ``node``, if given) that the receiver got."""
    return [
        a
        for r in rx.requests
        for a in r.json()["alerts"]
        if a["labels"]["alertname"] == rule and node in (None, a["labels"]["node"])
    ]
