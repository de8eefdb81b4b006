"""Info-level log lines for every fire, resolve and delivery, and the JSON log format."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from actions_support import HttpReceiver, transition
from conftest import ROOT, free_port
from fault_support import Daemon, wait_until

from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.eventlog import log_delivery, log_transitions
from gpuwatchd.service import logsetup

UNHEALTHY = ROOT / "tests" / "data" / "check-unhealthy.yaml"


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    if logsetup._handler is not None:
        root.removeHandler(logsetup._handler)
        logsetup._handler = None
    root.handlers[:] = handlers
    root.setLevel(level)


def json_lines(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_fire_and_resolve_are_info_lines_pending_is_debug() -> None:
    out = io.StringIO()
    logsetup.setup_logging("info", stream=out, log_format="json")
    log_transitions(
        [
            transition(state=AlertState.PENDING, seq=1),
            transition(state=AlertState.FIRING, seq=2, annotations={"summary": "XID 79 on GPU 3"}),
            transition(state=AlertState.RESOLVED, seq=3),
        ]
    )
    fired, resolved = json_lines(out.getvalue())
    assert fired["level"] == "info" and fired["logger"] == "gpuwatchd.alerts"
    assert fired["message"] == "gpu_xid_fatal firing (page) on GPU 3: XID 79 on GPU 3"
    assert (fired["rule"], fired["gpu"], fired["xid"]) == ("gpu_xid_fatal", "3", "79")
    assert fired["pci_bus_id"] == "00000000:3E:00.0"
    assert resolved["message"] == "gpu_xid_fatal resolved (page) on GPU 3"
    assert fired["time"].endswith("Z") and len(fired["time"]) == len("2026-01-02T03:04:05.678Z")


def test_json_lines_redact_secrets_and_keep_tracebacks() -> None:
    out = io.StringIO()
    logsetup.setup_logging("info", stream=out, log_format="json")
    logsetup.register_secret("hunter2-routing-key")
    log = logging.getLogger("gpuwatchd.test")
    try:
        raise RuntimeError("key hunter2-routing-key refused")
    except RuntimeError:
        log.exception("sending with %s", "hunter2-routing-key")
    (line,) = json_lines(out.getvalue())
    assert line["level"] == "error"
    assert line["message"] == "sending with <redacted>"
    assert "RuntimeError: key <redacted> refused" in line["exception"]
    assert "hunter2" not in out.getvalue()


def test_delivery_line_names_receiver_rules_and_count(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuwatchd.deliveries")
    note = {"status": "firing", "alerts": [{"rule": "GpuLost"}, {"rule": "GpuXidFatal"}]}
    log_delivery("oncall", "pagerduty", [note], 0.25)
    (record,) = caplog.records
    assert record.getMessage() == (
        "delivered to oncall (pagerduty): firing GpuLost, GpuXidFatal [2 alerts] in 0.25s"
    )


def test_daemon_logs_json_fire_and_delivery(tmp_path: Path) -> None:
    hook = HttpReceiver(free_port()).start()
    d = Daemon(
        tmp_path,
        f"""state_dir: {tmp_path / "state"}
log_format: json
sources: {{kernel_log: none}}
receivers:
  - {{name: ops, type: webhook, url: "{hook.url}/hook"}}
routing: {{group_wait: 0s}}
""",
        UNHEALTHY,
        verbose=False,
    )
    try:
        d.start()
        hook.wait_for(1)

        def logged() -> list[dict[str, str]]:
            # GpuLost fires on the lost GPU's event, the recovery action at the next
            # evaluation: wait for both fire lines and a delivery
            lines = [json.loads(x) for x in d.output().splitlines() if x.startswith("{")]
            rules = {x.get("rule") for x in lines if x["logger"] == "gpuwatchd.alerts"}
            delivered = any(x["logger"] == "gpuwatchd.deliveries" for x in lines)
            wanted = {"GpuLost", "GpuRecoveryActionRequired"} <= rules
            return lines if delivered and wanted else []

        lines = wait_until(logged, 20, "fire and delivery log lines")
    finally:
        d.stop()
        hook.stop()
    fired = [x for x in lines if x["logger"] == "gpuwatchd.alerts"]
    assert {(x["rule"], x.get("gpu")) for x in fired} >= {
        ("GpuLost", "1"),
        ("GpuRecoveryActionRequired", "2"),
    }
    assert all(x["level"] == "info" and " firing (page) " in x["message"] for x in fired)
    delivery = next(x for x in lines if x["logger"] == "gpuwatchd.deliveries")
    assert delivery["message"].startswith("delivered to ops (webhook): firing ")
    assert all(set(x) >= {"time", "level", "logger", "message"} for x in lines)
