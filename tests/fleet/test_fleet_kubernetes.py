"""The fleet drain budget against a Kubernetes API contract server with 51 nodes: 50
gpuwatchd drain controllers, one per node, all seeing XID 79 at the same moment. The
server serialises writes like the API server (one resourceVersion counter, a write with a
stale resourceVersion gets 409), so the budget's Lease admits exactly the budget: no
overshoot at all. Resumes give places back; a still-active incident then drains."""

from __future__ import annotations

import contextlib
import copy
import json
import random
import textwrap
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from actions_support import BackloggedServer, HttpReceiver, transition
from conftest import free_port
from fleet_support import alerts, at_once, controller, drain_config
from kubernetes_support import TOKEN, ContractError, apply_json_patch, check_event

from gpuwatchd.actions import ActionsSink
from gpuwatchd.actions.drain.drivers.kubernetes import (
    ANNOTATION,
    LEASE,
    PLACES,
    KubeClient,
    KubeFleetView,
    KubernetesDrainConfig,
)
from gpuwatchd.actions.fleet import BUDGET_RULE
from gpuwatchd.config.actions import FleetDrainConfig
from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

NODES = 50
BUDGET = 5
LEASES = "/apis/coordination.k8s.io/v1/namespaces/gpuwatchd/leases"


class Cluster:
    """Nodes, events and leases behind one lock, with one resourceVersion counter."""

    def __init__(self, names: list[str]) -> None:
        self.lock = threading.Lock()
        self.rv = 100
        self.nodes = {n: self._node(n) for n in names}
        self.leases: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.cordoned_most = 0
        self.lease_conflicts = 0
        self.rivals = 0  # this many Lease writes lose to a rival daemon's, written just before
        self.node_lists: list[dict[str, list[str]]] = []  # the queries of node lists

    def _next(self) -> str:
        self.rv += 1
        return str(self.rv)

    def put_lease(self, annotations: dict[str, str]) -> None:
        """The budget's Lease as if a daemon had written it, with these annotations."""
        with self.lock:
            self.leases[LEASE] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": LEASE,
                    "namespace": "gpuwatchd",
                    "resourceVersion": self._next(),
                    "annotations": annotations,
                },
                "spec": {},
            }

    def _node(self, name: str) -> dict[str, Any]:
        return {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "name": name,
                "uid": f"uid-{name}",
                "resourceVersion": self._next(),
                "labels": {"nvidia.com/gpu.present": "true"},
                "annotations": {},
            },
            "spec": {"taints": []},
            "status": {"conditions": []},
        }

    def cordoned(self) -> list[str]:
        return sorted(n for n, v in self.nodes.items() if v["spec"].get("unschedulable"))

    def handle(self, method: str, path: str, ctype: str, data: Any) -> tuple[int, Any]:
        url = urllib.parse.urlsplit(path)
        parts = url.path.split("/")
        with self.lock:
            if method == "GET" and url.path == "/api/v1/nodes":
                query = urllib.parse.parse_qs(url.query)
                self.node_lists.append(dict(query))
                assert query.pop("labelSelector") == ["nvidia.com/gpu.present=true"], query
                items = list(self.nodes.values())
                if query.pop("fieldSelector", None) == ["spec.unschedulable=true"]:
                    items = [i for i in items if i["spec"].get("unschedulable")]
                assert query == {}, query
                return 200, {"kind": "NodeList", "items": items}
            if url.path.startswith("/api/v1/nodes/"):
                node = self.nodes.get(parts[4])
                if node is None:
                    raise ContractError(404, "NotFound", path)
                if method == "GET" and len(parts) == 5:
                    return 200, node
                if method == "PATCH" and len(parts) == 5:
                    assert ctype == "application/json-patch+json"
                    new = apply_json_patch(node, data)  # the resourceVersion test included
                    new["metadata"]["resourceVersion"] = self._next()
                    self.nodes[parts[4]] = new
                    self.cordoned_most = max(self.cordoned_most, len(self.cordoned()))
                    return 200, new
                if method == "PATCH" and parts[5:] == ["status"]:
                    if data["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]:
                        raise ContractError(409, "Conflict", "the object has been modified")
                    node["status"]["conditions"] = data["status"]["conditions"]
                    node["metadata"]["resourceVersion"] = self._next()
                    return 200, node
            if method == "POST" and url.path == "/api/v1/namespaces/default/events":
                obj = data["involvedObject"]["name"]
                check_event(data, self.nodes[obj])
                self.events.append(data)
                return 201, data
            if url.path == LEASES and method == "POST":
                name = data["metadata"]["name"]
                if name in self.leases:
                    self.lease_conflicts += 1
                    raise ContractError(409, "AlreadyExists", name)
                lease = copy.deepcopy(data)
                lease["metadata"]["resourceVersion"] = self._next()
                self.leases[name] = lease
                return 201, lease
            if url.path.startswith(LEASES + "/"):
                name = parts[-1]
                lease = self.leases.get(name)
                if lease is None:
                    raise ContractError(404, "NotFound", name)
                if method == "GET":
                    return 200, lease
                if method == "PUT":
                    if self.rivals > 0:  # a rival's write went through first
                        self.rivals -= 1
                        lease["metadata"]["resourceVersion"] = self._next()
                        self.lease_conflicts += 1
                        raise ContractError(409, "Conflict", "the object has been modified")
                    if (
                        data["metadata"].get("resourceVersion")
                        != lease["metadata"]["resourceVersion"]
                    ):
                        self.lease_conflicts += 1
                        raise ContractError(409, "Conflict", "the object has been modified")
                    new = copy.deepcopy(data)
                    new["metadata"]["resourceVersion"] = self._next()
                    self.leases[name] = new
                    return 200, new
        raise ContractError(404, "NotFound", path)


@contextlib.contextmanager
def serving(cluster: Cluster) -> Iterator[int]:
    """The contract server for ``cluster`` on a free loopback port (also bench/fleet_lease.py)."""
    port = free_port()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _do(self) -> None:
            n = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(n) if n else b""
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                code, out = 401, {"kind": "Status", "code": 401}
            else:
                try:
                    code, out = cluster.handle(
                        self.command,
                        self.path,
                        self.headers.get("Content-Type", ""),
                        json.loads(body) if body else None,
                    )
                except ContractError as exc:
                    code, out = exc.code, {"kind": "Status", "message": str(exc)}
            raw = json.dumps(out).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_PATCH = do_POST = do_PUT = _do

    server = BackloggedServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield port
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def api() -> Iterator[tuple[Cluster, int]]:
    cluster = Cluster([f"gpu-{i:02d}" for i in range(NODES + 1)])
    with serving(cluster) as port:
        yield cluster, port


CLOCK = VirtualClock(time.time())  # moved to the wall clock when a test starts


def daemon(tmp_path: Path, node: str, port: int, url: str, fleet: str = "") -> ActionsSink:
    """The drain controller of ``node`` against the contract server on ``port``, with a
    budget of 10 % (``fleet``: more lines for ``drain.fleet``)."""
    work = tmp_path / node
    work.mkdir()
    kc = work / "kubeconfig"
    kc.write_text(
        f"""apiVersion: v1
kind: Config
current-context: gw
contexts: [{{name: gw, context: {{cluster: c1, user: gpuwatchd}}}}]
clusters: [{{name: c1, cluster: {{server: "http://127.0.0.1:{port}"}}}}]
users: [{{name: gpuwatchd, user: {{token: {TOKEN}}}}}]
"""
    )
    drain = f"""mode: kubernetes
resume: true
resume_hold: 0s
kubernetes: {{kubeconfig: {kc}}}
fleet:
  max_percent: 10
  selector: nvidia.com/gpu.present=true
  recheck: 1m
  jitter: 0s
{textwrap.indent(fleet, "  ")}"""
    return controller(tmp_path, node, drain_config(node, url, drain), CLOCK)


def test_fifty_daemons_take_exactly_the_budget_through_the_lease(
    api: tuple[Cluster, int], tmp_path: Path
) -> None:
    cluster, port = api
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    rx = HttpReceiver(free_port()).start()
    with cluster.lock:  # an admin's cordon, which is not gpuwatchd's and counts as such
        cluster.nodes["gpu-50"]["spec"]["unschedulable"] = True
    names = [f"gpu-{i:02d}" for i in range(NODES)]
    sinks = {n: daemon(tmp_path, n, port, rx.url) for n in names}
    try:
        for n, sink in sinks.items():
            sink.deliver([transition(at=CLOCK.now(), drain=True, node=n, xid=79)], CLOCK.now())
        at_once(list(sinks.values()))
        ours = [
            n
            for n in cluster.cordoned()
            if ANNOTATION in cluster.nodes[n]["metadata"]["annotations"]
        ]
        # 10 % of 51 nodes is 5: exactly five, never one more, even for a moment
        assert len(ours) == BUDGET, ours
        assert cluster.cordoned_most == BUDGET + 1  # + the admin's cordon
        assert cluster.nodes["gpu-50"]["metadata"]["annotations"] == {}
        places = json.loads(cluster.leases[LEASE]["metadata"]["annotations"][PLACES])
        assert sorted(places) == ours
        # issue 28: the annotations are read only from the cordoned nodes (a field selector),
        # never from a list of every Node object (tens of MB at 10,000 nodes)
        with_fields = [q for q in cluster.node_lists if "fieldSelector" in q]
        assert with_fields and len(with_fields) * 2 == len(cluster.node_lists)
        print(f"lease writes refused as stale: {cluster.lease_conflicts}")
        budget = alerts(rx, BUDGET_RULE)
        assert sorted(a["labels"]["node"] for a in budget) == sorted(set(names) - set(ours))
        missing = [
            a["annotations"]["summary"]
            for a in budget
            if "likely a software or driver event" not in a["annotations"]["summary"]
        ]
        assert missing == []
        drained_events = [e for e in cluster.events if e["reason"] == "GpuwatchdDrained"]
        assert sorted(e["involvedObject"]["name"] for e in drained_events) == ours

        # two recover and are uncordoned: their places go back, two waiting nodes drain
        for n in ours[:2]:
            sinks[n].deliver(
                [transition(state=AlertState.RESOLVED, seq=2, at=CLOCK.now(), node=n, xid=79)],
                CLOCK.now(),
            )
            sinks[n].run_pending()
        assert len(json.loads(cluster.leases[LEASE]["metadata"]["annotations"][PLACES])) == 3
        CLOCK.advance(61)
        at_once(list(sinks.values()))
        now_ours = [
            n
            for n in cluster.cordoned()
            if ANNOTATION in cluster.nodes[n]["metadata"]["annotations"]
        ]
        assert len(now_ours) == BUDGET and not set(now_ours) & set(ours[:2]), now_ours
        resumed = [e for e in cluster.events if e["reason"] == "GpuwatchdResumed"]
        assert sorted(e["involvedObject"]["name"] for e in resumed) == ours[:2]
    finally:
        for sink in sinks.values():
            sink.close()
        rx.stop()


def test_a_reload_that_sets_a_budget_applies_it(api: tuple[Cluster, int], tmp_path: Path) -> None:
    """SIGHUP's reload swaps the drain settings and driver: the budget follows them."""
    from gpuwatchd.actions.reload import prepare_reload
    from gpuwatchd.configfile.stages import for_actions

    cluster, port = api
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    rx = HttpReceiver(free_port()).start()
    with cluster.lock:  # five nodes already cordoned by gpuwatchd
        for i in range(5):
            node = cluster.nodes[f"gpu-{i:02d}"]
            node["spec"]["unschedulable"] = True
            node["metadata"]["annotations"][ANNOTATION] = json.dumps(
                {"reason": "gpuwatchd: XID 79 GPU 0", "cordoned": True, "taint": False}
            )
    sink = daemon(tmp_path, "gpu-10", port, rx.url)
    try:
        text = (tmp_path / "gpu-10" / "drain.yaml").read_text()
        assert "max_percent: 10" in text
        unlimited = tmp_path / "gpu-10" / "unlimited.yaml"
        unlimited.write_text(text.replace("  fleet:\n    max_percent: 10\n", "  fleet:\n"))
        before = load_config(str(unlimited), must_exist=True, environ={})
        assert not before.drain.fleet.enabled
        prepare_reload(sink, for_actions(before))()
        assert sink.drain is not None and sink.drain.fleet is None
        limited = load_config(str(tmp_path / "gpu-10" / "drain.yaml"), must_exist=True, environ={})
        prepare_reload(sink, for_actions(limited))()  # back to 10 %: five of 51 are used already
        sink.deliver([transition(at=CLOCK.now(), drain=True, node="gpu-10", xid=79)], CLOCK.now())
        sink.run_pending()
        assert cluster.nodes["gpu-10"]["spec"].get("unschedulable") is not True
        assert sink.status().as_json()["drain"]["fleet"]["held_back"] == 1
    finally:
        sink.close()
        rx.stop()


def test_budget_places_stamped_in_the_future_are_dropped(
    api: tuple[Cluster, int], tmp_path: Path
) -> None:
    """Issue 26: the budget's Lease holds five places stamped a year ahead (a node whose
    clock ran far ahead, or a hand edit) for nodes that are not cordoned. Failed on main: a
    place younger than its 5-minute grace is kept, and a future one is young for ever: the
    budget (5) stayed full and every drain was held back. Now a stamp more than 5 minutes
    ahead is not believed: those places are dropped and the XID 79 drains."""
    cluster, port = api
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    ahead = time.time() + 365 * 86400
    fake = {f"gpu-{i:02d}": {"at": ahead, "reason": "gpuwatchd: XID 79"} for i in range(40, 45)}
    cluster.put_lease({PLACES: json.dumps(fake)})
    rx = HttpReceiver(free_port()).start()
    sink = daemon(tmp_path, "gpu-00", port, rx.url)
    try:
        sink.deliver([transition(at=CLOCK.now(), drain=True, node="gpu-00", xid=79)], CLOCK.now())
        sink.run_pending()
        assert "gpu-00" in cluster.cordoned()
        places = json.loads(cluster.leases[LEASE]["metadata"]["annotations"][PLACES])
        assert sorted(places) == ["gpu-00"]
    finally:
        sink.close()
        rx.stop()


def test_a_daemon_that_keeps_losing_the_lease_race_backs_off_and_takes_its_place(
    api: tuple[Cluster, int],
) -> None:
    """Issue 28: at 1,000 concurrent stages one stage lost 24 Lease writes in a row (the
    limit was 32), each retried after at most 20 ms, in step with the crowd. Here the
    contract server lets a rival daemon's write go through first 40 times in a row: the
    daemon waits a random time in a window that doubles with each loss (capped at 1 s),
    then takes its place. Failed on main: no backoff, and it gave up after 32 tries."""
    cluster, port = api
    cluster.put_lease({PLACES: "{}"})
    with cluster.lock:
        cluster.rivals = 40
    waits: list[float] = []
    fleet = FleetDrainConfig(max_nodes=BUDGET, selector="nvidia.com/gpu.present=true")
    view = KubeFleetView(
        KubeClient(f"http://127.0.0.1:{port}", token=TOKEN),
        KubernetesDrainConfig(),
        fleet,
        time.time,
        sleep=waits.append,
        rng=random.Random(28),
    )
    taken, places = view.reserve("gpu-00", BUDGET, view.census(), "gpuwatchd: XID 79 GPU 0")
    assert taken and [p.node for p in places] == ["gpu-00"]
    assert view.lost == cluster.lease_conflicts == len(waits) == 40
    # each wait is drawn from its own window: 10 ms after the first loss, doubling, 1 s at most
    assert all(0.0 <= w <= min(1.0, 0.01 * 2**i) for i, w in enumerate(waits)), waits
    assert len(set(waits)) == len(waits)  # jittered, never in step
    assert max(waits[:3]) <= 0.04 and max(waits[10:]) > 0.1  # backs off as it keeps losing
    places_now = json.loads(cluster.leases[LEASE]["metadata"]["annotations"][PLACES])
    assert sorted(places_now) == ["gpu-00"]


def test_the_lease_backoff_window_grows_with_the_fleet() -> None:
    """More nodes, more daemons that may race for a place: the window stops doubling at
    1 s per 250 nodes (at least 1 s, at most 30 s). bench/fleet_lease.py at 1,000 stages:
    a 1 s cap lost 38,849 writes (43 in a row), 4 s lost 10,902 (14 in a row)."""
    for nodes, cap in ((52, 1.0), (1000, 4.0), (100_000, 30.0)):
        waits: list[float] = []
        view = KubeFleetView(
            KubeClient("http://127.0.0.1:9", token=TOKEN),  # never called
            KubernetesDrainConfig(),
            FleetDrainConfig(max_percent=10),
            time.time,
            sleep=waits.append,
            rng=random.Random(nodes),
        )
        view.nodes = nodes
        for lost in range(1, 41):
            view._lost(lost)
        assert all(w <= cap for w in waits), (nodes, max(waits))
        assert max(waits[-10:]) > cap / 2, (nodes, waits[-10:])  # it did reach the cap


def test_the_breaker_and_the_reset_through_the_lease(
    api: tuple[Cluster, int], tmp_path: Path
) -> None:
    """Issue 28 item 2 on Kubernetes: twelve nodes want to drain at once, the budget is 5:
    five take places, the first refused trips the breaker (the stop is written into the
    Lease with its resourceVersion, so exactly one node trips it and pages), and no node
    drains when places free up, until ``gpuwatchd fleet reset``."""
    import subprocess

    from conftest import GPUWATCHD, ROOT

    from gpuwatchd.actions.drain.drivers.kubernetes import STOP
    from gpuwatchd.actions.fleet import BREAKER_RULE

    cluster, port = api
    CLOCK.advance(max(0.0, time.time() - CLOCK.now()))
    rx = HttpReceiver(free_port()).start()
    names = [f"gpu-{i:02d}" for i in range(12)]
    sinks = {n: daemon(tmp_path, n, port, rx.url, "breaker: true") for n in names}
    try:
        for n, sink in sinks.items():
            sink.deliver([transition(at=CLOCK.now(), drain=True, node=n, xid=79)], CLOCK.now())
        at_once(list(sinks.values()))
        ours = cluster.cordoned()
        assert len(ours) == BUDGET, ours
        assert json.loads(cluster.leases[LEASE]["metadata"]["annotations"][STOP])["what"] == (
            "tripped"
        )
        breaker = alerts(rx, BREAKER_RULE)
        assert [a["status"] for a in breaker] == ["firing"], breaker
        assert "XID 79 on" in breaker[0]["annotations"]["summary"]

        for n in ours[:2]:  # two recover: their places go back, nobody takes them
            sinks[n].deliver(
                [transition(state=AlertState.RESOLVED, seq=2, at=CLOCK.now(), node=n, xid=79)],
                CLOCK.now(),
            )
            sinks[n].run_pending()
        CLOCK.advance(61)
        at_once(list(sinks.values()))
        assert len(cluster.cordoned()) == BUDGET - 2

        operator = tmp_path / "operator.yaml"
        operator.write_text(
            f"node_name: gpu-50\nstate_dir: {tmp_path / 'op'}\n"
            "drain:\n  mode: kubernetes\n"
            f"  kubernetes: {{kubeconfig: {tmp_path / 'gpu-00' / 'kubeconfig'}}}\n"
            "  fleet: {max_percent: 10, selector: nvidia.com/gpu.present=true}\n"
        )
        res = subprocess.run(
            [*GPUWATCHD, "fleet", "reset", "-c", str(operator)],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
        )  # fmt: skip
        assert res.returncode == 0 and "took the tripped mark off" in res.stdout, res
        assert STOP not in cluster.leases[LEASE]["metadata"]["annotations"]
        CLOCK.advance(121)  # held back twice: the next check within 2 x recheck
        at_once(list(sinks.values()))
        assert len(cluster.cordoned()) == BUDGET
    finally:
        for sink in sinks.values():
            sink.close()
        rx.stop()
