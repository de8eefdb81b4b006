"""The Kubernetes manifests: structure, mounts, RBAC, and a config the daemon accepts.

No API server here (``kubectl apply --dry-run=client`` needs one), so the structure a
server would check is checked with PyYAML, and the ConfigMap's config goes through the
daemon's own loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from conftest import ROOT

from gpuwatchd.configfile.loader import load_config

K8S = ROOT / "packaging" / "kubernetes"


def docs(name: str) -> list[dict[str, Any]]:
    out = [d for d in yaml.safe_load_all((K8S / name).read_text()) if d is not None]
    for d in out:
        assert {"apiVersion", "kind", "metadata"} <= set(d), d
        assert d["metadata"].get("name"), d
    return out


def by_kind(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in items}


def test_rbac() -> None:
    items = by_kind(docs("rbac.yaml"))
    assert items["Namespace"]["apiVersion"] == "v1"
    sa = items["ServiceAccount"]
    assert sa["apiVersion"] == "v1" and sa["metadata"]["namespace"] == "gpuwatchd"
    role = items["ClusterRole"]
    assert role["apiVersion"] == "rbac.authorization.k8s.io/v1"
    rights = {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rights[("", "nodes")] == {"get", "list", "patch"}
    assert rights[("", "nodes/status")] == {"patch"}
    assert "create" in rights[("", "events")]
    # nothing beyond what a drain needs: no secrets, no pods, no wildcards
    assert all("*" not in verbs for verbs in rights.values())
    assert {resource for _, resource in rights} == {"nodes", "nodes/status", "events"}
    # the fleet budget's Lease: only in gpuwatchd's namespace, only that one to change
    lease = items["Role"]
    assert lease["metadata"]["namespace"] == "gpuwatchd"
    rules = {tuple(r["verbs"]): r.get("resourceNames") for r in lease["rules"]}
    assert rules == {("create",): None, ("get", "update"): ["gpuwatchd-drain-budget"]}
    assert all(r["apiGroups"] == ["coordination.k8s.io"] for r in lease["rules"])
    assert items["RoleBinding"]["roleRef"]["name"] == lease["metadata"]["name"]
    assert items["RoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuwatchd", "namespace": "gpuwatchd"}
    ]
    binding = items["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuwatchd", "namespace": "gpuwatchd"}
    ]


def test_daemonset(tmp_path: Path) -> None:
    items = by_kind(docs("daemonset.yaml"))
    ds = items["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1" and ds["metadata"]["namespace"] == "gpuwatchd"
    spec = ds["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = spec["template"]["spec"]
    rbac = by_kind(docs("rbac.yaml"))
    assert pod["serviceAccountName"] == rbac["ServiceAccount"]["metadata"]["name"]
    assert {"operator": "Exists"} in pod["tolerations"]  # also on nodes it tainted itself
    assert pod["runtimeClassName"] == "nvidia" and pod["hostNetwork"] is True
    (container,) = pod["containers"]
    assert container["image"] and container["args"][0] == "run"
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["ports"][0]["containerPort"] == 9835
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True and sc["privileged"] is False

    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert set(mounts) == set(volumes), "every mount has a volume and every volume a mount"
    host = {v["hostPath"]["path"]: v["name"] for v in volumes.values() if "hostPath" in v}
    for path in ("/dev/kmsg", "/var/log/journal", "/run/log/journal", "/etc/machine-id"):
        assert path in host, path
        mount = mounts[host[path]]
        assert mount["mountPath"] == path and mount["readOnly"] is True, mount
    assert volumes[host["/dev/kmsg"]]["hostPath"]["type"] == "CharDevice"
    assert mounts[host["/var/lib/gpuwatchd"]]["mountPath"] == "/var/lib/gpuwatchd"
    assert env["STATE_DIRECTORY"]["value"] == "/var/lib/gpuwatchd"

    # The ConfigMap holds a config the daemon accepts (what `check-config` does).
    cm = items["ConfigMap"]
    assert volumes["config"]["configMap"]["name"] == cm["metadata"]["name"]
    assert mounts["config"]["mountPath"] == "/etc/gpuwatchd"
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(cm["data"]["gpuwatchd.yaml"])
    config = load_config(str(cfg), must_exist=True)
    assert config.listen.host == "0.0.0.0" and config.listen.port == 9835
    drain = config.as_dict()["drain"]
    assert drain["mode"] == "kubernetes" and drain["dry_run"] is True


def test_podmonitor_scrapes_the_daemonset_port() -> None:
    (monitor,) = docs("servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "PodMonitor"
    ds = by_kind(docs("daemonset.yaml"))["DaemonSet"]
    assert monitor["metadata"]["namespace"] == ds["metadata"]["namespace"]
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert endpoint["port"] in ports
    assert endpoint["path"] == "/metrics"
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in (
        endpoint["relabelings"]
    )
