"""Kubernetes drain, contract-tested against a local HTTP server that checks every request
the way the API server would: method, path, bearer token, patch content type, JSON-patch
``test`` of resourceVersion, strategic-merge precondition on /status. (No API server can
run on the test machines; docs/actions.md says this mode is contract-tested only.)"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from actions_support import make_config, sink_for, transition
from conftest import free_port
from kubernetes_support import LABEL_VALUE, TOKEN, ContractError, apply_json_patch, check_event

from gpuwatchd.actions.drain.drivers.kubernetes import ANNOTATION
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock

NODE = "gpu-node-17"
TAINT_KEY = "gpuwatchd.io/gpu-unhealthy"


# A taint value is a label value: at most 63 characters, alphanumeric at both ends.


@dataclass
class FakeApiServer:
    node: dict[str, Any]
    port: int = field(default_factory=free_port)
    calls: list[tuple[str, str, str, Any]] = field(default_factory=list)
    interfere: list[dict[str, Any]] = field(
        default_factory=list
    )  # JSON patches another writer applies
    lock: threading.Lock = field(default_factory=threading.Lock)
    token: str = TOKEN
    events: list[dict[str, Any]] = field(default_factory=list)

    def bump(self) -> None:
        meta = self.node["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def handle(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, Any]:
        if headers.get("authorization") != f"Bearer {self.token}":
            return 401, {"kind": "Status", "reason": "Unauthorized", "code": 401}
        base = f"/api/v1/nodes/{NODE}"
        ctype = headers.get("content-type", "")
        data = json.loads(body) if body else None
        with self.lock:
            self.calls.append((method, path, ctype, data))
            try:
                if method == "GET" and path == base:
                    return 200, self.node
                if method == "PATCH" and path == base:
                    if ctype != "application/json-patch+json":
                        raise ContractError(415, "UnsupportedMediaType", ctype)
                    if not isinstance(data, list) or data[0] != {
                        "op": "test",
                        "path": "/metadata/resourceVersion",
                        "value": self.node["metadata"]["resourceVersion"],
                    }:
                        raise ContractError(
                            422, "Invalid", "test of resourceVersion missing or failed"
                        )
                    new = apply_json_patch(self.node, data)
                    for taint in new["spec"].get("taints") or []:
                        if not LABEL_VALUE.fullmatch(str(taint.get("value", ""))):
                            raise ContractError(
                                422, "Invalid", f"spec.taints.value: Invalid value: {taint}"
                            )
                    if "status" in data[0]["path"] or any(
                        op["path"].startswith("/status") for op in data
                    ):
                        raise ContractError(422, "Invalid", "status through the main resource")
                    self.node = new
                    self.bump()
                    self._interfere()
                    return 200, self.node
                if method == "PATCH" and path == base + "/status":
                    if ctype != "application/strategic-merge-patch+json":
                        raise ContractError(415, "UnsupportedMediaType", ctype)
                    rv = (data.get("metadata") or {}).get("resourceVersion")
                    if rv != self.node["metadata"]["resourceVersion"]:
                        raise ContractError(409, "Conflict", "the object has been modified")
                    if set(data) - {"metadata", "status"} or set(data["status"]) != {"conditions"}:
                        raise ContractError(422, "Invalid", "only conditions may change")
                    conds = {c["type"]: c for c in self.node["status"].get("conditions", [])}
                    for c in data["status"]["conditions"]:
                        assert set(c) == {
                            "type",
                            "status",
                            "reason",
                            "message",
                            "lastHeartbeatTime",
                            "lastTransitionTime",
                        }
                        assert c["status"] in ("True", "False")
                        conds[c["type"]] = c
                    self.node["status"]["conditions"] = list(conds.values())
                    self.bump()
                    return 200, self.node
                if method == "POST" and path == "/api/v1/namespaces/default/events":
                    check_event(data, self.node)
                    self.events.append(data)
                    return 201, data
                raise ContractError(404, "NotFound", path)
            except ContractError as exc:
                return exc.code, {
                    "kind": "Status",
                    "reason": exc.reason,
                    "message": str(exc),
                    "code": exc.code,
                }

    def _interfere(self) -> None:
        pass

    def start(self) -> FakeApiServer:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _do(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                if (
                    self.command == "GET" and outer.interfere
                ):  # another controller writes between our GET and PATCH
                    with outer.lock:
                        patch = outer.interfere.pop(0)
                        outer.node = apply_json_patch(outer.node, patch)
                        outer.bump()
                        snapshot = copy.deepcopy(outer.node)
                    with outer.lock:
                        outer.calls.append(("GET", self.path, "", None))
                    code, out = 200, snapshot
                    # the reader got the node before the other write: hand out the old version
                    out["metadata"]["resourceVersion"] = str(
                        int(out["metadata"]["resourceVersion"]) - 1
                    )
                else:
                    code, out = outer.handle(
                        self.command,
                        self.path,
                        {k.lower(): v for k, v in self.headers.items()},
                        body,
                    )
                raw = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = _do
            do_PATCH = _do
            do_PUT = _do
            do_POST = _do
            do_DELETE = _do

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def writes(self) -> list[tuple[str, str, str, Any]]:
        return [c for c in self.calls if c[0] != "GET"]


def node_object(**spec: Any) -> dict[str, Any]:
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": NODE,
            "resourceVersion": "100",
            "labels": {"kubernetes.io/hostname": NODE},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
            **spec,
        },
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "ok",
                    "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        },
    }


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(node_object()).start()
    yield server
    server.stop()


def kube_config(
    tmp_path: Path, api: FakeApiServer, token_line: str = f"token: {TOKEN}", extra: str = ""
) -> object:
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        f"""apiVersion: v1
kind: Config
current-context: gw
contexts:
  - name: gw
    context: {{cluster: c1, user: gpuwatchd}}
clusters:
  - name: c1
    cluster: {{server: "http://127.0.0.1:{api.port}"}}
users:
  - name: gpuwatchd
    user:
      {token_line}
"""
    )
    return make_config(
        tmp_path,
        f"""drain:
  mode: kubernetes
  node: {NODE}
  resume: true
  resume_hold: 0s
  state_file: null
  kubernetes:
    kubeconfig: {kc}
{extra}""",
        name="k8s.yaml",
    )


def test_drain_cordons_taints_annotates_and_sets_condition(
    tmp_path: Path, api: FakeApiServer
) -> None:
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert [c[0] for c in api.calls] == ["GET", "PATCH", "PATCH", "POST"]
        (event,) = api.events
        assert event["reason"] == "GpuwatchdDrained" and event["type"] == "Warning"
        assert event["message"].startswith("gpuwatchd: XID 79 GPU 3 00000000:3E:00.0: cordoned")
        _, path, ctype, ops = api.calls[1]
        assert path == f"/api/v1/nodes/{NODE}" and ctype == "application/json-patch+json"
        record = json.loads(ops[2]["value"])
        assert (
            record["reason"] == "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"
            and record["cordoned"] is True
        )
        assert ops == [
            {"op": "test", "path": "/metadata/resourceVersion", "value": "100"},
            {"op": "add", "path": "/spec/unschedulable", "value": True},
            {
                "op": "add",
                "path": "/metadata/annotations/gpuwatchd.io~1drain",
                "value": ops[2]["value"],
            },
            {
                "op": "add",
                "path": "/spec/taints/-",
                "value": {
                    "key": TAINT_KEY,
                    "value": "XID-79-GPU-3-00000000-3E-00.0",
                    "effect": "NoSchedule",
                },
            },
        ]
        _, path, ctype, body = api.calls[2]
        assert path == f"/api/v1/nodes/{NODE}/status"
        assert ctype == "application/strategic-merge-patch+json"
        assert body["metadata"] == {"resourceVersion": "101"}
        (cond,) = body["status"]["conditions"]
        assert cond == {
            "type": "GpuUnhealthy",
            "status": "True",
            "reason": "GpuwatchdDrained",
            "message": "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        node = api.node
        assert node["spec"]["unschedulable"] is True
        assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", TAINT_KEY]
        assert ANNOTATION in node["metadata"]["annotations"]
        assert {c["type"] for c in node["status"]["conditions"]} == {"Ready", "GpuUnhealthy"}
        # resolve -> resume: our taint, cordon and annotation go; everything else stays
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        node = api.node
        assert node["spec"]["unschedulable"] is False
        assert node["spec"]["taints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]
        assert ANNOTATION not in node["metadata"]["annotations"]
        assert node["metadata"]["annotations"]["node.alpha.kubernetes.io/ttl"] == "0"
        gpu = next(c for c in node["status"]["conditions"] if c["type"] == "GpuUnhealthy")
        assert gpu["status"] == "False" and gpu["reason"] == "GpuwatchdHealthy"
        assert [(e["reason"], e["type"]) for e in api.events] == [
            ("GpuwatchdDrained", "Warning"),
            ("GpuwatchdResumed", "Normal"),
        ]
        _, _, ctype, ops = api.writes()[3]
        assert ctype == "application/json-patch+json"
        assert ops[0]["op"] == "test" and ops[0]["path"] == "/metadata/resourceVersion"
        assert {"op": "test", "path": "/spec/taints/1/key", "value": TAINT_KEY} in ops
        assert {"op": "remove", "path": "/spec/taints/1"} in ops
    finally:
        sink.close()


def test_someone_elses_cordon_is_never_touched(tmp_path: Path) -> None:
    api = FakeApiServer(node_object(unschedulable=True)).start()
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        spec_writes = [c for c in api.writes() if c[1] == f"/api/v1/nodes/{NODE}"]
        assert spec_writes == []  # no cordon, no taint, no ownership
        assert sink.status().as_json()["drain"]["incidents"][0]["state"] == "kept_admin"
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert [c for c in api.writes() if c[1] == f"/api/v1/nodes/{NODE}"] == []
        assert api.node["spec"]["unschedulable"] is True  # still cordoned by its owner
    finally:
        sink.close()
        api.stop()


def test_conflicting_write_is_retried_from_a_fresh_read(tmp_path: Path) -> None:
    api = FakeApiServer(node_object()).start()
    # another controller adds a label between our GET and our PATCH, once
    api.interfere.append([{"op": "add", "path": "/metadata/labels/team", "value": "ml"}])
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        patches = [c for c in api.calls if c[0] == "PATCH" and c[1] == f"/api/v1/nodes/{NODE}"]
        assert len(patches) == 2  # the first was refused (stale resourceVersion), then re-read
        assert api.node["metadata"]["labels"]["team"] == "ml"  # the other writer's change stays
        assert api.node["spec"]["unschedulable"] is True
        assert sink.status().as_json()["drain"]["state"] == "drained"
    finally:
        sink.close()
        api.stop()


def test_manual_uncordon_is_respected_on_resume(tmp_path: Path, api: FakeApiServer) -> None:
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        with api.lock:  # an operator uncordons by hand (kubectl uncordon)
            api.node["spec"]["unschedulable"] = False
            api.bump()
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        ops = api.writes()[-3][3]
        assert not any(op["path"] == "/spec/unschedulable" for op in ops)
        assert ANNOTATION not in api.node["metadata"]["annotations"]
        assert [t["key"] for t in api.node["spec"]["taints"]] == ["nvidia.com/gpu"]
    finally:
        sink.close()


def test_token_file_is_read_on_every_request(tmp_path: Path, api: FakeApiServer) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("old-token\n")
    api.token = "old-token"
    clock = VirtualClock(1_767_225_600.0)
    cfg = kube_config(tmp_path, api, token_line=f"tokenFile: {token_file}")
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert api.node["spec"]["unschedulable"] is True
        token_file.write_text("new-token\n")  # the kubelet rotated the projected token
        api.token = "new-token"
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert api.node["spec"]["unschedulable"] is False
    finally:
        sink.close()


def test_unauthorized_is_retried_then_fails_with_a_page(tmp_path: Path, api: FakeApiServer) -> None:
    api.token = "something-else"
    clock = VirtualClock(1_767_225_600.0)
    cfg = kube_config(tmp_path, api, extra="  attempts: 2\n")
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        # not an XID: an XID's drain is never given up (test_actions_drain.py)
        sink.deliver([transition("gpu_lost", at=clock.now(), drain=True, xid=None)], clock.now())
        sink.run_pending()
        inc = sink.status().as_json()["drain"]["incidents"][0]
        assert inc["state"] == "pending" and inc["attempts"] == 1
        clock.advance(600)
        sink.run_pending()
        drain = sink.status().as_json()["drain"]
        assert drain["incidents"][0]["state"] == "failed"
        assert "HTTP 401" in (drain["last_error"] or "")
        firing = sink.status().as_json()["deliveries"]["firing"]
        assert [a["rule"] for a in firing] == ["gpu_lost", "GpuwatchdDrainFailed"]
        assert time.time() > 0
    finally:
        sink.close()


def test_taint_value_cut_to_63_characters_never_ends_in_a_dash(tmp_path: Path) -> None:
    """Issue 15.14: a reason whose taint value, cut to 63 characters, ended in ``-`` or
    ``.`` was refused by the API (422), retried as a conflict and never cordoned. Fails on
    the old code: the node stays schedulable and the drain attempt fails."""
    api = FakeApiServer(node_object()).start()
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    # "gpuwatchd: <rule> GPU 3 ..." with a rule name that puts a space at character 63
    rule = "gpu_" + "x" * 58
    try:
        fire = transition(rule, at=clock.now(), drain=True, xid=None)
        sink.deliver([fire], clock.now())
        sink.run_pending()
        assert api.node["spec"]["unschedulable"] is True
        (taint,) = [t for t in api.node["spec"]["taints"] if t["key"] == TAINT_KEY]
        assert taint["value"] == rule  # not rule + "-"
        assert len(taint["value"]) <= 63 and taint["value"][-1].isalnum()
        assert sink.status().as_json()["drain"]["state"] == "drained"
    finally:
        sink.close()
        api.stop()


def test_a_422_on_an_unchanged_node_is_not_retried_as_a_conflict(tmp_path: Path) -> None:
    """A 422 that is not a failed resourceVersion test fails the attempt with the API's
    message at once (one PATCH), instead of four conflict retries."""
    api = FakeApiServer(node_object()).start()
    api.node["spec"]["taints"].append({"key": "bad", "value": "ends-with-", "effect": "NoSchedule"})
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        patches = [c for c in api.calls if c[0] == "PATCH"]
        assert len(patches) == 1
        assert "spec.taints.value: Invalid value" in sink.status().as_json()["drain"]["last_error"]
    finally:
        sink.close()
        api.stop()


def test_an_event_the_api_refuses_does_not_fail_the_drain(tmp_path: Path) -> None:
    api = FakeApiServer(node_object()).start()
    clock = VirtualClock(1_767_225_600.0)
    cfg = kube_config(tmp_path, api, extra="    event_namespace: elsewhere\n")
    sink = sink_for(cfg, clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert api.events == []  # 404 for that namespace: logged, not fatal
        assert api.node["spec"]["unschedulable"] is True
        assert sink.status().as_json()["drain"]["state"] == "drained"
    finally:
        sink.close()
        api.stop()


def test_an_uncordon_while_the_fault_is_active_is_undone(
    tmp_path: Path, api: FakeApiServer
) -> None:
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        with api.lock:  # kubectl uncordon while GPU 3 is still lost
            api.node["spec"]["unschedulable"] = False
            api.bump()
        clock.advance(31)  # drain.hold_interval
        sink.run_pending()
        assert api.node["spec"]["unschedulable"] is True
        assert [t["key"] for t in api.node["spec"]["taints"]] == ["nvidia.com/gpu", TAINT_KEY]
        assert [e["reason"] for e in api.events] == ["GpuwatchdDrained", "GpuwatchdReasserted"]
        clock.advance(31)
        sink.run_pending()  # cordoned: nothing more to do
        assert len(api.events) == 2
    finally:
        sink.close()


def test_a_resume_after_a_reasserted_cordon_takes_our_taint_off(
    tmp_path: Path, api: FakeApiServer
) -> None:
    """Issue 24: an operator uncordons during the incident, gpuwatchd cordons again (its
    taint still there), and later resumes: on main the re-cordon recorded the taint as not
    its own ("taint": false, it was present already), so the resume left gpuwatchd's
    NoSchedule taint on the node (status said resumed, pods could not schedule)."""
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(kube_config(tmp_path, api), clock)  # type: ignore[arg-type]
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        with api.lock:  # kubectl uncordon while GPU 3 is still lost
            api.node["spec"]["unschedulable"] = False
            api.bump()
        clock.advance(31)  # drain.hold_interval: cordoned again
        sink.run_pending()
        assert api.node["spec"]["unschedulable"] is True
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert sink.status().as_json()["drain"]["state"] == "ok"
        assert not api.node["spec"].get("unschedulable")
        assert [t["key"] for t in api.node["spec"]["taints"]] == ["nvidia.com/gpu"]
    finally:
        sink.close()
