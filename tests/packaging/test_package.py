"""The Debian package: build, lintian, install, run, purge, and nothing left behind.

This test changes the machine (dpkg -i / dpkg -P, a system user): it is meant for CI's
throwaway Debian 12 machine and runs as part of scripts/test.sh there. It skips when not
root, and when a gpuwatchd package is already installed (it would purge it); an existing
/etc/gpuwatchd or /var/lib/gpuwatchd is moved aside during the test and restored.
"""

from __future__ import annotations

import grp
import http.server
import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT, free_port, need_binary

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
DEB = ROOT / "dist" / f"gpuwatchd_{VERSION}_all.deb"
# /run is left out: other processes change it all the time (systemd removes the unit's
# RuntimeDirectory itself).
SNAPSHOT_ROOTS = ("/etc", "/usr", "/lib", "/var/lib", "/opt", "/srv")
SNAPSHOT_SKIP = ("/var/lib/dpkg", "/var/lib/apt", "/var/lib/ucf", "/var/lib/man-db")

pytestmark = pytest.mark.slow


def sh(*argv: str, check: bool = True, cwd: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=300, cwd=cwd)
    if check:
        assert result.returncode == 0, f"{argv}: {result.stdout}\n{result.stderr}"
    return result


def installed() -> bool:
    r = sh("dpkg-query", "-W", "-f=${Status}", "gpuwatchd", check=False)
    return r.returncode == 0 and "ok installed" in r.stdout


def snapshot() -> set[str]:
    """Every path under the system roots (minus package-manager bookkeeping)."""
    out: set[str] = set()
    for top in SNAPSHOT_ROOTS:
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if os.path.join(dirpath, d) not in SNAPSHOT_SKIP]
            out.add(dirpath)
            out.update(os.path.join(dirpath, f) for f in filenames)
    return out


@pytest.fixture
def clean_machine() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("installs a package: needs root (CI runs it)")
    if installed():
        pytest.skip("a gpuwatchd package is installed here; this test would purge it")
    for tool in ("dpkg-buildpackage", "dh", "lintian", "systemd-analyze", "systemd-sysusers"):
        need_binary(tool)
    # A purge deletes these: whatever is there (a checkout's daemon ran as root) is moved
    # aside for the test and put back afterwards.
    moved = {}
    for path in ("/etc/gpuwatchd", "/var/lib/gpuwatchd"):
        if os.path.lexists(path):
            moved[path] = f"{path}.package-test-{os.getpid()}"
            os.rename(path, moved[path])
    try:
        yield
    finally:
        if installed():
            sh("dpkg", "-P", "gpuwatchd", check=False)
        for path, aside in moved.items():
            if os.path.lexists(path):
                shutil.rmtree(path)
            os.rename(aside, path)


@pytest.fixture
def http_server() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"pong"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ping"
    server.shutdown()
    server.server_close()


def test_build_lint_install_run_purge(
    clean_machine: None, http_server: str, tmp_path: Path
) -> None:
    # -- build: one command, fast ----------------------------------------------------------
    start = time.monotonic()
    build = sh(str(ROOT / "packaging" / "build-deb.sh"), cwd="/")
    build_seconds = time.monotonic() - start
    assert build.stdout.strip().endswith(f"dist/gpuwatchd_{VERSION}_all.deb")
    assert DEB.exists()
    # a hung build, not a slow one: the build's speed (well under a minute on a quiet host)
    # is no test's business on a loaded one
    assert build_seconds < 600, f"build took {build_seconds:.1f}s"

    # -- lintian: no errors; every warning is one docs/install.md lists ---------------------
    lint = sh("lintian", "--no-tag-display-limit", str(DEB), check=False)
    tags = re.findall(r"^([EW]): gpuwatchd: (\S+)", lint.stdout, re.M)
    assert not [t for level, t in tags if level == "E"], lint.stdout
    documented = (ROOT / "docs" / "install.md").read_text()
    undocumented = {t for level, t in tags if level == "W" and f"`{t}`" not in documented}
    assert not undocumented, f"lintian warnings not listed in docs/install.md: {undocumented}"

    # -- contents ------------------------------------------------------------------------
    listing = {line.split()[-1] for line in sh("dpkg-deb", "-c", str(DEB)).stdout.splitlines()}
    for path in (
        "./usr/bin/gpuwatchd",
        "./usr/lib/gpuwatchd/gpuwatchd/cli/main.py",
        "./usr/lib/gpuwatchd/vendor/pynvml.py",
        "./lib/systemd/system/gpuwatchd.service",
        "./lib/systemd/system/gpuwatchd-drain.socket",
        "./lib/systemd/system/gpuwatchd-drain@.service",
        "./usr/lib/sysusers.d/gpuwatchd.conf",
        "./usr/lib/tmpfiles.d/gpuwatchd.conf",
        "./etc/gpuwatchd/gpuwatchd.yaml",
        "./etc/gpuwatchd/rules.d/",
        "./etc/default/gpuwatchd-drain",
        "./usr/share/gpuwatchd/rules/",
        "./usr/share/man/man8/gpuwatchd.8.gz",
        # uncompressed, in the source tree's layout: the links point here and between them
        "./usr/share/doc/gpuwatchd/README.md",
        "./usr/share/doc/gpuwatchd/docs/install.md",
        "./usr/share/doc/gpuwatchd/docs/fleet.md",
        "./usr/share/doc/gpuwatchd/docs/config.md",
        "./usr/share/doc/gpuwatchd/docs/actions.md",
        "./usr/share/gpuwatchd/rules/schema.json",
    ):
        assert path in listing, path
    for rule in sorted((ROOT / "rules").glob("*.yaml")):
        assert f"./usr/share/gpuwatchd/rules/{rule.name}" in listing
    for scenario in sorted((ROOT / "scenarios").glob("*.yaml")):
        assert f"./usr/share/gpuwatchd/scenarios/{scenario.name}" in listing
    # only what Debian 12 does not package is vendored (docs/install.md says why)
    assert not [p for p in listing if re.search(r"/vendor/(prometheus|httpx|h11)", p)]

    # -- install ---------------------------------------------------------------------------
    before = snapshot()
    sh("dpkg", "-i", str(DEB))
    try:
        _check_installed(tmp_path, http_server)
    finally:
        purge = sh("dpkg", "-P", "gpuwatchd", check=False)
    assert purge.returncode == 0, purge.stderr
    assert not installed()

    # -- nothing left behind (the system user stays, as documented) ------------------------
    after = snapshot()
    assert sorted(after - before) == [], "left behind after purge"
    assert sorted(before - after) == [], "removed by install/purge"
    assert pwd.getpwnam("gpuwatchd")  # the user and group stay, as documented:
    docs = " ".join((ROOT / "docs" / "install.md").read_text().split()).lower()
    assert "the `gpuwatchd` user and group stay" in docs


def _check_installed(tmp_path: Path, http_url: str) -> None:
    assert sh("gpuwatchd", "--version").stdout.strip() == f"gpuwatchd {VERSION}"
    assert sh("/usr/bin/gpuwatchd", "check-config", "-c", "/etc/gpuwatchd/gpuwatchd.yaml").stdout
    sh("/usr/bin/gpuwatchd", "check-config")  # the default path
    assert (
        Path("/etc/gpuwatchd/gpuwatchd.yaml").read_text()
        == (ROOT / "packaging" / "gpuwatchd.yaml").read_text()
    )
    conffiles = sh("dpkg-query", "-W", "-f=${Conffiles}", "gpuwatchd").stdout
    assert "/etc/gpuwatchd/gpuwatchd.yaml" in conffiles
    assert "/etc/default/gpuwatchd-drain" in conffiles

    # the system user, in the journal's group; the directories with their modes
    user = pwd.getpwnam("gpuwatchd")
    assert user.pw_shell == "/usr/sbin/nologin" and user.pw_dir == "/var/lib/gpuwatchd"
    assert "gpuwatchd" in grp.getgrnam("systemd-journal").gr_mem
    st = os.stat("/var/lib/gpuwatchd")
    assert st.st_uid == user.pw_uid and stat.S_IMODE(st.st_mode) == 0o750
    assert stat.S_IMODE(os.stat("/etc/gpuwatchd/credentials").st_mode) == 0o700

    # the unit as installed (its ExecStart exists now): verify and score
    unit = "/lib/systemd/system/gpuwatchd.service"
    verify = sh("systemd-analyze", "verify", "--man=no", unit, check=False, cwd=str(tmp_path))
    assert verify.returncode == 0 and verify.stderr == "", verify.stderr
    score = sh("systemd-analyze", "security", "--offline=yes", unit, cwd=str(tmp_path)).stdout
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", score)
    assert m and float(m.group(1)) <= 2.0, score
    assert os.path.islink("/etc/systemd/system/multi-user.target.wants/gpuwatchd.service")
    assert not os.path.exists("/etc/systemd/system/sockets.target.wants/gpuwatchd-drain.socket")

    # the libraries: Debian's python3 and packages, the private path, the vendored NVML
    probe = (
        "import sys; sys.path[0:0] = ['/usr/lib/gpuwatchd', '/usr/lib/gpuwatchd/vendor']\n"
        "import httpx, prometheus_client, pynvml, yaml, pyudev, systemd.journal\n"
        "from importlib.metadata import version\n"
        "assert prometheus_client.__file__.startswith('/usr/lib/python3/dist-packages/')\n"
        "assert httpx.__file__.startswith('/usr/lib/python3/dist-packages/')\n"
        "assert pynvml.__file__.startswith('/usr/lib/gpuwatchd/vendor/')\n"
        "assert tuple(map(int, version('prometheus-client').split('.')[:2])) >= (0, 16)\n"
        "assert tuple(map(int, httpx.__version__.split('.')[:2])) >= (0, 23)\n"
        "from importlib.resources import files\n"
        "shipped = sorted(p.name for p in (files('gpuwatchd') / 'data' / 'rules').iterdir()"
        " if p.name.endswith('.yaml'))\n"
        f"assert shipped == {sorted(p.name for p in (ROOT / 'rules').glob('*.yaml'))!r}, shipped\n"
        f"print(httpx.get({http_url!r}).text)\n"
    )
    assert sh("/usr/bin/python3", "-I", "-c", probe).stdout.strip() == "pong"

    # the daemon runs as its own user, from the installed files only
    work = Path(f"/tmp/gpuwatchd-pkg-{os.getpid()}")
    work.mkdir(mode=0o755)
    try:
        scenario = work / "steady.yaml"
        shutil.copy(ROOT / "tests" / "data" / "steady-4gpu.yaml", scenario)
        scenario.chmod(0o644)
        port = free_port()
        env = {"PATH": "/usr/bin:/bin", "STATE_DIRECTORY": "/var/lib/gpuwatchd"}
        proc = subprocess.Popen(
            [
                "setpriv",
                "--reuid=gpuwatchd",
                "--regid=gpuwatchd",
                "--init-groups",
                "/usr/bin/gpuwatchd",
                "run",
                "--backend",
                f"scenario:{scenario}",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            env=env,
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                        body = r.read().decode()
                    if "gpuwatchd_gpu_temperature_celsius{" in body:
                        break
                except OSError as exc:
                    if isinstance(exc, urllib.error.HTTPError):
                        exc.close()
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout
                time.sleep(0.1)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
    finally:
        shutil.rmtree(work)


def test_man_page_names_every_command() -> None:
    import argparse

    from gpuwatchd.cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    page = (ROOT / "packaging" / "gpuwatchd.8").read_text().replace("\\-", "-")
    missing = [
        name
        for name in sub.choices
        if f".B {name}" not in page and f".B gpuwatchd {name}" not in page
    ]
    assert not missing, f"gpuwatchd.8 does not describe: {missing}"
