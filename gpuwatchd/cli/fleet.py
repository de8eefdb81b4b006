"""``gpuwatchd fleet status|pause|reset``: the fleet drain budget seen from the scheduler.

For operators. Slurm: the commands run ``sinfo`` and, for pause and reset, ``scontrol`` as
the configured ``drain.slurm`` programs, so they need a Slurm admin, like any drain.
Kubernetes (``drain.mode: kubernetes``): the stop lives in the budget's Lease, written with
the configured kubeconfig.

    gpuwatchd fleet status [--json]   budget, gpuwatchd's drains, claims, stops
    gpuwatchd fleet pause             no gpuwatchd drains anywhere until a reset
    gpuwatchd fleet reset             take every stop off (a paused fleet, a tripped breaker)

A stop is a ``gpuwatchd-fleet:`` mark in a node's ``Comment`` (Kubernetes: the Lease's
``gpuwatchd.io/fleet-stop`` annotation); docs/fleet.md, "The breaker".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from typing import Any

from gpuwatchd.config.paths import default_config_path
from gpuwatchd.configfile.loader import Config, load_config
from gpuwatchd.core.errors import ConfigError, GpuwatchdError
from gpuwatchd.core.health import EXIT_USAGE


def _config(args: argparse.Namespace) -> Config:
    return load_config(args.config or default_config_path(), must_exist=args.config is not None)


def _view(config: Config) -> Any:
    drain = config.drain
    node = drain.node or config.node_name
    if drain.mode == "kubernetes":
        from gpuwatchd.actions.drain.drivers.kubernetes import (
            KubeClient,
            KubernetesDrainConfig,
            KubernetesDriver,
        )

        kube = drain.section("kubernetes", KubernetesDrainConfig)
        client = KubeClient.from_config(kube, drain.timeout)
        return KubernetesDriver(client, node, kube, time.time).fleet_view(drain.fleet)
    from gpuwatchd.actions.drain.drivers.slurm import SlurmDrainConfig, SlurmDriver

    slurm = drain.section("slurm", SlurmDrainConfig)
    driver = SlurmDriver(node, drain.timeout, slurm.scontrol, slurm.sinfo)
    return driver.fleet_view(drain.fleet)


def _census(view: Any) -> Any:
    """A full census, with the fleet's stops (Kubernetes keeps them in the Lease)."""
    census = view.census(full=True)
    marks = getattr(view, "marks", None)
    return replace(census, marks=marks()) if marks is not None else census


def cmd_status(args: argparse.Namespace) -> int:
    from gpuwatchd.actions.fleet import limit_for, live_claims

    config = _config(args)
    census = _census(_view(config))
    now = time.time()
    claims = live_claims(census, now)
    fleet = config.drain.fleet
    doc = {
        "nodes": census.nodes,
        "budget": limit_for(fleet, census.nodes) if fleet.enabled else None,
        "drained": [d.node for d in census.drains],
        "claims": {n: c.text for n, c in sorted(claims.items())},
        "stops": [{"node": m.node, "what": m.what, "at": m.at, "xid": m.xid} for m in census.marks],
    }
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
        return 0
    print(f"nodes known: {doc['nodes']}; budget: {doc['budget'] or 'off (no drain.fleet)'}")
    print(f"drained by gpuwatchd: {len(census.drains)} {' '.join(doc['drained'])}".rstrip())
    print(f"claims: {len(claims)}")
    if not census.marks:
        print("draining: on")
    for m in census.marks:
        how = "paused by an operator" if m.what == "paused" else "stopped by the breaker"
        xid = f" (XID {m.xid})" if m.xid else ""
        print(f"draining: OFF, {how} on {m.node} at {time.ctime(m.at)}{xid}")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    from gpuwatchd.actions.fleet import Mark

    config = _config(args)
    view = _view(config)
    node = args.node or config.drain.node or config.node_name
    view.write_mark(node, Mark(node, "paused", time.time()))
    print(f"fleet draining paused (the mark is on {node}); `gpuwatchd fleet reset` resumes it")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    config = _config(args)
    view = _view(config)
    census = _census(view)
    for m in census.marks:
        view.write_mark(m.node, None)
        print(f"took the {m.what} mark off {m.node}")
    if not census.marks:
        print("nothing to reset: fleet draining is on")
    return 0


def _run(func: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(func(args))
        except ConfigError as exc:
            print(f"gpuwatchd fleet: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except GpuwatchdError as exc:
            print(f"gpuwatchd fleet {args.fleet_command}: {exc}", file=sys.stderr)
            return 1

    return wrapped


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    top = subparsers.add_parser(
        "fleet",
        help="the fleet drain budget: status, pause, reset the breaker",
        description="Read the fleet drain budget from the scheduler, pause gpuwatchd's "
        "drains on every node, or reset a paused fleet or a tripped breaker. Slurm: pause "
        "and reset write node Comments with scontrol (run them as a Slurm admin); "
        "Kubernetes: the budget's Lease.",
    )
    sub = top.add_subparsers(dest="fleet_command", metavar="FLEET_COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help=f"config file, for drain.slurm and drain.fleet (default {default_config_path()})",
        )

    p = sub.add_parser("status", help="budget, drains, claims and stops")
    common(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_run(cmd_status))
    p = sub.add_parser("pause", help="stop gpuwatchd's drains on every node until a reset")
    common(p)
    p.add_argument("--node", metavar="NAME", help="node to carry the mark (default: this one)")
    p.set_defaults(func=_run(cmd_pause))
    p = sub.add_parser("reset", help="take every stop off: a paused fleet, a tripped breaker")
    common(p)
    p.set_defaults(func=_run(cmd_reset))
    return top
