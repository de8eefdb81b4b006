"""The exposition of a simulated scenario, compared with a golden file and linted.

Run `pytest tests/exposition/test_golden_metrics.py --update-golden` after an intended change and
review the diff of tests/golden/metrics.txt like code.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import GPUWATCHD, ROOT, need_binary

GOLDEN = ROOT / "tests" / "golden" / "metrics.txt"
# Series whose values depend on the build or the machine, not on the scenario.
UNSTABLE = re.compile(r"^gpuwatchd_build_info\{")


def simulate_metrics(tmp_path: Path, config_text: str) -> str:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(config_text)
    out = tmp_path / "metrics.txt"
    subprocess.run(
        [*GPUWATCHD, "simulate", "demo", "-c", str(config), "--metrics-out", str(out)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return out.read_text()


def stable(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not UNSTABLE.match(line))


def test_metrics_match_golden(tmp_path: Path, update_golden: bool) -> None:
    text = stable(simulate_metrics(tmp_path, "node_name: golden-node\n"))
    if update_golden:
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file: run pytest with --update-golden"
    expected = GOLDEN.read_text()
    if text != expected:
        import difflib

        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(True), text.splitlines(True), "golden", "now", n=1
            )
        )
        raise AssertionError(
            "metrics differ from tests/golden/metrics.txt "
            "(--update-golden rewrites it):\n" + diff[:6000]
        )


def test_golden_tells_the_story(tmp_path: Path) -> None:
    """Spot checks, so that a wrong golden file cannot be blessed by accident."""
    text = simulate_metrics(tmp_path, "node_name: golden-node\n")
    assert 'gpuwatchd_gpu_up{gpu="3",' in text
    assert re.search(r'gpuwatchd_gpu_status\{gpu="3",[^}]*status="lost"\} 1\.0', text)
    assert re.search(r'gpuwatchd_gpu_up\{gpu="0",[^}]*\} 1\.0', text)
    # a lost GPU's last readings are not presented as current
    assert not re.search(r'gpuwatchd_gpu_temperature_celsius\{gpu="3",', text)
    assert re.search(r'gpuwatchd_xid_errors_total\{gpu="3",[^}]*xid="79"\} 1\.0', text)
    corrected = re.search(
        r'gpuwatchd_ecc_volatile_errors_total\{gpu="5",[^}]*type="corrected"\} (\S+)', text
    )
    assert corrected is not None and float(corrected.group(1)) > 50
    assert re.search(r'gpuwatchd_xid_errors_total\{gpu="5",[^}]*xid="48"\} 1\.0', text)


def test_promtool_lints_exposition_clean(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    text = simulate_metrics(tmp_path, "node_name: golden-node\n")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert result.stdout.decode().strip() == ""


def test_dcgm_compat_series_parse_and_keep_dcgm_names(tmp_path: Path) -> None:
    promtool = need_binary("promtool")
    text = simulate_metrics(tmp_path, "node_name: n1\nmetrics:\n  dcgm_compat: true\n")
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    # 1 would be a parse error. 3 is lint only, and only for dcgm-exporter's own
    # naming (camelCase labels such as modelName, a name containing "COUNTER").
    assert result.returncode in (0, 3), result.stderr.decode()
    problems = set()
    for line in (result.stdout + result.stderr).decode().splitlines():
        name, _, problem = line.partition(" ")
        assert name.startswith("DCGM_FI_"), line
        problems.add(problem)
    assert problems <= {
        "label names should be written in 'snake_case' not 'camelCase'",
        "metric name should not include type 'counter'",
    }
    # the six series Grafana dashboard 12239 queries (all but the DCP tensor one)
    for name in (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
    ):
        assert re.search(
            rf'^{name}\{{gpu="0",UUID="GPU-[^"]+",pci_bus_id="[^"]+",'
            r'device="nvidia0",modelName="[^"]+",Hostname="n1",',
            text,
            re.M,
        ), name
    sm = re.search(r'^DCGM_FI_DEV_SM_CLOCK\{gpu="0",[^}]*\} (\S+)', text, re.M)
    assert sm is not None and 100 < float(sm.group(1)) < 3000  # MHz, not Hz


def test_every_family_is_documented(tmp_path: Path) -> None:
    doc = (ROOT / "docs" / "metrics.md").read_text()
    text = simulate_metrics(tmp_path, "node_name: n1\nmetrics:\n  dcgm_compat: true\n")
    names = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    from gpuwatchd.core.fields import GPU_FIELD_LIST, LINK_FIELD_LIST

    names |= {spec.metric for spec in (*GPU_FIELD_LIST, *LINK_FIELD_LIST)}
    missing = sorted(n for n in names if f"`{n}`" not in doc)
    assert not missing, f"docs/metrics.md does not document: {missing}"
