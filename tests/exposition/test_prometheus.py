"""A real Prometheus server scrapes `gpuwatchd run` and its query API sees our series."""

from __future__ import annotations

import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, Proc, need_binary
from prometheus_support import Prometheus, query, scrape_config, wait_query

pytestmark = pytest.mark.slow


def test_real_prometheus_scrapes_the_daemon(
    tmp_path: Path, daemon_factory: Callable[..., tuple[Proc, str]]
) -> None:
    scenario = ROOT / "tests" / "data" / "steady-4gpu.yaml"
    daemon, daemon_url = daemon_factory("--backend", f"scenario:{scenario}")
    with Prometheus(tmp_path, scrape_config(gpuwatchd=daemon_url)) as prom:
        base = prom.url
        up = wait_query(base, 'up{job="gpuwatchd"} == 1')
        assert len(up) == 1
        temps = wait_query(base, "gpuwatchd_gpu_temperature_celsius")
        by_gpu = {r["metric"]["gpu"]: float(r["value"][1]) for r in temps}
        assert by_gpu == {"0": 47.0, "1": 47.0, "2": 71.0, "3": 47.0}
        labels = next(r["metric"] for r in temps if r["metric"]["gpu"] == "2")
        assert labels["model"] == "NVIDIA H100 80GB HBM3"
        assert labels["pci_bus_id"].startswith("00000000:")
        assert labels["uuid"].startswith("GPU-")
        ecc = query(base, 'gpuwatchd_ecc_aggregate_errors_total{type="corrected"}')
        assert {r["metric"]["gpu"]: float(r["value"][1]) for r in ecc}["2"] == 12.0
        power_cap = query(base, 'gpuwatchd_clock_event_reason_active{reason="sw_power_cap"} == 1')
        assert [r["metric"]["gpu"] for r in power_cap] == ["2"]
        links = query(base, "count(gpuwatchd_nvlink_up)")
        assert float(links[0]["value"][1]) == 8.0  # 4 GPUs x 2 links
        assert query(base, 'gpuwatchd_source_up{source="nvml"}')[0]["value"][1] == "1"
        # No scrape errors or sample limits hit: Prometheus accepted every series.
        scraped = query(base, 'scrape_samples_scraped{job="gpuwatchd"}')
        assert float(scraped[0]["value"][1]) > 100
    daemon.stop()
    assert prom.returncode == 0, prom.output()


def test_promtool_accepts_live_exposition(daemon_factory: Callable[..., tuple[Proc, str]]) -> None:
    promtool = need_binary("promtool")
    scenario = ROOT / "tests" / "data" / "steady-4gpu.yaml"
    _, url = daemon_factory("--backend", f"scenario:{scenario}")
    time.sleep(0.3)
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        body = resp.read()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
