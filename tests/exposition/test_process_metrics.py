"""The daemon's own ``process_*`` metrics: real values from /proc, captured files, lint."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

from conftest import need_binary

from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.exposition.metrics import MetricsRenderer
from gpuwatchd.exposition.process import ProcessMetrics


def parse(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def fake_proc(tmp_path: Path) -> Path:
    """A /proc with the files a process 4242 started 100 s after boot would have."""
    proc = tmp_path / "proc"
    (proc / "4242" / "fd").mkdir(parents=True)
    for fd in ("0", "1", "2", "7"):
        (proc / "4242" / "fd" / fd).touch()
    (proc / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\nprocesses 9\n")
    ticks = 100 * os.sysconf("SC_CLK_TCK")
    fields = ["S", *["0"] * 18, str(ticks), "1000", "200"]  # fields 3..24
    (proc / "4242" / "stat").write_text(f"4242 (gpu watch) d) {' '.join(fields)}\n")
    (proc / "4242" / "statm").write_text("1000 300 50 1 0 200 0\n")
    return proc


def test_values_come_from_the_proc_files(tmp_path: Path) -> None:
    page = os.sysconf("SC_PAGE_SIZE")
    values = parse(ProcessMetrics(str(fake_proc(tmp_path)), "4242").render().decode())
    assert values["process_start_time_seconds"] == 1700000100.0  # name with ") " parsed
    assert values["process_virtual_memory_bytes"] == 1000 * page
    assert values["process_resident_memory_bytes"] == 300 * page
    assert values["process_open_fds"] == 4.0
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert values["process_max_fds"] == float(soft)
    assert values["process_cpu_seconds_total"] >= 0.0


def test_missing_proc_leaves_series_out_instead_of_zero(tmp_path: Path) -> None:
    values = parse(ProcessMetrics(str(tmp_path / "nothing"), "1").render().decode())
    assert "process_resident_memory_bytes" not in values
    assert "process_open_fds" not in values
    assert "process_cpu_seconds_total" in values  # os.times() needs no /proc


def test_this_process_is_measured() -> None:
    values = parse(ProcessMetrics().render().decode())
    assert 5 * 2**20 < values["process_resident_memory_bytes"] < 2**32
    times = os.times()
    assert abs(values["process_cpu_seconds_total"] - (times.user + times.system)) < 1.0
    assert values["process_open_fds"] >= 3


def test_scrape_has_them_and_simulate_output_does_not() -> None:
    clock = VirtualClock()
    state = NodeState("n1", clock.now())
    renderer = MetricsRenderer(state.view)
    scraped = renderer.render().decode()
    assert "\nprocess_resident_memory_bytes " in scraped
    assert "gpuwatchd_node_info" in scraped
    assert "process_" not in renderer.families().render().decode()  # stays deterministic
    cpu_before = parse(scraped)["process_cpu_seconds_total"]
    sum(i * i for i in range(300_000))  # burn some CPU: a cached node text must not freeze it
    assert parse(renderer.render().decode())["process_cpu_seconds_total"] > cpu_before


def test_promtool_accepts_the_process_families(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    body = ProcessMetrics(str(fake_proc(tmp_path)), "4242").render()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
