"""systemd integration: sd_notify against a real socket, the watchdog, reload, the units.

The daemon runs as a subprocess with ``$NOTIFY_SOCKET`` naming a real AF_UNIX datagram
socket bound by the test, exactly as systemd would hand it over. The unit files are
checked with the real ``systemd-analyze``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import GPUWATCHD, ROOT, free_port, need_binary
from systemd_support import NotifySocket

from gpuwatchd.configfile.loader import default_config, load_config
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.heartbeat import HeartbeatRegistry
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.service.sdnotify import Notifier, watchdog_usec
from gpuwatchd.service.watchdog import Supervisor
from gpuwatchd.testing.fake_backend import FakeBackend

STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"
UNIT = ROOT / "systemd" / "gpuwatchd.service"
FAST = "poll:\n  interval: 200ms\n  call_timeout: 100ms\n"


# -- a real notify socket -----------------------------------------------------------------


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    ns = NotifySocket(str(tmp_path / "notify"))
    yield ns
    ns.close()


def run_daemon(
    tmp_path: Path,
    notify: str,
    *,
    watchdog_usec: int | None = 1_000_000,
    config: str = FAST,
    extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], str, Path]:
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(config)
    port = free_port()
    env = dict(os.environ, STATE_DIRECTORY=str(tmp_path / "state"), NOTIFY_SOCKET=notify)
    env.pop("JOURNAL_STREAM", None)
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    env.update(extra_env or {})
    log = tmp_path / "daemon.log"
    argv = [*GPUWATCHD, "run", "-c", str(cfg), "--backend", f"scenario:{STEADY}"]
    argv += ["--listen", f"127.0.0.1:{port}"]
    with log.open("wb") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}", log


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# -- the protocol end to end --------------------------------------------------------------
def test_ready_status_watchdog_reload_stopping(tmp_path: Path, notify_socket: NotifySocket) -> None:
    proc, url, log = run_daemon(tmp_path, notify_socket.address, watchdog_usec=1_000_000)
    try:
        ready = notify_socket.wait_for("READY=1")
        # READY=1 comes only after every GPU answered its first poll: readings are there.
        with urllib.request.urlopen(url + "/api/v1/status", timeout=5) as resp:
            status = json.load(resp)
        assert len(status["gpus"]) == 4
        assert all("readings" in g for g in status["gpus"]), status["gpus"]
        first = notify_socket.all()[ready]
        assert any(
            re.fullmatch(r"STATUS=4 GPUs ok; 0 alerts firing; last poll \d+s ago", a) for a in first
        ), first
        # WATCHDOG=1 at half of WATCHDOG_USEC (0.5 s), from the main loop.
        time.sleep(2.2)
        pings = notify_socket.times("WATCHDOG=1")
        assert len(pings) >= 4, notify_socket.all()
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        assert all(0.3 < g < 0.8 for g in gaps), gaps

        # SIGHUP with a broken config: RELOADING=1 (+ MONOTONIC_USEC), READY=1, old config kept.
        cfg = tmp_path / "gpuwatchd.yaml"
        cfg.write_text(FAST + "log_level: loud\n")
        n = len(notify_socket.all())
        proc.send_signal(signal.SIGHUP)
        i = notify_socket.wait_for("RELOADING=1", after=n)
        msg = notify_socket.all()[i]
        mono = [a for a in msg if a.startswith("MONOTONIC_USEC=")]
        assert mono and abs(int(mono[0].split("=")[1]) / 1e6 - time.monotonic()) < 5
        j = notify_socket.wait_for("READY=1", after=i)
        assert any("reload FAILED" in a for a in notify_socket.all()[j])
        deadline = time.monotonic() + 5
        while f"{cfg}:4:12:" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert f"{cfg}:4:12: log_level: 'loud' is not one of" in log.read_text()
        assert "keeping the running configuration" in log.read_text()

        # A good config: accepted; a restart-only change is named, not applied.
        cfg.write_text(FAST + "log_level: debug\nmetrics:\n  per_link: false\n")
        n = len(notify_socket.all())
        proc.send_signal(signal.SIGHUP)
        j = notify_socket.wait_for("READY=1", after=notify_socket.wait_for("RELOADING=1", after=n))
        assert not any("FAILED" in a for a in notify_socket.all()[j])
        with urllib.request.urlopen(url + "/healthz", timeout=5) as resp:
            assert resp.status == 200  # still listening where it was
        deadline = time.monotonic() + 5
        while "reloaded configuration" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reload: metrics changed but is not applied (the metrics renderer" in log.read_text()

        n = len(notify_socket.all())
        assert stop(proc) == 0, log.read_text()
        notify_socket.wait_for("STOPPING=1", after=n)
    finally:
        stop(proc)


def test_pings_stop_when_a_worker_is_wedged(tmp_path: Path, notify_socket: NotifySocket) -> None:
    """A rule evaluation that never returns holds the pipeline: the pings must stop."""
    proc, url, log = run_daemon(
        tmp_path,
        notify_socket.address,
        watchdog_usec=1_000_000,
        extra_env={"GPUWATCHD_TEST_FAULT": "wedge-evaluator:3"},
    )
    try:
        notify_socket.wait_for("READY=1")
        # three evaluations (one per evaluation period, 10 s) before the wedge
        stalled = notify_socket.wait_for("STATUS=STALLED: evaluator made no progress", timeout=60)
        stalled_at = notify_socket.messages[stalled][0]
        time.sleep(2.0)
        late = [t for t in notify_socket.times("WATCHDOG=1") if t > stalled_at]
        assert late == [], "WATCHDOG=1 sent while a worker was wedged"
        assert len(notify_socket.times("WATCHDOG=1")) >= 2  # it did ping before the wedge
        # systemd would now kill it; the HTTP health check says why too.
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url + "/healthz", timeout=5)
        assert "made no progress" in err.value.read().decode()
        err.value.close()
        assert "watchdog: evaluator made no progress" in log.read_text()
    finally:
        stop(proc)


def test_abstract_socket_and_no_watchdog(tmp_path: Path) -> None:
    ns = NotifySocket(f"@gpuwatchd-test-{os.getpid()}-{time.monotonic_ns()}")
    proc, _, _ = run_daemon(tmp_path, ns.address, watchdog_usec=None)
    try:
        ns.wait_for("READY=1")
        time.sleep(1.0)
        assert ns.times("WATCHDOG=1") == []  # no $WATCHDOG_USEC: no pings
    finally:
        stop(proc)
        ns.close()


def test_without_notify_socket_the_daemon_runs_as_before(tmp_path: Path) -> None:
    proc, url, log = run_daemon(tmp_path, "", watchdog_usec=None)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=1):
                    break
            except OSError as exc:
                if isinstance(exc, urllib.error.HTTPError):
                    exc.close()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
    finally:
        assert stop(proc) == 0


# -- the pieces in-process ----------------------------------------------------------------
def test_notifier_unsets_environment_and_is_a_noop_without_socket(tmp_path: Path) -> None:
    ns = NotifySocket(str(tmp_path / "n"))
    env = {"NOTIFY_SOCKET": ns.address, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1", "X": "y"}
    assert watchdog_usec(env) is None  # WATCHDOG_PID names another process
    assert watchdog_usec(dict(env, WATCHDOG_PID=str(os.getpid()))) == 30_000_000
    n = Notifier.from_environ(env, unset=True)
    assert env == {"X": "y"}
    assert n.status("two\nlines") and n.watchdog()
    ns.wait_for("WATCHDOG=1")
    assert ["STATUS=two lines"] in ns.all()
    with pytest.raises(ValueError):
        n.notify("READY=1\nSTOPPING=1")
    n.close()
    ns.close()
    silent = Notifier.from_environ({})
    assert not silent.enabled and silent.ready() is False


def test_supervisor_withholds_pings_until_every_worker_moves() -> None:
    clock = VirtualClock()
    registry = HeartbeatRegistry(clock)
    sent: list[tuple[str, ...]] = []

    class Recorder(Notifier):
        def notify(self, *assignments: str) -> bool:
            sent.append(assignments)
            return True

    counter = {"n": 0}
    registry.watch("poller", lambda: counter["n"], max_silence=3.0)
    beat = registry.register("journald", max_silence=5.0)
    sup = Supervisor(
        Recorder(None),
        registry,
        lambda: "1 GPU ok; last poll 1s ago",
        watchdog_usec=2_000_000,
        monotonic=clock.monotonic,
    )
    sup.ready()
    assert sent[0][0] == "READY=1"
    for _ in range(10):  # 10 s of healthy ticks: one ping per second
        counter["n"] += 1
        beat.beat()
        sup.tick()
        clock.advance(1.0)
    assert sup.pings == 10
    # the journal reader stops beating: pings stop once it is 5 s silent
    for _ in range(8):
        counter["n"] += 1
        sup.tick()
        clock.advance(1.0)
    assert sup.withheld >= 2
    assert any(a == ("STATUS=STALLED: journald made no progress for 6.0s",) for a in sent), sent
    pings_before = sup.pings
    beat.beat()
    sup.tick()
    assert sup.pings == pings_before + 1  # recovered
    beat.close()
    assert registry.names() == ["poller"]


def test_reload_is_all_or_nothing(tmp_path: Path) -> None:
    from collections.abc import Mapping
    from typing import Any

    from gpuwatchd.core.reloading import Prepared

    cfg = tmp_path / "c.yaml"
    cfg.write_text("log_level: info\n")
    config = load_config(str(cfg), must_exist=True)
    daemon = Daemon(config, FakeBackend(count=1), VirtualClock(), serve_http=False)
    applied: list[str] = []

    class Checker:  # an owner that refuses the whole reload while "bad-rule" exists
        sections = ()

        def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
            if (tmp_path / "bad-rule").exists():
                from gpuwatchd.core.errors import ConfigError, Location

                raise ConfigError.at(Location(str(tmp_path / "r.yaml"), 3, 5), "bad rule")
            return Prepared(lambda: applied.append("rules"))

    daemon.owners.append(Checker())
    cfg.write_text("log_level: debug\n")
    assert daemon.reload() is True
    assert daemon.config.log_level == "debug" and applied == ["rules"]
    (tmp_path / "bad-rule").touch()
    cfg.write_text("log_level: warning\n")
    assert daemon.reload() is False  # an owner refused: nothing changes, nothing applied
    assert daemon.config.log_level == "debug" and applied == ["rules"]
    assert daemon.status()["config"]["last_reload"]["result"] == "failed"
    (tmp_path / "bad-rule").unlink()
    cfg.write_text("log_level: warning\npoll: {interval: 1s}\n")
    assert daemon.reload() is True
    assert daemon.config.log_level == "warning"
    assert daemon.config.poll == default_config().poll  # restart-only: kept
    assert "poll" in daemon.status()["config"]["restart_required"]


# -- the unit files -----------------------------------------------------------------------
def _unit_copy(tmp_path: Path, unit: Path, name: str | None = None) -> Path:
    """The unit with ExecStart pointing at an existing gpuwatchd (verify needs the binary)."""
    exe = shutil.which("gpuwatchd", path=str(Path(sys.executable).parent)) or sys.executable
    text = unit.read_text().replace("/usr/bin/gpuwatchd", exe)
    out = tmp_path / (name or unit.name)
    out.write_text(text)
    return out


def _exposure(unit: Path, cwd: Path) -> float:
    result = subprocess.run(
        [need_binary("systemd-analyze"), "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert m, result.stdout + result.stderr
    return float(m.group(1))


def _verify(*units: Path, cwd: Path) -> None:
    result = subprocess.run(
        [need_binary("systemd-analyze"), "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_unit_is_hardened_and_verifies(tmp_path: Path) -> None:
    unit = _unit_copy(tmp_path, UNIT)
    assert _exposure(unit, tmp_path) <= 2.0
    _verify(unit, cwd=tmp_path)
    text = UNIT.read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "User=gpuwatchd",
        "SupplementaryGroups=systemd-journal",
        "DevicePolicy=closed",
        "DeviceAllow=char-nvidia* rw",
        "ProtectSystem=strict",
        "StateDirectory=gpuwatchd",
        "RuntimeDirectory=gpuwatchd",
        "ConfigurationDirectory=gpuwatchd",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=\n",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "MemoryMax=512M",  # a backstop behind the daemon's own bounds (issue 26)
    ):
        assert line in text, line
    # resource guards (issue 23 item 8): a leak or a thread storm is bounded, and the OOM
    # killer takes a job before the watcher
    guards = dict(re.findall(r"^(MemoryHigh|MemoryMax|TasksMax|OOMScoreAdjust)=(\S+)$", text, re.M))
    assert guards.keys() == {"MemoryHigh", "MemoryMax", "TasksMax", "OOMScoreAdjust"}, guards
    mib = {k: int(guards[k].removesuffix("M")) for k in ("MemoryHigh", "MemoryMax")}
    assert 100 <= mib["MemoryHigh"] < mib["MemoryMax"]  # 2x the measured RSS at least
    assert int(guards["TasksMax"]) >= 64 and int(guards["OOMScoreAdjust"]) < 0


def test_kmsg_fallback_dropin_stays_within_budget(tmp_path: Path) -> None:
    dropin = ROOT / "systemd" / "examples" / "kmsg-fallback.conf"
    body = dropin.read_text().split("[Service]\n", 1)[1]
    text = _unit_copy(tmp_path, UNIT).read_text().replace("\n[Install]", body + "\n[Install]")
    unit = tmp_path / "gpuwatchd.service"
    unit.write_text(text)
    assert _exposure(unit, tmp_path) <= 2.0
    _verify(unit, cwd=tmp_path)


def test_drain_helper_units(tmp_path: Path) -> None:
    socket_unit = _unit_copy(tmp_path, ROOT / "systemd" / "gpuwatchd-drain.socket")
    template = _unit_copy(tmp_path, ROOT / "systemd" / "gpuwatchd-drain@.service")
    instance = _unit_copy(tmp_path, template, "gpuwatchd-drain@0-1.service")
    _verify(socket_unit, instance, cwd=tmp_path)
    assert _exposure(instance, tmp_path) <= 2.0
    text = socket_unit.read_text()
    assert "Accept=yes" in text and "SocketMode=0660" in text and "SocketGroup=gpuwatchd" in text
    assert "StandardInput=socket" in template.read_text()


def test_a_sighup_while_the_daemon_starts_does_not_kill_it(tmp_path: Path) -> None:
    """Before the fix a SIGHUP in the first half second (before the daemon's handler was
    installed) killed `run` with SIGHUP's default action, and systemd did not restart it."""
    import signal as sig
    import subprocess
    import time

    from conftest import GPUWATCHD, ROOT

    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"state_dir: {tmp_path / 'state'}\nsources: {{kernel_log: none}}\n")
    proc = subprocess.Popen(
        [
            *GPUWATCHD,
            "run",
            "-c",
            str(cfg),
            "--listen",
            "127.0.0.1:0",
            "--backend",
            f"scenario:{ROOT / 'tests' / 'data' / 'steady-4gpu.yaml'}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        first = ""  # what the process did with SIGHUP first: ignore it, or catch it
        while time.monotonic() < deadline and proc.poll() is None and not first:
            with open(f"/proc/{proc.pid}/status", encoding="ascii") as fh:
                masks = dict(line.split(":", 1) for line in fh if line.startswith("Sig"))
            if int(masks["SigIgn"], 16) & 1:
                first = "ignored"
            elif int(masks["SigCgt"], 16) & 1:
                first = "caught"
            time.sleep(0.002)
        assert first == "ignored", f"SIGHUP kept its default action until it was {first}"
        for _ in range(40):  # reload requests all through the start
            proc.send_signal(sig.SIGHUP)
            time.sleep(0.05)
        assert proc.poll() is None, f"the daemon died with {proc.returncode}"
    finally:
        proc.terminate()
        proc.wait(15)
