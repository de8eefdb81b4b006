"""The drain hook's safety rules with the exec mode: the documented environment, timeouts,
retries, grace with ``drain pending`` everywhere, the rate limit and its page, silences,
and drains only from rules that ask for one."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from actions_support import HttpReceiver, make_config, sink_for, transition
from conftest import free_port

from gpuwatchd.actions import ActionsSink
from gpuwatchd.actions.silences import add_silence, path_in
from gpuwatchd.core.alerts import AlertState
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.families import Families

HOOK = """#!/bin/sh
# records each call's GPUWATCHD_* environment as one JSON line
python3 - "$@" <<'EOF' >> {log}
import json, os
env = {{k: v for k, v in sorted(os.environ.items()) if k.startswith("GPUWATCHD_")}}
env.pop("GPUWATCHD_CONFIG_DIR", None)  # the test suite's, not the hook's
print(json.dumps(env))
EOF
{tail}
"""


def hook(tmp_path: Path, name: str = "hook.sh", tail: str = "exit 0") -> tuple[Path, Path]:
    log = tmp_path / f"{name}.log"
    script = tmp_path / name
    script.write_text(HOOK.format(log=log, tail=tail))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def calls(log: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def metrics(sink: ActionsSink) -> str:
    fams = Families()
    sink.families(None, fams)  # type: ignore[arg-type]
    return fams.render().decode()


def ops_receiver(rx: HttpReceiver) -> str:
    return (
        f"receivers:\n  - {{name: ops, type: webhook, url: '{rx.url}/'}}\n"
        "routing:\n  group_wait: 0s\n  group_by: [node, alertname]\n"
    )


def exec_config(tmp_path: Path, script: Path, extra: str = "", receivers: str = "") -> Any:
    return make_config(
        tmp_path,
        f"""{receivers}drain:
  mode: exec
  exec: {{command: ["{script}", "--from-gpuwatchd"]}}
  state_file: {tmp_path / "run" / "health.json"}
{extra}""",
    )


def test_exec_environment_and_resume(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script, "  resume: true\n  resume_hold: 5m\n"), clock)
    try:
        fire = transition(at=clock.now(), drain=True)
        sink.deliver([fire], clock.now())
        sink.run_pending()
        (call,) = calls(log)
        assert call == {
            "GPUWATCHD_ACTION": "drain",
            "GPUWATCHD_NODE": "node17",
            "GPUWATCHD_GPU": "3",
            "GPUWATCHD_UUID": "GPU-5d9e3c52-0a8c-4f1e-9b61-3f6c2f6e7a13",
            "GPUWATCHD_PCI_BUS_ID": "00000000:3E:00.0",
            "GPUWATCHD_XID": "79",
            "GPUWATCHD_RULE": "gpu_xid_fatal",
            "GPUWATCHD_SEVERITY": "page",
            "GPUWATCHD_REASON": "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0",
            "GPUWATCHD_INCIDENT": fire.idempotency_key,
        }
        assert json.loads((tmp_path / "run" / "health.json").read_text())["state"] == "drained"
        clock.advance(60)
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert len(calls(log)) == 1  # hold time not over
        clock.advance(300)
        sink.run_pending()
        assert calls(log)[1]["GPUWATCHD_ACTION"] == "resume"
        assert calls(log)[1]["GPUWATCHD_REASON"] == call["GPUWATCHD_REASON"]
        assert json.loads((tmp_path / "run" / "health.json").read_text())["state"] == "ok"
    finally:
        sink.close()


def test_only_transitions_that_ask_drain(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script), clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=False)], clock.now())
        sink.deliver(
            [transition("other", state=AlertState.RESOLVED, at=clock.now(), drain=True)],
            clock.now(),
        )
        sink.run_pending()
        assert calls(log) == []
        assert sink.status().as_json()["drain"]["incidents"] == []
    finally:
        sink.close()


def test_failing_hook_is_retried_then_pages(tmp_path: Path) -> None:
    script, log = hook(tmp_path, tail="echo 'scheduler unreachable' >&2; exit 3")
    rx = HttpReceiver(free_port()).start()
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(
        tmp_path,
        script,
        "  attempts: 3\n",
        receivers=ops_receiver(rx),
    )
    sink = sink_for(cfg, clock)
    try:
        # a drain rule that is not about an XID (an XID's drain never gives up: below)
        sink.deliver([transition("gpu_lost", at=clock.now(), drain=True, xid=None)], clock.now())
        for _ in range(3):
            sink.run_pending()
            clock.advance(600)
        assert len(calls(log)) == 3
        inc = sink.status().as_json()["drain"]["incidents"][0]
        assert inc["state"] == "failed" and inc["attempts"] == 3
        error = sink.status().as_json()["drain"]["last_error"]
        assert "exited with status 3: scheduler unreachable" in error
        sink.run_pending()
        rules = [a["labels"]["alertname"] for r in rx.requests for a in r.json()["alerts"]]
        assert "GpuwatchdDrainFailed" in rules
        assert 'gpuwatchd_drain_actions_total{action="drain",result="failed"} 1.0' in metrics(sink)
    finally:
        sink.close()
        rx.stop()


def test_an_xid_drain_is_never_given_up(tmp_path: Path) -> None:
    """Issue 28: five scheduler errors marked a fatal XID's drain failed for good (a 90 s
    slurmctld outage gave up 17 nodes with XID 79). Now it pages once after ``attempts``
    and keeps trying with backoff; when the scheduler answers again the node drains and the
    page resolves. Failed on main: the incident was 'failed' and the hook never ran again."""
    flag = tmp_path / "down"
    flag.touch()
    script, log = hook(
        tmp_path, tail=f"[ -e {flag} ] && {{ echo 'unreachable' >&2; exit 3; }}; true"
    )
    rx = HttpReceiver(free_port()).start()
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script, "  attempts: 3\n", ops_receiver(rx)), clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        for _ in range(6):
            sink.run_pending()
            clock.advance(600)
        assert len(calls(log)) == 6  # main: 3, then given up
        inc = sink.status().as_json()["drain"]["incidents"][0]
        assert inc["state"] == "pending" and inc["attempts"] == 6
        failed = [
            a["status"]
            for r in rx.requests
            for a in r.json()["alerts"]
            if a["labels"]["alertname"] == "GpuwatchdDrainFailed"
        ]
        assert failed == ["firing"]  # one page, not one per attempt
        flag.unlink()  # the scheduler answers again
        sink.run_pending()
        assert sink.status().as_json()["drain"]["state"] == "drained"
        failed = [
            a["status"]
            for r in rx.requests
            for a in r.json()["alerts"]
            if a["labels"]["alertname"] == "GpuwatchdDrainFailed"
        ]
        assert failed == ["firing", "resolved"]
    finally:
        sink.close()
        rx.stop()


def test_hook_timeout_kills_it(tmp_path: Path) -> None:
    script, _ = hook(tmp_path, tail="sleep 30")
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script, "  timeout: 500ms\n  attempts: 1\n"), clock)
    try:
        sink.deliver([transition("gpu_lost", at=clock.now(), drain=True, xid=None)], clock.now())
        sink.run_pending()
        error = sink.status().as_json()["drain"]["last_error"]
        assert "did not finish within 0.5s (killed)" in error
        assert sink.status().as_json()["drain"]["incidents"][0]["state"] == "failed"
    finally:
        sink.close()


def test_grace_shows_drain_pending_then_drains(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    notify, notify_log = hook(tmp_path, "notify.sh")
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(
        tmp_path,
        script,
        f'  grace: 2m\n  rule_grace: {{gpu_lost: 0s}}\n  notify_command: ["{notify}"]\n',
    )
    sink = sink_for(cfg, clock)
    health = tmp_path / "run" / "health.json"
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert calls(log) == []
        doc = json.loads(health.read_text())
        assert doc["state"] == "drain_pending" and doc["drain_pending"] is True
        assert doc["drain_at"] == clock.now() + 120
        assert doc["reason"] == "gpuwatchd: XID 79 GPU 3 00000000:3E:00.0"
        assert doc["incidents"][0]["rule"] == "gpu_xid_fatal"
        assert sink.status().as_json()["drain"]["state"] == "drain_pending"
        assert "gpuwatchd_drain_pending 1.0" in metrics(sink)
        (note,) = calls(notify_log)
        assert note["GPUWATCHD_ACTION"] == "drain_pending"
        assert note["GPUWATCHD_DRAIN_AT"] == f"{clock.now() + 120:.3f}"
        assert note["GPUWATCHD_GRACE_SECONDS"] == "120"
        clock.advance(119)
        sink.run_pending()
        assert calls(log) == []
        clock.advance(1)
        sink.run_pending()
        assert [c["GPUWATCHD_ACTION"] for c in calls(log)] == ["drain"]
        assert json.loads(health.read_text())["state"] == "drained"
        assert "gpuwatchd_drain_pending 0.0" in metrics(sink)
        assert "gpuwatchd_drained 1.0" in metrics(sink)
        # a rule with grace 0 (the GPU is already gone) is due at once; the node is drained
        # already, so the hook does not run again (one drain per node, not per alert)
        sink.deliver(
            [transition("gpu_lost", at=clock.now(), drain=True, gpu=5, xid=None)], clock.now()
        )
        sink.run_pending()
        assert len(calls(log)) == 1 and len(calls(notify_log)) == 1
        states = {i["rule"]: i["state"] for i in sink.status().as_json()["drain"]["incidents"]}
        assert states == {"gpu_xid_fatal": "drained", "gpu_lost": "already"}
        assert (os.stat(health).st_mode & 0o777) == 0o644
    finally:
        sink.close()


def test_resolved_during_grace_cancels_the_drain(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script, "  grace: 5m\n"), clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        clock.advance(60)
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        clock.advance(600)
        sink.run_pending()
        assert calls(log) == []
        assert sink.status().as_json()["drain"]["incidents"][0]["state"] == "cancelled"
        assert json.loads((tmp_path / "run" / "health.json").read_text())["state"] == "ok"
    finally:
        sink.close()


def test_a_burst_across_gpus_is_one_drain(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    sink = sink_for(exec_config(tmp_path, script, "  max_drains: 2\n"), clock)
    try:
        burst = [transition(f"r{gpu}", at=clock.now(), drain=True, gpu=gpu) for gpu in range(8)]
        sink.deliver(burst, clock.now())  # a burst of firing drain alerts across 8 GPUs
        sink.run_pending()
        assert len(calls(log)) == 1
        states = [i["state"] for i in sink.status().as_json()["drain"]["incidents"]]
        assert states == ["drained"] + ["already"] * 7
        text = metrics(sink)
        assert "gpuwatchd_drains_in_window 1.0" in text
        assert "gpuwatchd_drain_rate_limited_total 0.0" in text
    finally:
        sink.close()


def test_rate_limit_holds_and_pages(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    rx = HttpReceiver(free_port()).start()
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(
        tmp_path,
        script,
        "  max_drains: 2\n  window: 1h\n  resume: true\n  resume_hold: 0s\n",
        receivers=ops_receiver(rx),
    )
    sink = sink_for(cfg, clock)

    def flap(gpu: int) -> None:  # a fault that drains, clears and is resumed
        sink.deliver([transition(at=clock.now(), drain=True, gpu=gpu)], clock.now())
        sink.run_pending()
        clock.advance(60)
        resolved = transition(state=AlertState.RESOLVED, seq=2, at=clock.now(), gpu=gpu)
        sink.deliver([resolved], clock.now())
        sink.run_pending()
        clock.advance(60)

    def limit_pages() -> list[str]:
        return [
            a["status"]
            for r in rx.requests
            for a in r.json()["alerts"]
            if a["labels"]["alertname"] == "GpuwatchdDrainLimitReached"
        ]

    try:
        for gpu in range(4):
            flap(gpu)
        actions = [c["GPUWATCHD_ACTION"] for c in calls(log)]
        assert actions == ["drain", "resume", "drain", "resume"]  # the 3rd and 4th: held
        states = [i["state"] for i in sink.status().as_json()["drain"]["incidents"]]
        assert states == ["resumed", "resumed", "rate_limited", "rate_limited"]
        text = metrics(sink)
        assert "gpuwatchd_drain_rate_limited_total 2.0" in text
        assert "gpuwatchd_drains_in_window 2.0" in text
        assert limit_pages() == ["firing"]  # one page, not one per held drain
        # the window moves on: the limit page resolves, and a new fault drains again
        clock.advance(3600)
        sink.run_pending()
        assert limit_pages() == ["firing", "resolved"]
        sink.deliver([transition(at=clock.now(), drain=True, gpu=9)], clock.now())
        sink.run_pending()
        assert [c["GPUWATCHD_ACTION"] for c in calls(log)][-1] == "drain"
        assert len(calls(log)) == 5
    finally:
        sink.close()
        rx.stop()


def test_silenced_gpu_is_not_drained(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(tmp_path, script)
    os.makedirs(cfg.state_dir, exist_ok=True)
    add_silence(
        path_in(cfg.state_dir),
        node="node17",
        gpu="00000000:3E:00.0",
        rule=None,
        duration=3600,
        reason="RMA",
        author="t",
        now=clock.now(),
    )
    sink = sink_for(cfg, clock)
    try:
        sink.deliver(
            [
                transition(at=clock.now(), drain=True, gpu=3),
                transition(at=clock.now(), drain=True, gpu=4),
            ],
            clock.now(),
        )
        sink.run_pending()
        assert [c["GPUWATCHD_GPU"] for c in calls(log)] == ["4"]
        states = {i["gpu"]: i["state"] for i in sink.status().as_json()["drain"]["incidents"]}
        assert states == {"3": "silenced", "4": "drained"}
    finally:
        sink.close()


def test_a_drain_held_by_a_silence_happens_when_it_ends(tmp_path: Path) -> None:
    """Issue 24: after a silence ended, a drain rule still firing paged (the notifier
    re-sends it) but never drained: its incident stayed 'silenced' for good. Now, once no
    silence covers it and it still fires, it drains (after its grace, counted from then)."""
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(tmp_path, script)
    os.makedirs(cfg.state_dir, exist_ok=True)
    add_silence(
        path_in(cfg.state_dir),
        node="node17",
        gpu=None,
        rule=None,
        duration=600,
        reason="maintenance",
        author="t",
        now=clock.now(),
    )
    sink = sink_for(cfg, clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=True, gpu=3)], clock.now())
        sink.run_pending()
        assert calls(log) == []
        assert sink.status().as_json()["drain"]["incidents"][0]["state"] == "silenced"
        clock.advance(601)  # the silence is over; GPU 3 still has its XID 79
        sink.run_pending()
        assert [c["GPUWATCHD_GPU"] for c in calls(log)] == ["3"]  # main: no drain
        assert sink.status().as_json()["drain"]["state"] == "drained"
    finally:
        sink.close()


def test_drain_survives_a_restart_mid_grace(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(tmp_path, script, "  grace: 1m\n")
    sink = sink_for(cfg, clock)
    fire = transition(at=clock.now(), drain=True)
    sink.deliver([fire], clock.now())
    sink.run_pending()
    sink.close()
    clock.advance(61)
    sink = sink_for(cfg, clock)
    try:
        sink.deliver([fire], clock.now())  # replayed by the rule engine after the restart
        sink.run_pending()
        assert len(calls(log)) == 1  # drained once, after the grace that started before
        assert sink.status().as_json()["drain"]["state"] == "drained"
    finally:
        sink.close()


def cascade(sink: ActionsSink, clock: VirtualClock) -> None:
    """One failing board: XID 79 on GPU 3, then GPU 3 lost, then the same on GPU 4."""
    for gpu in (3, 4):
        for rule, xid in (("gpu_xid_fatal", 79), ("gpu_lost", None)):
            sink.deliver(
                [transition(rule, at=clock.now(), drain=True, gpu=gpu, xid=xid)], clock.now()
            )
            sink.run_pending()
            clock.advance(5)


def test_dry_run_counts_like_the_real_run(tmp_path: Path) -> None:
    """Issue 14.6: in dry-run one cascade reported two "would drain", two rate-limited
    incidents and a false "drain limit reached" page while the real run drained once.
    (Fails on the old code: dry-run gave dry_run, dry_run, rate_limited, rate_limited.)"""
    script, log = hook(tmp_path)
    rx = HttpReceiver(free_port()).start()
    results: dict[bool, list[str]] = {}
    try:
        for dry in (False, True):
            work = tmp_path / ("dry" if dry else "real")
            work.mkdir()
            cfg = exec_config(
                work,
                script,
                f"  max_drains: 2\n  window: 1h\n  dry_run: {str(dry).lower()}\n",
                receivers=ops_receiver(rx),
            )
            clock = VirtualClock(1_767_225_600.0)
            sink = sink_for(cfg, clock)
            try:
                cascade(sink, clock)
                results[dry] = [i["state"] for i in sink.status().as_json()["drain"]["incidents"]]
                assert "gpuwatchd_drain_rate_limited_total 0.0" in metrics(sink)
                assert "gpuwatchd_drains_in_window 1.0" in metrics(sink)
            finally:
                sink.close()
        assert results[False] == ["drained", "already", "already", "already"]
        assert results[True] == ["dry_run", "already", "already", "already"]
        assert [c["GPUWATCHD_ACTION"] for c in calls(log)] == ["drain"]  # the real run only
        pages = [a["labels"]["alertname"] for r in rx.requests for a in r.json()["alerts"]]
        assert "GpuwatchdDrainLimitReached" not in pages, pages
    finally:
        rx.stop()


def test_dry_run_resume_follows_its_would_be_drain(tmp_path: Path) -> None:
    script, log = hook(tmp_path)
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(tmp_path, script, "  dry_run: true\n  resume: true\n  resume_hold: 0s\n")
    sink = sink_for(cfg, clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        sink.deliver([transition(state=AlertState.RESOLVED, seq=2, at=clock.now())], clock.now())
        sink.run_pending()
        text = metrics(sink)
        assert 'gpuwatchd_drain_actions_total{action="drain",result="dry_run"} 1.0' in text
        assert 'gpuwatchd_drain_actions_total{action="resume",result="dry_run"} 1.0' in text
        # after the would-be resume a new fault would drain again
        clock.advance(60)
        sink.deliver([transition(at=clock.now(), drain=True, seq=3)], clock.now())
        sink.run_pending()
        assert 'gpuwatchd_drain_actions_total{action="drain",result="dry_run"} 2.0' in metrics(sink)
        assert calls(log) == []
    finally:
        sink.close()


def test_notify_command_runs_once_per_drain(tmp_path: Path) -> None:
    """Issue 14.6: ``notify_command`` ran twice for one cascade (XID 79 then GPU lost, both
    with a grace). Fails on the old code: two notify calls."""
    script, log = hook(tmp_path)
    notify, notify_log = hook(tmp_path, "notify.sh")
    clock = VirtualClock(1_767_225_600.0)
    cfg = exec_config(tmp_path, script, f'  grace: 2m\n  notify_command: ["{notify}"]\n')
    sink = sink_for(cfg, clock)
    try:
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        clock.advance(10)
        sink.deliver([transition("gpu_lost", at=clock.now(), drain=True, xid=None)], clock.now())
        sink.run_pending()
        assert len(calls(notify_log)) == 1
        clock.advance(120)
        sink.run_pending()
        assert [c["GPUWATCHD_ACTION"] for c in calls(log)] == ["drain"]
        # the node is drained: a later fault with a grace announces no drain
        sink.deliver([transition(at=clock.now(), drain=True, gpu=5)], clock.now())
        sink.run_pending()
        assert len(calls(notify_log)) == 1
    finally:
        sink.close()


def test_simulate_records_one_drain_for_a_fallen_off_bus_cascade(tmp_path: Path) -> None:
    """Issue 24: ``simulate`` recorded two drains for one fallen-off-bus cascade (XID 79,
    then GPU lost) and, with ``max_drains: 1``, rate-limited the second, where the daemon
    says "already" (the node is drained by gpuwatchd). Now simulate says what the daemon
    does: one drain, then "already"."""
    import subprocess

    from conftest import GPUWATCHD, ROOT

    cfg = tmp_path / "sim.yaml"
    cfg.write_text(
        f"node_name: sim\nstate_dir: {tmp_path / 'state'}\ndrain: {{mode: slurm, max_drains: 1}}\n"
    )
    out = subprocess.run(
        [*GPUWATCHD, "simulate", str(ROOT / "scenarios" / "fallen-off-bus.yaml"), "-c", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=True,
    ).stdout
    drains = [
        r
        for r in map(json.loads, out.splitlines())
        if r.get("record") == "drain" and r["action"] == "drain"
    ]
    assert [d["result"] for d in drains] == ["dry_run", "already"], drains  # main: rate_limited
