"""Issue 23 item 7: an id of the config's ``fields`` section that the driver does not know
is reported (a log line, a metric, the status API), not silently absent.

Driven through the NVML backend and the shipped fake pynvml: id 999 (past the driver's last) answers
INVALID_ARGUMENT, id 32 (a real NVLink counter id) answers on every GPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from actions_support import make_config

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.fields import ExtraField
from gpuwatchd.service.assembly import Node, Wiring
from gpuwatchd.sources.gpu.nvml import NvmlBackend
from gpuwatchd.testing.fake_pynvml import FakeNvml, h100

FIELDS = (ExtraField(32, "crc_l0", "counter"), ExtraField(999, "bogus_field"))


def test_an_unknown_field_id_is_logged_counted_and_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeNvml([h100(0), h100(1)])  # type: ignore[arg-type]
    for gpu in fake.gpus:
        gpu.set_field(32, 7)
    clock = VirtualClock()
    backend = NvmlBackend(clock, nvml=fake, extra_fields=FIELDS, slow_interval_s=10.0)
    config = make_config(
        tmp_path,
        "fields:\n  - {id: 32, name: crc_l0, kind: counter}\n  - {id: 999, name: bogus_field}\n",
    )
    assert config.fields == FIELDS
    node = Node(config, clock, backend, Wiring(durable=False, threaded=False))
    try:
        assert node.open_gpus()
        poller = node.poller(1.0, 1.0)
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                poller.poll_once_sync()
                node.evaluate()
                clock.advance(1.0)
        warned = [r.getMessage() for r in caplog.records if "bogus_field" in r.getMessage()]
        assert len(warned) == 1 and "id 999" in warned[0], warned  # once, not every poll
        assert not [r for r in caplog.records if "crc_l0" in r.getMessage()]
        text = node.renderer.families().render().decode()
        assert 'gpuwatchd_field_unanswered_gpus{field="bogus_field",id="999"} 2.0' in text
        assert 'gpuwatchd_field_unanswered_gpus{field="crc_l0",id="32"} 0.0' in text
        assert node.status()["fields"] == [
            {"id": 32, "name": "crc_l0", "answered": True, "missing_gpus": []},
            {"id": 999, "name": "bogus_field", "answered": False, "missing_gpus": [0, 1]},
        ]
    finally:
        node.close()


def test_no_fields_section_no_report(tmp_path: Path) -> None:
    fake = FakeNvml([h100(0)])  # type: ignore[arg-type]
    clock = VirtualClock()
    node = Node(
        make_config(tmp_path, ""),
        clock,
        NvmlBackend(clock, nvml=fake, slow_interval_s=10.0),
        Wiring(durable=False, threaded=False),
    )
    try:
        assert node.open_gpus()
        node.poller(1.0, 1.0).poll_once_sync()
        assert "fields" not in node.status()
        assert "gpuwatchd_field_unanswered_gpus" not in node.renderer.families().render().decode()
    finally:
        node.close()
