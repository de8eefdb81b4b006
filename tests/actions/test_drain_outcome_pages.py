"""Issue 24 item 1: a drain outcome is a record on the hand-off and the shipped drain rules
(``rules/drain.yaml``) page on it, so the drain's pages are alerts like any other: in the
firing-alerts metric, in ``status`` and on the ``systemctl status`` line. On main the drain
minted ``GpuwatchdDrainFailed`` itself and none of the three showed it.

Driven through the composition root (``assembly.Node``), the NVML backend on the shipped
fake pynvml, a trusted XID 79 from the kernel-log path and a real drain command that fails.
"""

from __future__ import annotations

from pathlib import Path

from actions_support import make_config

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.records import XidEvent
from gpuwatchd.service.assembly import Node, Wiring
from gpuwatchd.service.watchdog import status_line
from gpuwatchd.sources.gpu.nvml import NvmlBackend
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

FAILED = "GpuwatchdDrainFailed"


def test_a_failed_drain_pages_through_the_rules_and_shows_like_any_alert(tmp_path: Path) -> None:
    fake = FakeNvml([h100(0), h100(1)])  # type: ignore[arg-type]
    clock = VirtualClock(1_767_225_600.0)
    config = make_config(
        tmp_path,
        f"""drain:
  mode: exec
  exec: {{command: ["false"]}}
  grace: 0s
  attempts: 1
  state_file: {tmp_path / "run" / "health.json"}
""",
    )
    node = Node(
        config,
        clock,
        NvmlBackend(clock, nvml=fake, slow_interval_s=10.0),
        Wiring(durable=True, threaded=False),
    )
    try:
        assert node.open_gpus()
        poller = node.poller(1.0, 1.0)
        poller.poll_once_sync()
        node.evaluate()
        pci = node.state.view().gpus[1].info.pci_bus_id
        node.emit(XidEvent(clock.now(), "journald", 79, pci_bus_id=pci, gpu=1))
        node.evaluate()  # GpuXidFatal fires and asks for a drain
        assert node.actions is not None and node.actions.drain is not None
        node.actions.run_pending()  # the drain command fails: an outcome on the hand-off
        assert node.pipeline.handoff.wakeup.is_set()  # judged at once, not at the next tick
        node.evaluate()
        firing = {a["rule"]: a for a in node.firing()}
        assert FAILED in firing, sorted(firing)
        page = firing[FAILED]
        assert page["severity"] == "page"
        assert page["labels"]["node"] == config.node_name and page["labels"]["gpu"] == "1"
        assert page["summary"].startswith(
            f"gpuwatchd could not drain {config.node_name} after 1 attempts and keeps trying"
        )
        assert FAILED in {a["rule"] for a in node.status()["alerts"]}
        metrics = node.renderer.families().render().decode()
        assert f'gpuwatchd_alerts{{rule="{FAILED}",severity="page",state="firing"}} 1.0' in metrics
        line = status_line(node.state.view(), clock.now(), alerts_firing=len(node.firing()))
        assert f"{len(firing)} alerts firing" in line and len(firing) >= 2
    finally:
        node.close()
