"""The status document's one field-driven converter (issue 24 item 2): what each field's
type says is read leniently, unknown keys travel unchanged at their place, and the wire
form comes back key for key, in order."""

from __future__ import annotations

import json
from typing import Any

from gpuwatchd.core.statusdoc import DrainState, GpuEntry, StatusDocument

WIRE: dict[str, Any] = {
    "node": "n1",
    "version": "1.0",
    "now": 10.0,
    "started_at": 1.0,
    "backend": "scenario",
    "gpus": [
        {
            "index": 0,
            "pci_bus_id": "00000000:3B:00.0",
            "name": "H100",
            "uuid": "GPU-1",
            "status": "ok",
            "health": "degraded",
            "health_rules": ["GpuTemperatureHigh"],
            "readings": {"temperature_c": 91},
        }
    ],
    "gpus_expected": 8,
    "sources": {"nvml": {"up": True, "detail": "", "polls": 3}},
    "xid_counts": [{"gpu": 0, "xid": 79, "count": 1}],
    "alerts": [
        {
            "rule": "GpuTemperatureHigh",
            "severity": "ticket",
            "labels": {"gpu": "0"},
            "since": 5.0,
            "value": 91,
            "summary": "hot",
            "fingerprint": "f",
            "annotations": {},
        }
    ],
    "deliveries": {
        "pending": 1,
        "state_problem": None,
        "receivers": [
            {
                "name": "am",
                "type": "alertmanager",
                "pending": 1,
                "oldest_pending_seconds": 2.0,
                "last_error": None,
                "queue": 1,
            }
        ],
        "firing": [],
    },
    "drain": {"mode": "none", "note": "kept"},
    "later_key": {"a": 1},
    "config": {"file": "/etc/gpuwatchd.yaml", "last_reload": None, "restart_required": {}},
}


def test_the_wire_form_comes_back_key_for_key_in_order() -> None:
    doc = StatusDocument.from_json(WIRE)
    assert json.dumps(doc.as_json()) == json.dumps(WIRE)
    assert doc.gpus[0].health.health == "degraded" and doc.gpus[0].more == {"uuid": "GPU-1"}
    assert doc.alerts is not None and doc.alerts[0].more == {"value": 91}
    assert doc.actions.deliveries is not None
    assert doc.actions.deliveries.receivers[0].more == {"queue": 1}
    assert doc.more == {"later_key": {"a": 1}}
    assert doc.actions.drain == DrainState(mode="none", more={"note": "kept"})


def test_odd_values_read_leniently() -> None:
    doc = StatusDocument.from_json(
        {
            "gpus": [{"index": 1, "status": "lost"}, "not a gpu"],
            "alerts": "not a list",
            "gpus_expected": "8",
            "now": True,
            "sources": {"nvml": "down", "kmsg": {"up": 1}},
            "silences": [{"id": 7, "ends_at": "never"}],
            "drain": {"mode": "slurm", "drains_in_window": None},
        }
    )
    assert (doc.node, doc.version, doc.backend, doc.now) == ("?", "?", "?", None)
    assert doc.alerts is None and doc.gpus_expected is None
    (gpu,) = doc.gpus
    assert isinstance(gpu, GpuEntry) and gpu.health.health == "lost"  # judged here
    assert list(doc.sources) == ["kmsg"] and doc.sources["kmsg"].up is True
    assert doc.actions.silences is not None
    assert (doc.actions.silences[0].id, doc.actions.silences[0].ends_at) == ("7", None)
    assert doc.actions.drain == DrainState(mode="slurm", state="?")
    assert StatusDocument.from_json(doc.as_json()) == doc
