"""Issue 14 item 6: SIGHUP applies receivers, routing and drain changes, or refuses them
with a clear message and ``gpuwatchd_actions_restart_required`` 1. Before, a reload kept
the old receivers silently (messages kept going to the old URL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from actions_support import HttpReceiver, make_config, sink_for, transition
from conftest import free_port

from gpuwatchd.actions import RestartRequired, prepare_reload
from gpuwatchd.configfile.stages import for_actions
from gpuwatchd.core.clock import VirtualClock
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.families import Families


def hook(url: str, name: str = "ops") -> str:
    return f"  - {{name: {name}, type: webhook, url: '{url}/'}}\n"


def restart_required(sink: object) -> float:
    fams = Families()
    sink.families(None, fams)  # type: ignore[attr-defined]
    for line in fams.render().decode().splitlines():
        if line.startswith("gpuwatchd_actions_restart_required "):
            return float(line.split()[1])
    raise AssertionError("no gpuwatchd_actions_restart_required")


def test_reload_moves_messages_to_the_new_receivers_and_routing(tmp_path: Path) -> None:
    old, new, extra = (HttpReceiver(free_port()).start() for _ in range(3))
    clock = VirtualClock(1_800_000_000.0)
    config = make_config(tmp_path, "receivers:\n" + hook(old.url) + "routing:\n  group_wait: 0s\n")
    sink = sink_for(config, clock)
    try:
        sink.deliver([transition(gpu=0, at=clock.now())], clock.now())
        sink.run_pending()
        assert len(old.requests) == 1
        reloaded = make_config(
            tmp_path,
            "receivers:\n"
            + hook(new.url)
            + hook(extra.url, "extra")
            + "routing:\n  group_wait: 0s\n  group_by: [node, gpu]\n  min_severity: info\n",
            name="reloaded.yaml",
        )
        commit = prepare_reload(sink, for_actions(reloaded))
        sink.deliver([transition(gpu=1, at=clock.now())], clock.now())  # before the commit
        commit()
        sink.deliver([transition(gpu=2, at=clock.now())], clock.now())
        sink.run_pending()
        assert len(old.requests) == 1, "messages still go to the old URL"
        got = [sorted(a["labels"]["gpu"] for a in r.json()["alerts"]) for r in new.requests]
        # queued for "ops" before the commit (GPU 1 joined GPU 0's group): sent to the new
        # URL; after it, GPU 2 is a group of its own (the new group_by)
        assert got == [["0", "1"], ["2"]]
        assert [r.json()["alerts"][0]["labels"]["gpu"] for r in extra.requests] == ["2"]
        assert restart_required(sink) == 0.0
    finally:
        sink.close()
        for rx in (old, new, extra):
            rx.stop()


def test_reload_with_a_bad_secret_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    rx = HttpReceiver(free_port()).start()
    clock = VirtualClock(1_800_000_000.0)
    config = make_config(tmp_path, "receivers:\n" + hook(rx.url) + "routing:\n  group_wait: 0s\n")
    sink = sink_for(config, clock)
    try:
        bad = make_config(
            tmp_path,
            "receivers:\n  - {name: ops, type: webhook, url_file: /nonexistent/url}\n",
            name="bad.yaml",
        )
        with pytest.raises(ConfigError) as err:
            prepare_reload(sink, for_actions(bad))
        assert "bad.yaml" in str(err.value) and "ops" in str(err.value)
        sink.deliver([transition(at=clock.now())], clock.now())
        sink.run_pending()
        assert len(rx.requests) == 1
    finally:
        sink.close()
        rx.stop()


def test_turning_the_drain_on_takes_a_restart_and_says_so(tmp_path: Path) -> None:
    rx = HttpReceiver(free_port()).start()
    clock = VirtualClock(1_800_000_000.0)
    config = make_config(tmp_path, "receivers:\n" + hook(rx.url))
    sink = sink_for(config, clock)
    try:
        drained = make_config(
            tmp_path,
            "receivers:\n"
            + hook(rx.url)
            + "drain:\n  mode: exec\n  exec: {command: [/bin/true]}\n  state_file: null\n",
            name="drain.yaml",
        )
        with pytest.raises(RestartRequired) as err:
            prepare_reload(sink, for_actions(drained))
        assert "drain.mode: none -> exec takes a restart" in str(err.value)
        assert restart_required(sink) == 1.0
        prepare_reload(sink, for_actions(config))()  # a later reload that can be applied
        assert restart_required(sink) == 0.0
        with pytest.raises(RestartRequired):
            prepare_reload(None, for_actions(drained))  # started without any actions
    finally:
        sink.close()
        rx.stop()


def test_reload_applies_new_drain_settings(tmp_path: Path) -> None:
    first, second = tmp_path / "first.log", tmp_path / "second.log"
    scripts = []
    for log in (first, second):
        script = tmp_path / f"{log.stem}.sh"
        script.write_text(f"#!/bin/sh\necho drained >> {log}\n")
        script.chmod(0o755)
        scripts.append(script)
    drain = "drain:\n  mode: exec\n  exec: {{command: [{}]}}\n  state_file: null\n"
    clock = VirtualClock(1_800_000_000.0)
    sink = sink_for(make_config(tmp_path, drain.format(scripts[0])), clock)
    try:
        commit = prepare_reload(
            sink, for_actions(make_config(tmp_path, drain.format(scripts[1]), "b.yaml"))
        )
        commit()
        sink.deliver([transition(at=clock.now(), drain=True)], clock.now())
        sink.run_pending()
        assert not first.exists()
        assert second.read_text() == "drained\n"
    finally:
        sink.close()
