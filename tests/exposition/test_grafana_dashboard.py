"""Dashboards against a real Prometheus scraping a simulated node.

Every query of the shipped Grafana dashboard (packaging/grafana/) must return data, and so
must every panel of NVIDIA's dcgm-exporter dashboard (grafana.com 12239) that docs/metrics.md
says `dcgm_compat` fills; the one it says stays empty must stay empty (or the docs are wrong).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Proc
from prometheus_support import Prometheus, query, scrape_config

pytestmark = pytest.mark.slow

DASHBOARD = ROOT / "packaging" / "grafana" / "gpuwatchd-dashboard.json"
VARIABLES = {"$instance": ".*", "$gpu": ".*", "$__rate_interval": "1m", "${datasource}": ""}

# Dashboard 12239 (dcgm-exporter's grafana/dcgm-exporter-dashboard.json): panel title ->
# query, with its variables $Hostname and $gpu. Facts from that file, kept in sync with
# the table in docs/metrics.md.
DCGM_12239 = {
    "GPU Temperature": 'max(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"}) '
    "by (Hostname, gpu, uuid)",
    "GPU Avg. Temp": 'avg(DCGM_FI_DEV_GPU_TEMP{Hostname=~"$Hostname", gpu=~"$gpu"})',
    "GPU Power Usage": 'max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) '
    "by (Hostname, gpu, uuid)",
    "GPU Power Total": 'sum(max(DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"}) '
    "by (gpu))",
    "GPU SM Clocks": 'max(DCGM_FI_DEV_SM_CLOCK{Hostname=~"$Hostname", gpu=~"$gpu"} * 1000000) '
    "by (Hostname, UUID, gpu)",
    "GPU Utilization": 'max(DCGM_FI_PROF_GR_ENGINE_ACTIVE{Hostname=~"$Hostname", gpu=~"$gpu"}) '
    "by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
    "Tensor Core Utilization": "max(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"
    '{Hostname=~"$Hostname", gpu=~"$gpu"}) by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)',
    "GPU Framebuffer Mem Used": 'max(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"}) '
    "by (Hostname, gpu, GPU_I_ID, GPU_I_PROFILE)",
}
DCGM_12239_VARIABLES = (
    "DCGM_FI_DEV_FB_FREE",  # label_values(DCGM_FI_DEV_FB_FREE, Hostname)
    'DCGM_FI_DEV_FB_FREE{Hostname=~".*"}',  # label_values(..., gpu)
)
DCGM_EMPTY = {"Tensor Core Utilization"}  # needs DCGM's profiling module


def substitute(expr: str, variables: dict[str, str]) -> str:
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(name, value)
    return expr


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = [
        (f"panel {p['title']!r}", t["expr"]) for p in dash["panels"] for t in p.get("targets", [])
    ]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            text = var["query"]["query"]
            assert text.startswith("label_values(") and text.endswith(")"), text
            selector = text[len("label_values(") :].rsplit(",", 1)[0]
            out.append((f"variable {var['name']!r}", selector))
    return out


def test_dashboard_is_well_formed() -> None:
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 15
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert "gpuwatchd_" in t["expr"] or "process_" in t["expr"], t["expr"]
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "instance", "gpu"}


@pytest.fixture
def prometheus_on_simulated_node(
    tmp_path: Path, daemon_factory: Callable[..., tuple[Proc, str]]
) -> Iterator[str]:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(
        "node_name: dash-node\npoll:\n  interval: 1s\nmetrics:\n  dcgm_compat: true\n"
    )
    scenario = ROOT / "tests" / "data" / "dashboard-node.yaml"
    _, daemon_url = daemon_factory("-c", str(config), "--backend", f"scenario:{scenario}")
    with Prometheus(tmp_path, scrape_config(gpuwatchd=daemon_url)) as prom:
        base = prom.url
        # rate() needs two scrapes; the XID counter exists from the scenario's XID on
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if query(base, "count_over_time(gpuwatchd_xid_errors_total[1m]) >= 2"):
                break
            time.sleep(0.5)
        else:
            raise AssertionError("Prometheus never saw the scenario's XID:\n" + prom.output())
        yield base


def test_every_query_returns_data(prometheus_on_simulated_node: str) -> None:
    base = prometheus_on_simulated_node
    empty = []
    for what, expr in dashboard_queries():
        result: list[dict[str, Any]] = query(base, substitute(expr, VARIABLES))
        if not result:
            empty.append(f"{what}: {expr}")
    assert not empty, "queries that return nothing on a simulated node:\n" + "\n".join(empty)
    # the dcgm-exporter dashboard, on the same node
    filled = set()
    for title, expr in DCGM_12239.items():
        if query(base, substitute(expr, {"$Hostname": ".*", "$gpu": ".*"})):
            filled.add(title)
    assert filled == set(DCGM_12239) - DCGM_EMPTY
    for selector in DCGM_12239_VARIABLES:
        hosts = {r["metric"].get("Hostname") for r in query(base, selector)}
        assert hosts == {"dash-node"}, selector
    docs = (ROOT / "docs" / "metrics.md").read_text()
    assert f"{len(filled)} of its {len(DCGM_12239)} panels" in docs
