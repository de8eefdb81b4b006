"""The privileged drain helper: strict requests, peer checks, fixed actions.

The end-to-end tests do what systemd's ``gpuwatchd-drain.socket`` (Accept=yes) does: accept
a connection on a real AF_UNIX socket and start ``gpuwatchd drain-helper serve`` with the
connection as its standard input; the client is the real ``gpuwatchd drain-helper
request`` the daemon's exec drain mode runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT, need_binary
from drainhelper_support import helper_socket  # noqa: F401 - the fixture
from slurm_support import Slurm, slurm  # noqa: F401 - a real single-node Slurm

from gpuwatchd.cli.drainhelper import HelperConfig, Request, RequestError, parse_request, perform

REASON = "gpuwatchd: XID 79 GPU 3 00000000:3B:00.0"
CLAIM = "gpuwatchd-claim: ticket 7 at 1764183000.125 xid 79"


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (b"not json", "not a JSON object"),
        (b"[1]", "not a JSON object"),
        (json.dumps({"action": "reboot", "reason": REASON}).encode(), "action must be"),
        (json.dumps({"action": "drain", "reason": "admin: x"}).encode(), "reason must start"),
        (json.dumps({"action": "drain", "reason": "gpuwatchd: $(reboot)"}).encode(), "reason"),
        (json.dumps({"action": "drain", "reason": "gpuwatchd: a\nb"}).encode(), "reason"),
        (json.dumps({"action": "drain", "reason": "gpuwatchd:" + "x" * 200}).encode(), "reason"),
        (json.dumps({"action": "drain", "reason": REASON, "node": "other"}).encode(), "node"),
        (json.dumps({"action": "drain", "reason": REASON, "cmd": "/bin/sh"}).encode(), "unknown"),
        (json.dumps({"action": "drain", "reason": REASON, "incident": "a b"}).encode(), "incident"),
        (b"{" + b" " * 5000 + b"}", "longer than"),
        # issue 15 item 15, failed on main with a RecursionError traceback
        (b"[" * 2000 + b"]" * 2000, "nested too deeply"),
        # issue 28: the claim is the only free text of a claim, and has one exact shape
        (json.dumps({"action": "claim", "claim": "admin: rack 4"}).encode(), "claim must be"),
        (json.dumps({"action": "claim", "claim": CLAIM + "\nx"}).encode(), "claim must be"),
        (json.dumps({"action": "claim", "claim": "x; " + CLAIM}).encode(), "claim must be"),
        (json.dumps({"action": "claim", "claim": 7}).encode(), "claim must be"),
        (json.dumps({"action": "drain", "reason": REASON, "claim": ""}).encode(), "only for"),
    ],
)
def test_requests_are_validated_strictly(data: bytes, problem: str) -> None:
    with pytest.raises(RequestError, match=problem):
        parse_request(data, "node1")


def test_a_claim_request() -> None:
    req = parse_request(json.dumps({"action": "claim", "claim": CLAIM}).encode(), "node1")
    assert req == Request("claim", "", None, CLAIM)
    assert perform(HelperConfig(node="node1"), req) == (
        True,
        f"dry-run: would claim node1: {CLAIM}",
    )
    off = parse_request(b'{"action": "claim", "claim": ""}', "node1")
    ok, detail = perform(HelperConfig(node="node1", mode="command", command=("/bin/true",)), off)
    assert not ok and "for mode slurm" in detail


def test_good_request_and_dry_run() -> None:
    req = parse_request(
        json.dumps(
            {"action": "resume", "reason": REASON, "node": "node1", "incident": "a-1"}
        ).encode(),
        "node1",
    )
    assert req == Request("resume", REASON, "a-1")
    ok, detail = perform(HelperConfig(node="node1"), req)
    assert ok and detail == f"dry-run: would resume node1: {REASON}"


def request(path: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GPUWATCHD, "drain-helper", "request", "--socket", path],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_command_mode_end_to_end(
    tmp_path: Path,
    helper_socket: tuple[str, list[subprocess.CompletedProcess[bytes]]],  # noqa: F811 - the fixture
) -> None:
    path, served = helper_socket
    seen = tmp_path / "seen.json"
    script = tmp_path / "site-drain"
    script.write_text(
        "#!/usr/bin/python3\nimport json, os, sys\n"
        f"json.dump({{**os.environ, 'argv': sys.argv[1:]}}, open({str(seen)!r}, 'w'))\n"
        "print('cordoned by site script')\n"
    )
    script.chmod(0o755)
    (tmp_path / "helper-args.json").write_text(
        json.dumps(["--node", "node1", "--mode", "command", "--command", str(script), "--fixed"])
    )
    env = {"GPUWATCHD_ACTION": "drain", "GPUWATCHD_REASON": REASON, "GPUWATCHD_NODE": "node1"}
    result = request(path, {**env, "GPUWATCHD_INCIDENT": "inc-7", "EVIL": "x"})
    assert result.returncode == 0, (result.stderr, served)
    assert result.stdout.strip() == "cordoned by site script"
    got = json.loads(seen.read_text())
    assert got["argv"] == ["--fixed"]
    assert {k: v for k, v in got.items() if k.startswith("GPUWATCHD_")} == {
        **env,
        "GPUWATCHD_INCIDENT": "inc-7",
    }
    assert "EVIL" not in got and got["PATH"] == "/usr/sbin:/usr/bin:/sbin:/bin"

    # A forged reason is refused before anything runs.
    seen.unlink()
    bad = request(path, {**env, "GPUWATCHD_REASON": "maintenance by admin"})
    assert bad.returncode == 1 and "reason must start with 'gpuwatchd:'" in bad.stderr
    assert not seen.exists()
    # Another node's name is refused too.
    other = request(path, {**env, "GPUWATCHD_NODE": "node2"})
    assert other.returncode == 1 and "node must be this node" in other.stderr
    # A failing site program is reported as a failure.
    script.write_text("#!/bin/sh\necho 'api server said no' >&2\nexit 3\n")
    failed = request(path, env)
    assert failed.returncode == 1 and "exited 3: api server said no" in failed.stderr


def test_only_the_daemon_user_may_ask(
    tmp_path: Path,
    helper_socket: tuple[str, list[subprocess.CompletedProcess[bytes]]],  # noqa: F811 - the fixture
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    path, served = helper_socket
    (tmp_path / "helper-args.json").write_text(
        json.dumps(["--node", "node1", "--allow-user", "gpuwatchd-no-such-user"])
    )
    client = (
        "import json, socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({path!r})\n"
        f"s.sendall(json.dumps({{'action': 'drain', 'reason': {REASON!r}}}).encode() + b'\\n')\n"
        "print(s.recv(4096).decode())\n"
    )
    result = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            client,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd="/",
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"ok": False, "detail": "peer uid 65534 is not allowed"}
    deadline = time.monotonic() + 10
    while not served and time.monotonic() < deadline:  # the reply comes before the exit
        time.sleep(0.05)
    assert served[-1].returncode == 1
    # root is always allowed (dry-run)
    ok = request(path, {"GPUWATCHD_ACTION": "drain", "GPUWATCHD_REASON": REASON})
    assert ok.returncode == 0 and ok.stdout.startswith("dry-run: would drain node1")


def test_request_without_helper_is_a_temporary_failure(tmp_path: Path) -> None:
    result = request(
        str(tmp_path / "absent.sock"), {"GPUWATCHD_ACTION": "drain", "GPUWATCHD_REASON": REASON}
    )
    assert result.returncode == 75


def test_resume_needs_no_reason_and_failures_are_reported(tmp_path: Path) -> None:
    req = parse_request(b'{"action": "resume"}', "node1")
    assert req == Request("resume", "")
    with pytest.raises(RequestError, match="reason"):
        parse_request(b'{"action": "drain"}', "node1")
    # kubernetes mode with an API server that is not there: a failure, said plainly
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t0ken-value}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    cfg = HelperConfig(node="node1", mode="kubernetes", kubeconfig=str(kubeconfig), timeout=5)
    ok, detail = perform(cfg, Request("drain", REASON))
    assert not ok and detail.startswith("drain failed:"), detail
    assert "t0ken-value" not in detail


def test_slurm_mode_against_a_real_slurm(
    slurm: Slurm,  # noqa: F811 - the real single-node Slurm of test_actions_slurm
    tmp_path: Path,
    helper_socket: tuple[str, list[subprocess.CompletedProcess[bytes]]],  # noqa: F811 - the fixture
) -> None:
    """Daemon-side client -> socket -> root helper -> the daemon's Slurm driver -> slurmctld."""
    path, _ = helper_socket
    (tmp_path / "helper-args.json").write_text(
        json.dumps(
            [
                "--mode",
                "slurm",
                "--node",
                slurm.node,
                "--scontrol",
                need_binary("scontrol"),
                "--sinfo",
                need_binary("sinfo"),
            ]
        )
    )
    drain = {"GPUWATCHD_ACTION": "drain", "GPUWATCHD_REASON": REASON, "GPUWATCHD_NODE": slurm.node}
    result = request(path, drain)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("drained:"), result.stdout
    state, reason, _ = slurm.state()
    assert state in ("drained", "draining") and reason == REASON
    # resume clears our own drain
    resumed = request(path, {"GPUWATCHD_ACTION": "resume", "GPUWATCHD_NODE": slurm.node})
    assert resumed.returncode == 0 and resumed.stdout.startswith("resumed:"), resumed
    slurm.wait_state("idle")
    # an admin's drain is neither overwritten nor resumed: gpuwatchd's reason goes next to
    # theirs, and a resume takes only that note off
    slurm.admin("State=DRAIN", "Reason=admin: bad fan")
    kept = request(path, drain)
    assert kept.returncode == 0 and kept.stdout.startswith("noted:"), kept
    assert slurm.state()[:2] == ("drained", f"admin: bad fan; {REASON}")
    left = request(path, {"GPUWATCHD_ACTION": "resume", "GPUWATCHD_NODE": slurm.node})
    assert left.returncode == 0 and left.stdout.startswith("unnoted:"), left
    assert slurm.state()[:2] == ("drained", "admin: bad fan")
