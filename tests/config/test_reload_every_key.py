"""Issue 24 item 2: SIGHUP never accepts a change silently. Every documented config key is
changed alone, one at a time, and sent to a running daemon with a real SIGHUP (its own main
loop, ``service.watchdog.serve``): each change is either applied (the running config and
the owning stage take the new value, nothing waits for a restart) or refused for its
section with a message (an error line, ``gpuwatchd_config_restart_required{key}`` 1 and
``status``'s ``config.restart_required``, the running value kept). Which of the two is
what docs/config.md's reload table says.

Before: the daemon kept a hand-written RESTART_ONLY list apart from the code that owns each
section, and a key nobody applied could be taken without effect (``sources.merge_window``
and ``log_format`` were, until the list was patched)."""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from gpuwatchd.configfile.loader import Config, config_keys, load_config
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.families import Families
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.service.sdnotify import Notifier
from gpuwatchd.service.watchdog import SignalInbox, Supervisor, serve
from gpuwatchd.testing.fake_backend import FakeBackend

BASE = """\
node_name: node17
state_dir: {tmp}/state
sources: {{kernel_log: none}}
receivers:
  - {{name: ops, type: webhook, url: 'http://127.0.0.1:9/'}}
drain:
  mode: exec
  exec: {{command: [/bin/true]}}
  state_file: null
"""

# One new value per documented key (YAML under the key; {tmp} is the test's directory).
CHANGES: dict[str, str] = {
    "node_name": "node18",
    "listen": "127.0.0.1:9999",
    "backend": "scenario:elsewhere.yaml",
    "state_dir": "{tmp}/other-state",
    "log_level": "debug",
    "log_format": "json",
    "poll.interval": "10s",
    "poll.call_timeout": "3s",
    "poll.nvlink": "false",
    "poll.processes": "false",
    "poll.worker": "false",
    "poll.worker_hang_timeout": "1m",
    "poll.slow_interval": "1m",
    "poll.nvlink_counters_interval": "5m",
    "poll.state_interval": "30s",
    "gpus.expected": "4",
    "gpus.ignore": "['00000000:3B:00.0']",
    "metrics.dcgm_compat": "true",
    "metrics.hostname_label": "false",
    "metrics.per_link": "false",
    "sources.kernel_log": "kmsg",
    "sources.journal_dir": "{tmp}/journal",
    "sources.kmsg_path": "{tmp}/kmsg",
    "sources.nvml_events": "false",
    "sources.merge_window": "5s",
    "sources.backfill": "1h",
    "receivers": "[{{name: ops, type: webhook, url: 'http://127.0.0.1:9/'}}, "
    "{{name: more, type: webhook, url: 'http://127.0.0.1:9/more'}}]",
    "routing.receivers": "[ops]",
    "routing.min_severity": "page",
    "routing.group_by": "[node, gpu]",
    "routing.group_wait": "10s",
    "routing.repeat_interval": "2h",
    "routing.ticket_repeat_interval": "2d",
    "routing.routes": "[{{match: {{severity: page}}, receivers: [ops]}}]",
    "routing.queue_size": "500",
    "routing.retry_initial": "2s",
    "routing.retry_max": "10m",
    "routing.give_up_after": "2d",
    "drain.mode": "slurm",
    "drain.dry_run": "true",
    "drain.node": "other-node",
    "drain.grace": "1m",
    "drain.rule_grace": "{{GpuXidFatal: 1m}}",
    "drain.notify_command": "[/bin/true]",
    "drain.state_file": "{tmp}/health.json",
    "drain.max_drains": "2",
    "drain.window": "2h",
    "drain.resume": "true",
    "drain.resume_hold": "1h",
    "drain.timeout": "10s",
    "drain.attempts": "3",
    "drain.hold_interval": "1m",
    "drain.fleet": "{{max_nodes: 2, census: slurm}}",
    "drain.exec": "{{command: [/bin/echo]}}",
    "drain.slurm": "{{scontrol: /usr/bin/scontrol}}",
    "drain.kubernetes": "{{taint: false}}",
    "rules.files": "[{tmp}/site.yaml]",
    "rules.defaults": "false",
    "rules.disable": "[GpuPcieDowntrained]",
    "rules.no_drain": "[NvswitchSxidFatal]",
    "rules.evaluation_interval": "30s",
    "xid.overrides": "{{43: {{text: reset the job}}}}",
    "web.config_file": "{tmp}/web.yml",
    "web.max_request_bytes": "4096",
    "web.rate_limit": "10",
    "web.rate_burst": "20",
    "web.ask_over_http": "true",
    "fields": "[{{id: 32, name: crc_l0, kind: counter}}]",
}


def leaf_keys() -> list[str]:
    """Every key the file accepts that holds a value (sections stand for their keys)."""
    keys = config_keys()
    return [k for k in keys if not any(other.startswith(k + ".") for other in keys)]


def documented_keys() -> set[str]:
    text = (ROOT / "docs" / "config.md").read_text()
    return set(re.findall(r"^\| `([a-z_][a-z_.]*)` \|", text, re.M))


def reload_table() -> dict[str, str]:
    """docs/config.md's reload table: key -> 'applied' or 'restart' (dotted exceptions
    written as "restart, except `merge_window`: applied")."""
    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split("## Reload (SIGHUP)", 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    for key, verdict, rest in re.findall(
        r"^\| `([a-z_]+)` \| (applied|restart)\b([^|]*)", section, re.M
    ):
        out[key] = verdict
        other = "restart" if verdict == "applied" else "applied"
        for sub in re.findall(r"except `([a-z_]+)`: " + other, rest):
            out[f"{key}.{sub}"] = other
    return out


def expected(key: str) -> str:
    table = reload_table()
    return table.get(key) or table[key.split(".")[0]]


def with_change(base: str, key: str, value: str) -> str:
    """``base`` with ``key`` set to ``value`` (a nested key merged into its section)."""
    top, _, sub = key.partition(".")
    lines = base.splitlines()
    if not sub:
        kept = [ln for ln in lines if not ln.startswith(top + ":")]
        if top in ("receivers",):  # a block in the base: drop its items too
            kept = [ln for ln in kept if not ln.startswith("  - ")]
        return "\n".join([*kept, f"{top}: {value}"]) + "\n"
    if any(ln.startswith(top + ":") for ln in lines):
        out = []
        for ln in lines:
            if ln.startswith(f"  {sub}:") and f"{top}:" in out:
                continue  # the base's own value of the key, replaced above
            if ln == f"{top}:":
                out += [ln, f"  {sub}: {value}"]
            elif ln.startswith(f"{top}: {{") and ln.endswith("}"):
                pairs = [p for p in ln[len(top) + 3 : -1].split(", ") if not p.startswith(sub)]
                out.append(f"{top}: {{{', '.join([f'{sub}: {value}', *pairs])}}}")
            else:
                out.append(ln)
        return "\n".join(out) + "\n"
    return base + f"{top}:\n  {sub}: {value}\n"


def dotted(config: Config, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        if hasattr(value, part):
            value = getattr(value, part)
            continue
        # a section shown as a key of its parent (a drain driver's: drain.slurm), or a
        # section whose keys are its parent's (a kernel-log kind's: sources.kmsg_path)
        meta = ("sections", "spread")
        (held,) = (f for f in dataclasses.fields(value) if any(f.metadata.get(m) for m in meta))
        if held.metadata.get("spread"):
            own = [s for s in getattr(value, held.name).values() if hasattr(s, part)]
            value = getattr(own[0], part) if own else None
        else:
            value = getattr(value, held.name).get(part)
    return value


def restart_gauge(daemon: Daemon) -> dict[str, float]:
    fams = Families()
    for extra in daemon.node.wiring.extra_families:
        extra(daemon.state.view(), fams)
    out = {}
    for line in fams.render().decode().splitlines():
        m = re.match(r'gpuwatchd_config_restart_required\{key="([a-z_]+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def test_every_documented_key_has_a_change_and_a_reload_row() -> None:
    assert set(CHANGES) == set(leaf_keys()), "give every config key a change to reload"
    assert set(leaf_keys()) <= documented_keys() | {k.split(".")[0] for k in leaf_keys()}
    keys = {f.name for f in dataclasses.fields(Config) if not f.metadata.get("internal")}
    assert {k for k in reload_table() if "." not in k} == keys


def test_every_key_is_applied_or_refused_under_sighup(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "site.yaml").write_text("rules: []\n")
    (tmp_path / "web.yml").write_text("{}\n")
    path = tmp_path / "gpuwatchd.yaml"
    base = BASE.format(tmp=tmp_path)
    path.write_text(base)
    config = load_config(str(path), must_exist=True, environ={})
    daemon = Daemon(config, FakeBackend(count=1), VirtualClock(), serve_http=False)
    running = daemon.config
    results: dict[str, tuple[str, str, Any]] = {}
    problems: list[str] = []

    def sighup() -> None:
        before = daemon.last_reload
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(600):
            if daemon.last_reload is not before:
                return
            threading.Event().wait(0.05)
        raise AssertionError("no reload after SIGHUP")

    def drive() -> None:
        try:
            for key in leaf_keys():
                text = with_change(base, key, CHANGES[key].format(tmp=tmp_path))
                path.write_text(text)
                new = load_config(str(path), must_exist=True, environ={})
                assert dotted(new, key) != dotted(running, key), f"{key}: no change"
                caplog.clear()
                sighup()
                last = daemon.last_reload or {}
                top = key.split(".")[0]
                why = daemon.status()["config"]["restart_required"].get(top, "")
                gauge = restart_gauge(daemon).get(top)
                if last.get("result") == "failed":
                    problems.append(f"{key}: the reload failed: {last.get('problems')}")
                elif why:
                    logged = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
                    assert gauge == 1.0, key
                    assert any(f"reload: {top} changed but is not applied" in m for m in logged)
                    results[key] = ("restart", why, dotted(daemon.config, key))
                else:
                    assert gauge == 0.0, key
                    results[key] = ("applied", "", dotted(daemon.config, key))
                    assert dotted(daemon.config, key) == dotted(new, key), key
                path.write_text(base)  # back to the start: nothing waits any more
                sighup()
                assert daemon.status()["config"]["restart_required"] == {}, key
                assert daemon.config == running, key
        except BaseException as exc:  # reported by the main thread
            problems.append(f"{type(exc).__name__}: {exc}")
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        with SignalInbox() as signals:
            driver = threading.Thread(target=drive, name="reload-driver")
            driver.start()
            stopped = serve(
                Supervisor.for_daemon(daemon, Notifier(None), {}), daemon.reload, signals
            )
            driver.join(60)
    finally:
        daemon.stop()
    assert problems == []
    assert stopped == "SIGTERM"
    assert set(results) == set(leaf_keys())
    for key, (verdict, why, value) in results.items():
        assert verdict == expected(key), f"{key}: {verdict} ({why}); docs/config.md says otherwise"
        if verdict == "restart":
            assert why and value == dotted(running, key), key
    # the owners really hold the applied values: spot checks of the live stages
    assert daemon.xids.merger.window == running.sources.merge_window  # put back at the end


def test_status_says_which_keys_wait_for_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuwatchd.cli.main import _print_status

    path = tmp_path / "gpuwatchd.yaml"
    path.write_text(f"state_dir: {tmp_path}/state\nsources: {{kernel_log: none}}\n")
    config = load_config(str(path), must_exist=True, environ={})
    daemon = Daemon(config, FakeBackend(count=1), VirtualClock(), serve_http=False)
    try:
        path.write_text(path.read_text() + "poll: {interval: 10s}\nlog_level: debug\n")
        assert daemon.reload()
        status = daemon.status()
        assert status["config"]["last_reload"]["result"] == "partly"
        assert list(status["config"]["restart_required"]) == ["poll"]
        _print_status(status, [], False)
        out = capsys.readouterr().out
        assert "config: poll changed, NOT applied until a restart: the GPU backend" in out
        assert restart_gauge(daemon) == {
            key: 1.0 if key == "poll" else 0.0 for key in restart_gauge(daemon)
        }
        path.write_text(path.read_text().replace("poll: {interval: 10s}\n", ""))
        assert daemon.reload()  # the file puts the running value back: nothing waits
        assert daemon.status()["config"]["restart_required"] == {}
        assert set(restart_gauge(daemon).values()) == {0.0}
    finally:
        daemon.stop()


def test_turning_actions_on_in_a_daemon_without_any_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpuwatchd.yaml"
    head = f"state_dir: {tmp_path}/state\nsources: {{kernel_log: none}}\n"
    path.write_text(head)
    config = load_config(str(path), must_exist=True, environ={})
    daemon = Daemon(config, FakeBackend(count=1), VirtualClock(), serve_http=False)
    try:
        assert daemon.node.actions is None
        path.write_text(head + "receivers:\n  - {name: ops, type: webhook, url: 'http://x/'}\n")
        assert daemon.reload()
        why = daemon.status()["config"]["restart_required"]["receivers"]
        assert "started without receivers or drain" in why
        assert daemon.config.receivers == ()
        path.write_text(head + "routing: {group_wait: 1s}\n")  # nothing to route: taken
        assert daemon.reload() and daemon.status()["config"]["restart_required"] == {}
    finally:
        daemon.stop()
