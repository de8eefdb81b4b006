"""A real Prometheus server scrapes `gpuwatchd run` and its query API sees our series."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Proc, free_port, need_binary, wait_http

pytestmark = pytest.mark.slow


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_query(base: str, promql: str, timeout: float = 40.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(base, promql)
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"Prometheus returned nothing for {promql!r} within {timeout}s")


def test_real_prometheus_scrapes_the_daemon(
    tmp_path: Path, daemon_factory: Callable[..., tuple[Proc, str]]
) -> None:
    prometheus = need_binary("prometheus")
    scenario = ROOT / "tests" / "data" / "steady-4gpu.yaml"
    daemon, daemon_url = daemon_factory("--backend", f"scenario:{scenario}")
    target = daemon_url.removeprefix("http://")
    port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: gpuwatchd\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    prom = Proc(
        [
            prometheus,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        tmp_path / "prometheus.log",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/-/ready", timeout=20)
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
    finally:
        prom_rc = prom.stop()
        daemon.stop()
    assert prom_rc == 0, prom.output()[-2000:]


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
