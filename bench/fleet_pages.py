#!/usr/bin/env python3
"""Pages at fleet scale: what a real Alertmanager sends when many nodes see one XID.

N nodes (default 2,000) push, from 8 threads, the alerts gpuwatchd's ``alertmanager``
receiver really builds for XID 119 on one GPU (the real pipeline over
tests/data/fleet-xid119.yaml, the node name replaced), plus N/25 nodes that lose a GPU
(scenarios/fallen-off-bus.yaml: XID 79 and GpuLost). The Debian Alertmanager runs

- ``shipped``: packaging/alertmanager/gpuwatchd-fleet.yml as shipped (its receivers
  pointed at a local capture), and
- ``defaults``: the same routes, grouping and inhibit rules with Alertmanager's default
  message templates and no ``max_alerts`` (what the grouping advice alone gave),

and the bench prints, per run: the notifications sent per receiver and alert name, their
sizes, how long the senders took and Alertmanager's CPU seconds. Each run waits for the
route's group_wait (30 s) and 10 s more.

    python3 bench/fleet_pages.py [--nodes 2000] [--only shipped|defaults]

Results are written up in docs/fleet.md ("Pages at fleet scale").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import yaml  # noqa: E402
from actions_support import HttpReceiver  # noqa: E402
from benchlib import cpu_seconds  # noqa: E402
from fleet_pages_support import (  # noqa: E402
    FALLEN_OFF_BUS,
    XID119,
    FleetAlertmanager,
    as_node,
    fleet_config,
    node_payload,
    storm,
)


def strip_templates(config: Path) -> None:
    """The shipped routes and inhibit rules, Alertmanager's own message texts."""
    doc = yaml.safe_load(config.read_text())
    doc.pop("templates", None)
    for receiver in doc["receivers"]:
        for pd in receiver.get("pagerduty_configs", []):
            pd.pop("description", None)
            pd.pop("details", None)
        for slack in receiver.get("slack_configs", []):
            slack.pop("title", None)
            slack.pop("text", None)
        for hook in receiver.get("webhook_configs", []):
            hook.pop("max_alerts", None)
    config.write_text(yaml.safe_dump(doc, sort_keys=False))


def run(kind: str, nodes: int, workdir: Path) -> None:
    tmp = workdir / kind
    tmp.mkdir()
    xid = node_payload(XID119, 60.0, tmp)
    lost = node_payload(FALLEN_OFF_BUS, 3600.0, tmp)
    bodies = [as_node(xid, f"gpu-{i:05d}") for i in range(nodes)]
    bodies += [as_node(lost, f"gpu-lost-{i:04d}") for i in range(max(1, nodes // 25))]
    hook = HttpReceiver(0).start()
    assert hook.server is not None
    hook.port = int(hook.server.server_address[1])
    config = fleet_config(hook.url, tmp)
    if kind == "defaults":
        strip_templates(config)
    am = FleetAlertmanager(tmp, hook, config)
    try:
        cpu0 = cpu_seconds(am.proc.popen.pid)
        took = storm(am.url, bodies)
        time.sleep(40.0)  # group_wait (30 s) and the sends
        cpu = cpu_seconds(am.proc.popen.pid) - cpu0
        sent = am.notifications()
    finally:
        am.stop()
        hook.stop()
    print(f"\n{kind}: {len(bodies)} senders posted in {took:.1f}s; Alertmanager CPU {cpu:.1f}s")
    print("| receiver | alert | notifications | bytes each | alerts in it |")
    print("|---|---|---:|---|---|")
    rows: dict[tuple[str, str], list[int]] = {}
    counts: dict[tuple[str, str], list[str]] = {}
    for n in sent:
        key = (n.receiver, n.alertname)
        rows.setdefault(key, []).append(n.size)
        if n.receiver == "webhook":
            a = n.body
            counts.setdefault(key, []).append(
                f"{len(a['alerts'])} (+{a['truncatedAlerts']} truncated)"
            )
    for (receiver, alert), sizes in sorted(rows.items()):
        extra = ", ".join(counts.get((receiver, alert), []))
        sizes_text = ", ".join(f"{s:,}" for s in sizes)
        print(f"| {receiver} | {alert} | {len(sizes)} | {sizes_text} | {extra} |")
    titles = sorted({n.title for n in sent if n.title})
    for t in titles:
        print(f"  {t[:200]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--only", choices=("shipped", "defaults"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("shipped", "defaults"):
            if args.only in (None, kind):
                run(kind, args.nodes, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
