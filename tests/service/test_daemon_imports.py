"""`gpuwatchd run` loads only what its config uses: a default daemon (no TLS, no receivers,
no basic auth) never imports OpenSSL (ssl, hashlib), http.client/email, or the CLI's other
commands. Each is megabytes of RSS against the bare pynvml process the issue measures
against (docs/PERFORMANCE.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

PROBE = r"""
import json, os, sys, threading, time
out, argv = sys.argv[1], sys.argv[2:]
def probe():
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(t.name == "http" for t in threading.enumerate()):
            time.sleep(1.5)  # a few polls and evaluations
            break
        time.sleep(0.1)
    with open(out, "w") as fh:
        json.dump(sorted(sys.modules), fh)
    os._exit(0)
threading.Thread(target=probe, daemon=True).start()
from gpuwatchd.cli.main import main
sys.exit(main(argv))
"""

NEVER = (
    "ssl",
    "_ssl",
    "hashlib",
    "_hashlib",
    "http.client",
    "http.server",
    "email",
    "gpuwatchd.harness.backtest",
    "gpuwatchd.cli.backtest",
    "gpuwatchd.cli.check",
    "gpuwatchd.actions.transport",
)


def loaded_by_run(tmp_path: Path, config_text: str) -> set[str]:
    config = tmp_path / "gpuwatchd.yaml"
    config.write_text(f"state_dir: {tmp_path / 'state'}\n" + config_text)
    out = tmp_path / "modules.json"
    scenario = ROOT / "scenarios" / "healthy-8xh100.yaml"
    argv = ["run", "-c", str(config), "--backend", f"scenario:{scenario}"]
    res = subprocess.run(
        [sys.executable, "-c", PROBE, str(out), *argv, "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.exists(), res.stderr[-2000:]
    return set(json.loads(out.read_text()))


def test_a_default_daemon_imports_no_openssl_http_client_or_other_commands(
    tmp_path: Path,
) -> None:
    modules = loaded_by_run(tmp_path, "poll:\n  interval: 1s\n")
    assert "gpuwatchd.service.daemon" in modules and "gpuwatchd.exposition.httpd" in modules
    assert sorted(m for m in NEVER if m in modules) == []
