"""What the Kubernetes API server checks and does, for the contract tests of the kubernetes
drain mode (tests/actions/test_actions_kubernetes.py, tests/fleet/test_fleet_kubernetes.py)."""

from __future__ import annotations

import copy
import re
from typing import Any


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


TOKEN = "k8s-token-abc"


class ContractError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason = code, reason


LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def check_event(event: Any, node: dict[str, Any]) -> None:
    """What the API server checks of a core/v1 Event about a Node (validation.go)."""
    if not isinstance(event, dict) or event.get("kind") != "Event":
        raise ContractError(400, "BadRequest", "not an Event")
    meta = event.get("metadata") or {}
    if meta.get("namespace") != "default" or not meta.get("name"):
        raise ContractError(422, "Invalid", "metadata.namespace/name")
    obj = event.get("involvedObject") or {}
    if obj.get("kind") != "Node" or obj.get("name") != node["metadata"]["name"]:
        raise ContractError(422, "Invalid", f"involvedObject {obj}")
    if event.get("type") not in ("Normal", "Warning") or not event.get("reason"):
        raise ContractError(422, "Invalid", "type/reason")
    if len(event.get("message", "")) > 1024 or not event.get("reportingComponent"):
        raise ContractError(422, "Invalid", "message/reportingComponent")


def apply_json_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 (test, add, replace, remove) as the API server applies it."""
    doc = copy.deepcopy(doc)
    for op in ops:
        if set(op) - {"op", "path", "value"} or op.get("op") not in (
            "test",
            "add",
            "replace",
            "remove",
        ):
            raise ContractError(422, "Invalid", f"bad operation {op}")
        parts = [_unescape(p) for p in op["path"].split("/")[1:]]
        parent: Any = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "test":
            current = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if current != op["value"]:
                raise ContractError(422, "Invalid", f"test failed at {op['path']}")
        elif op["op"] == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            else:
                del parent[last]
        elif isinstance(parent, list):
            if last == "-":
                parent.append(op["value"])
            else:
                parent.insert(int(last), op["value"])
        else:
            parent[last] = op["value"]
    return doc
