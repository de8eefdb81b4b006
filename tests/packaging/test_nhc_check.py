"""packaging/nhc/gpuwatchd.nhc under bash, with NHC's die() stood in for: it passes a
healthy node and fails an unhealthy one with a reason NHC can put on the drain."""

from __future__ import annotations

import shlex
import subprocess
import sys

from conftest import ROOT, need_binary

NHC_FILE = ROOT / "packaging" / "nhc" / "gpuwatchd.nhc"
SCENARIOS = ROOT / "tests" / "data"


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    bash = need_binary("bash")
    script = (
        'die() { echo "DIE $1 $2"; }\n'
        f"source {shlex.quote(str(NHC_FILE))}\n"
        f"check_gpuwatchd {' '.join(shlex.quote(a) for a in args)}\n"
        'echo "RC $?"\n'
    )
    gpuwatchd = f"{sys.executable} -m gpuwatchd"
    return subprocess.run(
        [bash, "-c", f'gpuwatchd() {{ {gpuwatchd} "$@"; }}\nexport -f gpuwatchd\n' + script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_bash_accepts_the_file() -> None:
    res = subprocess.run([need_binary("bash"), "-n", str(NHC_FILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_healthy_node_passes() -> None:
    res = run_check("--local", "--backend", f"scenario:{SCENARIOS / 'steady-4gpu.yaml'}")
    assert res.stdout.strip().splitlines() == ["RC 0"], res.stdout + res.stderr


def test_unhealthy_node_dies_with_the_reason() -> None:
    res = run_check("--local", "--backend", f"scenario:{SCENARIOS / 'check-unhealthy.yaml'}")
    lines = res.stdout.strip().splitlines()
    assert lines[-1] == "RC 1", res.stdout + res.stderr
    assert lines[0].startswith("DIE 1 check_gpuwatchd: GPU 1 (00000000:2A:00.0) lost (GpuLost); ")
