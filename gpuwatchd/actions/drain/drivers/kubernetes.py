"""Kubernetes drain: cordon, a taint and a node condition, through the API server.

Contract-tested only (against a local HTTP server that checks method, path, patch content
type and body the way the API server would); no API server runs on the test machines.

Drain: ``GET /api/v1/nodes/N``, then one JSON patch (``application/json-patch+json``)
that starts with ``{"op": "test", "path": "/metadata/resourceVersion"}`` - so nothing is
written if the node changed since we read it - and sets ``spec.unschedulable``, appends our
taint and records ownership in the annotation ``gpuwatchd.io/drain``. A node cordoned by
someone else is left alone (no taint, no annotation; never uncordoned later). The condition
goes to ``/api/v1/nodes/N/status`` as a strategic merge patch carrying
``metadata.resourceVersion`` as a precondition. A 409 re-reads and retries; so does a 422
when the node changed since it was read (a failed ``test``), while a 422 on an unchanged
node is the API refusing the content and fails the attempt with its message.

Each drain, re-drain and resume also creates a core/v1 Event about the node (``kubectl
describe node`` shows it); an Event that cannot be created is logged, never fails the drain.

Credentials: a kubeconfig file (``drain.kubernetes.kubeconfig``: token, token file or client
certificate; no exec plugins), else the in-cluster service account.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import random
import re
import shutil
import ssl
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import yaml

from gpuwatchd.actions.drain.drivers.base import DrainError, DrainResult, Driver, Gate
from gpuwatchd.actions.fleet import Census, Claim, FleetDrain, Mark, xid_of_reason
from gpuwatchd.config.actions import (
    DrainConfig,
    DriverSection,
    DriverSectionReader,
    FleetDrainConfig,
    read_absolute_path,
    read_driver_section,
)
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.clock import Clock

# the logger keeps the name it had as actions/kube.py
log = logging.getLogger("gpuwatchd.actions.kube")

ANNOTATION = "gpuwatchd.io/drain"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/strategic-merge-patch+json"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
CONFLICT_RETRIES = 4
TAINT_VALUE_MAX = 63
# A label value, which a taint value must be: empty, or alphanumeric at both ends.
_TAINT_VALUE_RE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


def taint_value(reason: str) -> str:
    """The reason as a taint value the API accepts (at most 63 characters, alphanumeric at
    both ends: truncating must not leave a ``-`` or ``.`` at the end)."""
    text = "".join(
        c if c.isalnum() and c.isascii() else c if c in "-_." else "-"
        for c in reason.split(":", 1)[-1].strip()
    )
    value = text.strip("-_.")[:TAINT_VALUE_MAX].rstrip("-_.")
    assert _TAINT_VALUE_RE.fullmatch(value), value
    return value


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _k8s_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_TAINT_KEY_RE = re.compile(
    r"(?:[a-z0-9]([-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_NAMESPACE_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_CONDITION_RE = re.compile(r"[A-Z][A-Za-z0-9]{0,62}")


@dataclass(frozen=True)
class KubernetesDrainConfig(DriverSection):
    """``drain.kubernetes``: credentials and what a drain writes on the Node."""

    kubeconfig: str | None = None
    taint: bool = True
    taint_key: str = "gpuwatchd.io/gpu-unhealthy"
    taint_effect: str = "NoSchedule"
    condition: bool = True
    condition_type: str = "GpuUnhealthy"
    events: bool = True
    event_namespace: str = "default"
    budget_namespace: str = "gpuwatchd"


def _read_value(r: Reader, key: str, node: Node, where: str) -> Any:
    if key in ("taint", "condition", "events"):
        return r.boolean(node, where)
    if key == "kubeconfig":
        return None if node.value is None else read_absolute_path(r, node, where)
    if key == "taint_effect":
        return r.string(node, where, TAINT_EFFECTS)
    value = r.string(node, where)
    if value is None:
        return None
    if key == "taint_key" and (len(value) > 316 or not _TAINT_KEY_RE.fullmatch(value)):
        problem = "is not a Kubernetes taint key"
    elif key in ("event_namespace", "budget_namespace") and not _NAMESPACE_RE.fullmatch(value):
        problem = "is not a Kubernetes namespace name"
    elif key == "condition_type" and not _CONDITION_RE.fullmatch(value):
        problem = "is not a condition type (CamelCase)"
    else:
        return value
    r.error(node.loc, f"{where}: {value!r} {problem}")
    return None


def _read_section(r: Reader, node: Node, what: str) -> KubernetesDrainConfig:
    return read_driver_section(r, node, KubernetesDrainConfig, what, _read_value)


class KubeClient:
    """Just enough of the core/v1 Node API, over httpx (transport injectable)."""

    def __init__(
        self,
        server: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        verify: ssl.SSLContext | bool = True,
        cert: tuple[str, str] | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        cleanup: str | None = None,
    ) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._token_file = token_file
        self._cleanup = cleanup
        self._client = httpx.Client(
            verify=verify, cert=cert, timeout=timeout, transport=transport, follow_redirects=False
        )

    @classmethod
    def from_config(
        cls,
        cfg: KubernetesDrainConfig,
        timeout: float,
        environ: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> KubeClient:
        env = os.environ if environ is None else environ
        if cfg.kubeconfig is None:
            host = env.get("KUBERNETES_SERVICE_HOST")
            port = env.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise DrainError(
                    "drain.kubernetes: no kubeconfig set and not in a cluster "
                    "($KUBERNETES_SERVICE_HOST is unset)"
                )
            host = f"[{host}]" if ":" in host else host
            ca = os.path.join(SA_DIR, "ca.crt")
            verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca)
            return cls(
                f"https://{host}:{port}",
                token_file=os.path.join(SA_DIR, "token"),
                verify=verify,
                timeout=timeout,
                transport=transport,
            )
        return cls._from_kubeconfig(cfg.kubeconfig, timeout, transport)

    @classmethod
    def _from_kubeconfig(
        cls, path: str, timeout: float, transport: httpx.BaseTransport | None
    ) -> KubeClient:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise DrainError(f"cannot read kubeconfig {path}: {exc}") from None
        base = os.path.dirname(path)

        def named(kind: str, name: str | None) -> dict[str, Any]:
            for item in doc.get(kind + "s") or []:
                if item.get("name") == name:
                    return dict(item.get(kind) or {})
            raise DrainError(f"kubeconfig {path}: no {kind} named {name!r}")

        ctx = named("context", doc.get("current-context"))
        cluster = named("cluster", ctx.get("cluster"))
        user = named("user", ctx.get("user")) if ctx.get("user") else {}
        if "exec" in user or "auth-provider" in user:
            raise DrainError(f"kubeconfig {path}: exec and auth-provider plugins are not supported")
        server = cluster.get("server")
        if not server:
            raise DrainError(f"kubeconfig {path}: the cluster has no server")
        tmp = tempfile.mkdtemp(prefix="gpuwatchd-kube-")

        def file_of(key: str, where: dict[str, Any]) -> str | None:
            if where.get(key + "-data"):
                out = os.path.join(tmp, key)
                fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(base64.b64decode(where[key + "-data"]))
                return out
            if where.get(key):
                p = str(where[key])
                return p if os.path.isabs(p) else os.path.join(base, p)
            return None

        verify: ssl.SSLContext | bool = True
        if cluster.get("insecure-skip-tls-verify"):
            verify = False
        else:
            ca = file_of("certificate-authority", cluster)
            if ca and str(server).startswith("https"):
                verify = ssl.create_default_context(cafile=ca)
        cert_file = file_of("client-certificate", user)
        key_file = file_of("client-key", user)
        token_file = user.get("tokenFile")
        if token_file and not os.path.isabs(token_file):
            token_file = os.path.join(base, token_file)
        return cls(
            str(server),
            token=user.get("token"),
            token_file=token_file,
            verify=verify,
            cert=(cert_file, key_file) if cert_file and key_file else None,
            timeout=timeout,
            transport=transport,
            cleanup=tmp,
        )

    def _headers(
        self, content_type: str | None = None, accept: str = "application/json"
    ) -> dict[str, str]:
        headers = {"Accept": accept, "User-Agent": "gpuwatchd"}
        token = self._token
        if self._token_file:  # service-account tokens rotate: read each time
            try:
                with open(self._token_file, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError as exc:
                raise DrainError(f"cannot read token {self._token_file}: {exc.strerror}") from None
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str | None = None,
        accept: str = "application/json",
    ) -> tuple[int, dict[str, Any]]:
        url = self.server + path
        try:
            resp = self._client.request(
                method,
                url,
                headers=self._headers(content_type, accept),
                content=None if body is None else json.dumps(body).encode(),
            )
        except httpx.HTTPError as exc:
            raise DrainError(
                f"kubernetes API {method} {path}: {type(exc).__name__}: {exc}"
            ) from None
        try:
            data = resp.json()
        except ValueError:
            data = {}
        return resp.status_code, data if isinstance(data, dict) else {}

    def node_path(self, name: str) -> str:
        return "/api/v1/nodes/" + urllib.parse.quote(name, safe="")

    def get_node(self, name: str) -> dict[str, Any]:
        status, data = self._call("GET", self.node_path(name))
        if status != 200:
            raise DrainError(f"GET node {name}: HTTP {status} {data.get('message', '')}".strip())
        return data

    def patch(self, path: str, body: Any, content_type: str) -> tuple[int, dict[str, Any]]:
        return self._call("PATCH", path, body, content_type)

    def post(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        return self._call("POST", path, body, "application/json")

    def get(self, path: str, accept: str = "application/json") -> tuple[int, dict[str, Any]]:
        return self._call("GET", path, accept=accept)

    def put(self, path: str, body: Any) -> tuple[int, dict[str, Any]]:
        return self._call("PUT", path, body, "application/json")

    def close(self) -> None:
        self._client.close()
        if self._cleanup:
            shutil.rmtree(self._cleanup, ignore_errors=True)


LEASE = "gpuwatchd-drain-budget"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
PLACES = "gpuwatchd.io/drained-nodes"
PLACE_TTL = 300.0  # seconds a place taken for a drain that never showed up is kept
MAX_CLOCK_SKEW = 300.0  # a place stamped further ahead than this is not believed
LEASE_RETRIES = 64  # each stale write means another daemon's went through
# after a write refused as stale: wait a random time in a window that doubles with each
# loss in a row (full jitter), so a crowd of daemons that lost together spreads out
# instead of racing again in step (issue 28: 1,000 stages, one lost 24 times in a row)
LEASE_BACKOFF = 0.01  # seconds: the window after the first loss
# the window stops doubling at 1 s per 250 nodes (more nodes, more daemons that may race),
# at least 1 s and at most 30 s (bench/fleet_lease.py: 1,000 stages lost 38,849 writes with
# a 1 s cap, 10,388 with 4 s)
LEASE_BACKOFF_NODES = 250.0
LEASE_BACKOFF_MAX = 30.0
STOP = "gpuwatchd.io/fleet-stop"  # in the Lease: the fleet's drains are stopped


def _stop_of(annotations: Mapping[str, Any]) -> Mark | None:
    try:
        raw = json.loads(annotations.get(STOP) or "null")
    except ValueError:
        return None
    if not isinstance(raw, dict) or raw.get("what") not in ("tripped", "paused"):
        return None
    at = raw.get("at")
    xid = raw.get("xid")
    return Mark(
        str(raw.get("node", ""))[:253],
        str(raw["what"]),
        float(at) if isinstance(at, int | float) else 0.0,
        str(xid) if isinstance(xid, int | str) and str(xid).isdigit() else None,
    )


class KubeFleetView:
    """The fleet as the API server sees it: one node list per census, and the budget's
    places in a Lease (``coordination.k8s.io/v1``) written only with the resourceVersion
    read, so two daemons can never both take the last place."""

    exclusive = True

    def __init__(
        self,
        client: KubeClient,
        cfg: KubernetesDrainConfig,
        fleet: FleetDrainConfig,
        wall: Any,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.client = client
        self.cfg = cfg
        self.fleet = fleet
        self.wall = wall
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.lost = 0  # Lease writes refused as stale, all told (a measure of contention)
        self.nodes = 0  # nodes in the last census
        ns = urllib.parse.quote(cfg.budget_namespace, safe="")
        self.leases = f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        self.stop: Mark | None = None  # the fleet stop in the Lease at the last read
        self.tripped = False  # the last reserve tripped the breaker (and wrote the stop)

    def _list(self, cordoned: bool) -> list[dict[str, Any]]:
        query = {"labelSelector": self.fleet.selector} if self.fleet.selector else {}
        accept = "application/json"
        if cordoned:  # only these need their annotations: the API server filters
            query["fieldSelector"] = "spec.unschedulable=true"
        else:  # a count: names only (metadata, not whole Node objects), where served
            accept = f"{METADATA_LIST}, application/json"
        path = "/api/v1/nodes" + ("?" + urllib.parse.urlencode(query) if query else "")
        status, data = self.client.get(path, accept)
        if status != 200:
            raise DrainError(f"GET nodes: HTTP {status} {data.get('message', '')}".strip())
        return [i for i in data.get("items") or [] if isinstance(i, dict)]

    def census(self, full: bool = True) -> Census:
        """The cordoned nodes (a field selector: at 10,000 nodes the list of every Node
        object is tens of MB) and a count of every node (metadata only)."""
        items = self._list(cordoned=True)
        nodes = self.nodes = len(self._list(cordoned=False))
        drains = []
        for item in items:
            meta = item.get("metadata") or {}
            note = (meta.get("annotations") or {}).get(ANNOTATION)
            if note is None or not (item.get("spec") or {}).get("unschedulable"):
                continue
            try:
                info = json.loads(note)
            except ValueError:
                info = {}
            at = info.get("at") if isinstance(info, dict) else None
            reason = info.get("reason", "") if isinstance(info, dict) else ""
            drains.append(
                FleetDrain(
                    str(meta.get("name", "")),
                    float(at) if isinstance(at, int | float) else None,
                    str(reason),
                )
            )
        return Census(nodes, tuple(sorted(drains, key=lambda d: d.node)))

    def _read(self) -> tuple[str | None, dict[str, dict[str, Any]]]:
        status, data = self.client.get(f"{self.leases}/{LEASE}")
        if status == 404:
            return None, {}
        if status != 200:
            raise DrainError(f"GET lease {LEASE}: HTTP {status} {data.get('message', '')}")
        meta = data.get("metadata") or {}
        self.stop = _stop_of(meta.get("annotations") or {})
        try:
            raw = json.loads((meta.get("annotations") or {}).get(PLACES, "{}"))
        except ValueError:
            raw = {}
        places: dict[str, dict[str, Any]] = {}
        for k, v in (raw if isinstance(raw, dict) else {}).items():
            at = v.get("at") if isinstance(v, dict) else None
            if isinstance(at, int | float):
                places[str(k)] = {"at": float(at), "reason": str(v.get("reason", ""))[:200]}
        return str(meta.get("resourceVersion", "")), places

    def _write(self, rv: str | None, places: dict[str, dict[str, Any]]) -> bool:
        """Write the places (and the stop, if any); False when someone else wrote first
        (read again)."""
        annotations = {PLACES: json.dumps(places, sort_keys=True)}
        if self.stop is not None:
            annotations[STOP] = json.dumps(
                {"what": self.stop.what, "node": self.stop.node, "at": self.stop.at,
                 "xid": self.stop.xid},
                sort_keys=True,
            )  # fmt: skip
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": LEASE,
                "namespace": self.cfg.budget_namespace,
                "annotations": annotations,
            },
            "spec": {},
        }
        if rv is None:
            status, data = self.client.post(self.leases, body)
        else:
            body["metadata"]["resourceVersion"] = rv
            status, data = self.client.put(f"{self.leases}/{LEASE}", body)
        if status in (200, 201):
            return True
        if status == 409:
            return False
        raise DrainError(f"write lease {LEASE}: HTTP {status} {data.get('message', '')}")

    def _lost(self, times: int) -> None:
        """Our Lease write lost to another daemon's for the ``times``-th time in a row: back
        off before reading again."""
        self.lost += 1
        cap = min(LEASE_BACKOFF_MAX, max(1.0, self.nodes / LEASE_BACKOFF_NODES))
        window = min(cap, LEASE_BACKOFF * 2.0 ** (times - 1))
        self.sleep(self.rng.uniform(0.0, window))

    def reserve(
        self, node: str, limit: int, census: Census, reason: str
    ) -> tuple[bool, tuple[FleetDrain, ...]]:
        drained = {d.node for d in census.drains}
        self.tripped = False
        self.nodes = census.nodes

        def listed(places: dict[str, dict[str, Any]]) -> tuple[FleetDrain, ...]:
            return tuple(FleetDrain(n, p["at"], p["reason"]) for n, p in sorted(places.items()))

        for attempt in range(1, LEASE_RETRIES + 1):
            rv, places = self._read()
            now = float(self.wall())
            # a place stays while its node is cordoned by gpuwatchd (and, with a
            # fleet.window, is younger than it), or briefly before the cordon shows
            oldest = now - self.fleet.window if self.fleet.window is not None else -1.0
            # a stamp from the future (a node's clock far ahead, or written by hand) would
            # keep its place for ever and block every other drain: beyond MAX_CLOCK_SKEW it
            # is not believed; the place is dropped, or counts from now if its node is
            # really cordoned
            ahead = now + MAX_CLOCK_SKEW
            kept = {}
            for n, p in places.items():
                if p["at"] > ahead:
                    if n in drained:
                        kept[n] = {**p, "at": now}
                elif (n in drained and p["at"] >= oldest) or p["at"] > now - PLACE_TTL:
                    kept[n] = p
            # cordons the Lease does not know (made before the budget was set): they count
            for d in census.drains:
                since = d.since if d.since is not None and d.since <= ahead else now
                if d.node not in kept and since >= oldest:
                    kept[d.node] = {"at": since, "reason": d.reason}
            if node in kept:
                return True, listed(kept)
            if self.stop is not None:  # the fleet is stopped: no new place
                return False, listed(kept)
            if len(kept) >= limit:
                if self.fleet.breaker:  # more want to drain than the budget: trip it
                    self.stop = Mark(node, "tripped", now, xid_of_reason(reason))
                    if not self._write(rv, kept):
                        self.stop = None
                        self._lost(attempt)
                        continue  # someone else wrote first: read again (they may have)
                    self.tripped = True
                elif kept != places:
                    self._write(rv, kept)  # tidy up; a lost race here changes nothing
                return False, listed(kept)
            kept[node] = {"at": now, "reason": reason}
            if self._write(rv, kept):
                return True, listed(kept)
            self._lost(attempt)
        raise DrainError(f"lease {LEASE} kept changing; gave up after {LEASE_RETRIES} tries")

    def release(self, node: str) -> None:
        for attempt in range(1, LEASE_RETRIES + 1):
            rv, places = self._read()
            if node not in places:
                return
            del places[node]
            if self._write(rv, places):
                return
            self._lost(attempt)
        raise DrainError(f"lease {LEASE} kept changing; gave up after {LEASE_RETRIES} tries")

    def write_claim(self, node: str, claim: Claim | None) -> None:
        raise NotImplementedError("the Lease is the claim: reserve and release")

    def write_mark(self, node: str, mark: Mark | None) -> None:
        """Stop the fleet (a pause, a tripped breaker) or, with None, take the stop off:
        in the Lease, next to the places."""
        for attempt in range(1, LEASE_RETRIES + 1):
            rv, places = self._read()
            if mark is None and self.stop is None:
                return
            self.stop = mark
            if self._write(rv, places):
                return
            self._lost(attempt)
        raise DrainError(f"lease {LEASE} kept changing; gave up after {LEASE_RETRIES} tries")

    def marks(self) -> tuple[Mark, ...]:
        """The stop as the Lease has it now."""
        self._read()
        return (self.stop,) if self.stop is not None else ()


class KubernetesDriver:
    mode = "kubernetes"
    reads_state = True

    def __init__(
        self, client: KubeClient, node: str, cfg: KubernetesDrainConfig, clock_now: Any
    ) -> None:
        self.client = client
        self.node = node
        self.cfg = cfg
        self._now = clock_now

    def fleet_view(self, fleet: FleetDrainConfig) -> KubeFleetView:
        return KubeFleetView(self.client, self.cfg, fleet, time.time)

    def _taint(self, reason: str) -> dict[str, str]:
        return {
            "key": self.cfg.taint_key,
            "value": taint_value(reason),
            "effect": self.cfg.taint_effect,
        }

    def _changed_since(self, rv: str) -> bool:
        """After a 422: did the node change since we read it (a failed ``test``)?"""
        current = self.client.get_node(self.node)
        return str((current.get("metadata") or {}).get("resourceVersion", "")) != rv

    def _refused(self, status: int, data: dict[str, Any], what: str) -> DrainError:
        return DrainError(f"{what} node {self.node}: HTTP {status} {data.get('message', '')}")

    def event(self, node: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        """A core/v1 Event about the node; a failure is logged, never raised."""
        if not self.cfg.events:
            return
        meta = node.get("metadata") or {}
        now = _k8s_time(self._now())
        ns = self.cfg.event_namespace
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{self.node}.gpuwatchd.{uuid.uuid4().hex[:12]}",
                "namespace": ns,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Node",
                "name": self.node,
                "uid": str(meta.get("uid") or self.node),
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "gpuwatchd", "host": self.node},
            "reportingComponent": "gpuwatchd",
            "reportingInstance": self.node,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        path = f"/api/v1/namespaces/{urllib.parse.quote(ns, safe='')}/events"
        try:
            status, data = self.client.post(path, body)
        except DrainError as exc:
            log.warning("kubernetes event %s for %s not created: %s", reason, self.node, exc)
            return
        if status not in (200, 201):
            log.warning(
                "kubernetes event %s for %s not created: HTTP %d %s",
                reason,
                self.node,
                status,
                data.get("message", ""),
            )

    def _condition(self, rv: str, fault: bool, message: str) -> None:
        if not self.cfg.condition:
            return
        path = self.client.node_path(self.node) + "/status"
        now = _k8s_time(self._now())
        for _ in range(CONFLICT_RETRIES):
            body = {
                "metadata": {"resourceVersion": rv},
                "status": {
                    "conditions": [
                        {
                            "type": self.cfg.condition_type,
                            "status": "True" if fault else "False",
                            "reason": "GpuwatchdDrained" if fault else "GpuwatchdHealthy",
                            "message": message[:1024],
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ]
                },
            }
            status, data = self.client.patch(path, body, MERGE_PATCH)
            if status == 200:
                return
            if status not in (409, 422):
                raise DrainError(
                    f"PATCH node {self.node} status: HTTP {status} {data.get('message', '')}"
                )
            rv = str(self.client.get_node(self.node)["metadata"]["resourceVersion"])
        raise DrainError(
            f"PATCH node {self.node} status: still conflicting after {CONFLICT_RETRIES} tries"
        )

    def hold(self, reason: str, *, gate: Gate | None = None) -> DrainResult | None:
        node = self.client.get_node(self.node)
        if (node.get("spec") or {}).get("unschedulable"):
            return None
        # Someone uncordoned the node while the fault is still active: cordon it again.
        result = self.drain({}, reason, False, gate=gate, reasserting=True)
        if result.result != "drained":
            return result
        return DrainResult("reasserted", result.detail + " again (uncordoned while faulty)")

    def drain(
        self,
        incident: Mapping[str, Any],
        reason: str,
        dry_run: bool,
        *,
        gate: Gate | None = None,
        reasserting: bool = False,
    ) -> DrainResult:
        for _ in range(CONFLICT_RETRIES):
            node = self.client.get_node(self.node)
            meta = node.get("metadata") or {}
            spec = node.get("spec") or {}
            rv = str(meta.get("resourceVersion", ""))
            annotations = meta.get("annotations") or {}
            if ANNOTATION in annotations and spec.get("unschedulable"):
                return DrainResult("already", "node is cordoned by gpuwatchd")
            if spec.get("unschedulable") and ANNOTATION not in annotations:
                if not dry_run:
                    self._condition(
                        rv, True, reason + " (node was already cordoned by someone else)"
                    )
                return DrainResult("kept_admin", "node was cordoned by someone else; left as is")
            refusal = gate() if gate is not None else None
            if refusal:
                return DrainResult("over_budget", refusal)
            if dry_run:
                return DrainResult(
                    "dry_run", f"would cordon {self.node} and taint {self.cfg.taint_key}"
                )
            taints = list(spec.get("taints") or [])
            add_taint = self.cfg.taint and not any(
                t.get("key") == self.cfg.taint_key for t in taints
            )
            # our record of an earlier cordon (an operator uncordoned, we cordon again): a
            # taint that record says is ours stays ours, so that the resume takes it off
            try:
                before = json.loads(annotations.get(ANNOTATION) or "{}")
            except ValueError:
                before = {}
            kept = (
                isinstance(before, dict)
                and before.get("taint") is True
                and any(t.get("key") == self.cfg.taint_key for t in taints)
            )
            record = json.dumps(
                {
                    "reason": reason,
                    "cordoned": True,
                    "taint": add_taint or kept,
                    "at": self._now(),
                },
                sort_keys=True,
            )
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
                {"op": "add", "path": "/spec/unschedulable", "value": True},
            ]
            if "annotations" in meta and isinstance(meta["annotations"], dict):
                ops.append(
                    {
                        "op": "add",
                        "path": "/metadata/annotations/" + _pointer(ANNOTATION),
                        "value": record,
                    }
                )
            else:
                ops.append(
                    {"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: record}}
                )
            if add_taint:
                taint = self._taint(reason)
                if "taints" in spec and isinstance(spec["taints"], list):
                    ops.append({"op": "add", "path": "/spec/taints/-", "value": taint})
                else:
                    ops.append({"op": "add", "path": "/spec/taints", "value": [taint]})
            status, data = self.client.patch(self.client.node_path(self.node), ops, JSON_PATCH)
            if status == 409 or (status == 422 and self._changed_since(rv)):
                continue
            if status != 200:
                raise self._refused(status, data, "PATCH")
            new_rv = str((data.get("metadata") or {}).get("resourceVersion", rv))
            self._condition(new_rv, True, reason)
            self.event(
                data or node,
                "GpuwatchdReasserted" if reasserting else "GpuwatchdDrained",
                f"{reason}: cordoned"
                + (f" and tainted {self.cfg.taint_key}" if add_taint else "")
                + (" again (it was uncordoned while the fault is active)" if reasserting else ""),
                True,
            )
            return DrainResult(
                "drained",
                f"cordoned {self.node}" + (f", tainted {self.cfg.taint_key}" if add_taint else ""),
            )
        raise DrainError(f"node {self.node} kept changing; gave up after {CONFLICT_RETRIES} tries")

    def resume(self, incident: Mapping[str, Any] | None, dry_run: bool) -> DrainResult:
        for _ in range(CONFLICT_RETRIES):
            node = self.client.get_node(self.node)
            meta = node.get("metadata") or {}
            spec = node.get("spec") or {}
            rv = str(meta.get("resourceVersion", ""))
            annotations = meta.get("annotations") or {}
            if ANNOTATION not in annotations:
                return DrainResult(
                    "not_ours", "no gpuwatchd.io/drain annotation: not cordoned by gpuwatchd"
                )
            try:
                info = json.loads(annotations[ANNOTATION])
            except ValueError:
                info = {}
            if dry_run:
                return DrainResult("dry_run", f"would uncordon {self.node}")
            ops: list[dict[str, Any]] = [
                {"op": "test", "path": "/metadata/resourceVersion", "value": rv}
            ]
            if info.get("cordoned", True) and spec.get("unschedulable"):
                ops.append({"op": "add", "path": "/spec/unschedulable", "value": False})
            if info.get("taint", True):
                for i, t in enumerate(spec.get("taints") or []):
                    if t.get("key") == self.cfg.taint_key:
                        ops.append(
                            {
                                "op": "test",
                                "path": f"/spec/taints/{i}/key",
                                "value": self.cfg.taint_key,
                            }
                        )
                        ops.append({"op": "remove", "path": f"/spec/taints/{i}"})
                        break
            ops.append({"op": "remove", "path": "/metadata/annotations/" + _pointer(ANNOTATION)})
            status, data = self.client.patch(self.client.node_path(self.node), ops, JSON_PATCH)
            if status == 409 or (status == 422 and self._changed_since(rv)):
                continue
            if status != 200:
                raise self._refused(status, data, "PATCH")
            new_rv = str((data.get("metadata") or {}).get("resourceVersion", rv))
            self._condition(new_rv, False, "gpuwatchd: GPU faults resolved; node uncordoned")
            self.event(
                data or node,
                "GpuwatchdResumed",
                f"gpuwatchd: GPU faults resolved; uncordoned ({info.get('reason', 'no reason')})",
                False,
            )
            return DrainResult("resumed", f"uncordoned {self.node}")
        raise DrainError(f"node {self.node} kept changing; gave up after {CONFLICT_RETRIES} tries")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.close()


class KubernetesKind:
    mode = "kubernetes"
    reader = DriverSectionReader(KubernetesDrainConfig, _read_section)

    def build(self, cfg: DrainConfig, node: str, clock: Clock) -> Driver:
        section = cfg.section("kubernetes", KubernetesDrainConfig)
        client = KubeClient.from_config(section, cfg.timeout)
        return KubernetesDriver(client, node, section, clock.now)


KIND = KubernetesKind()
