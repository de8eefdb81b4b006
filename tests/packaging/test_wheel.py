"""The Python artifacts (issue 23 item 6): packaging/build-python.sh builds an sdist and, from
it, a wheel; the wheel installs with pip into a clean venv (Debian's python3, not this
checkout's venv, no PYTHONPATH, run from an empty folder) and that install plays the demo
and finds the shipped scenarios by name.

Needs network access to PyPI (pip fetches the build backend and the wheel's dependencies,
then keeps them in its cache), as scripts/bootstrap.sh does.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SCENARIOS = sorted(p.name for p in (ROOT / "scenarios").glob("*.yaml"))


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TERM"] = "dumb"
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_wheel_installs_in_a_clean_venv_and_plays_the_demo(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = run([str(ROOT / "packaging" / "build-python.sh"), str(dist)], cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    wheel = dist / f"gpuwatchd-{VERSION}-py3-none-any.whl"
    sdist = dist / f"gpuwatchd-{VERSION}.tar.gz"
    assert wheel.is_file() and sdist.is_file(), sorted(p.name for p in dist.iterdir())

    # both carry the shipped rules and every shipped scenario as files (no symlinks)
    names = set(zipfile.ZipFile(wheel).namelist())
    for scenario in SCENARIOS:
        assert f"gpuwatchd/data/scenarios/{scenario}" in names
    assert "gpuwatchd/data/rules/xid.yaml" in names
    with tarfile.open(sdist) as tar:
        members = {m.name: m for m in tar.getmembers()}
    top = f"gpuwatchd-{VERSION}"
    assert members[f"{top}/gpuwatchd/data/scenarios/fallen-off-bus.yaml"].isfile()
    assert members[f"{top}/gpuwatchd/data/rules/gpu.yaml"].isfile()

    venv = tmp_path / "venv"
    made = run(["/usr/bin/python3", "-m", "venv", str(venv)], cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    pip = run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], cwd=tmp_path)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    gpuwatchd = str(venv / "bin" / "gpuwatchd")
    where = run(
        [str(venv / "bin" / "python"), "-c", "import gpuwatchd; print(gpuwatchd.__file__)"],
        cwd=tmp_path,
    )
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr

    demo = run([gpuwatchd, "demo", "--seconds", "5", "--listen", "127.0.0.1:0"], cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "GpuMemoryErrorsAccelerating" in demo.stdout

    # a shipped scenario by its name, from the installed package
    sim = run([gpuwatchd, "simulate", "fallen-off-bus"], cwd=tmp_path)
    assert sim.returncode == 0, sim.stderr
    records = [json.loads(line) for line in sim.stdout.splitlines()]
    assert any(
        r["record"] == "alert" and r["rule"] == "GpuLost" and r["state"] == "firing"
        for r in records
    )
