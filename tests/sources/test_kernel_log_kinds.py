"""Kernel-log sources as kinds (issue 24 item 3): one module each (its reader, whether it
can serve this host, how it is built) and one registry line; ``XidIntake`` has no
``if``/``isinstance`` chain over them."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from conftest import ROOT

from gpuwatchd.config.sections import SourcesConfig
from gpuwatchd.configfile.loader import ConfigError, load_config
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.intake import XidIntake, choose_kernel_log
from gpuwatchd.sources.kernel.journald import JournaldSection
from gpuwatchd.sources.kernel.kmsg import KmsgSection
from gpuwatchd.sources.kernel.registry import BY_NAME, KERNEL_LOG_CHOICES, KINDS, SECTIONS


def test_every_kind_the_config_names_is_in_the_registry() -> None:
    named = set(KERNEL_LOG_CHOICES) - {"auto", "none"}
    assert {k.name for k in KINDS if not k.scripted} == named
    assert set(BY_NAME) == {k.name for k in KINDS}


def test_auto_takes_the_first_kind_that_can_serve(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    own = {"journald": JournaldSection(str(tmp_path)), "kmsg": KmsgSection(str(kmsg))}
    sources = SourcesConfig(kernel_log="auto", kinds=own)
    assert choose_kernel_log(sources, object()) == "journald"  # a journal directory named
    explicit = dataclasses.replace(sources, kernel_log="kmsg")
    assert choose_kernel_log(explicit, object()) == "kmsg"


class Dropped:
    def emit(self, record: XidEvent) -> None:
        pass


def test_xid_intake_builds_the_kind_from_the_registry(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sources = SourcesConfig(kernel_log="kmsg", kinds={"kmsg": KmsgSection(str(kmsg))})
    clock = SystemClock()
    inputs = XidIntake(
        sources, 1.0, str(tmp_path), object(), clock, NodeState("n1", clock.now()), Dropped()
    )
    assert inputs.source is not None and inputs.source.name == "kmsg"
    health = inputs.state_health()
    assert health is not None and health.name == "kmsg_position"


def test_xid_intake_names_no_kind() -> None:
    """Adding a kind touches its module and the registry, not ``XidIntake``."""
    text = (ROOT / "gpuwatchd" / "sources" / "intake.py").read_text()
    names = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name)}
    assert not names & {"JournaldSource", "KmsgSource", "journal_available", "kmsg_available"}


def test_each_kind_reads_its_own_keys() -> None:
    """A kind's ``sources`` keys are read by the reader its ``KIND`` names into its own
    section type (issue 24: not fields of ``SourcesConfig``), and the config loader names
    none of them."""
    assert {kind: dict(s.options) for kind, s in SECTIONS.items() if s.options} == {
        "journald": {"journal_dir": BY_NAME["journald"].options["journal_dir"]},
        "kmsg": {"kmsg_path": BY_NAME["kmsg"].options["kmsg_path"]},
    }
    for s in SECTIONS.values():
        assert set(s.options) <= {f.name for f in dataclasses.fields(s.section)}
    fields = {f.name for f in dataclasses.fields(SourcesConfig)}
    assert not fields & {"journal_dir", "kmsg_path"}
    loader = (ROOT / "gpuwatchd" / "configfile" / "loader.py").read_text()
    sections = (ROOT / "gpuwatchd" / "config" / "sections.py").read_text()
    for text in (loader, sections):
        for word in ('"journal_dir"', '"kmsg_path"', '"journald"', '"kmsg"'):
            assert word not in text


def test_a_kinds_key_is_read_with_its_location(tmp_path: Path) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text("sources:\n  kernel_log: kmsg\n  kmsg_path: rel/kmsg\n  journal_dir: [1]\n")
    with pytest.raises(ConfigError) as bad:
        load_config(str(cfg), must_exist=True)
    assert bad.value.lines() == [f"{cfg}:4:16: sources.journal_dir: expected a string, got list"]
    cfg.write_text("sources:\n  kernel_log: kmsg\n  kmsg_path: rel/kmsg\n")
    sources = load_config(str(cfg), must_exist=True).sources
    kmsg = sources.section("kmsg", KmsgSection).kmsg_path
    assert kmsg == str(tmp_path / "rel" / "kmsg")  # relative to the file
    cfg.write_text("sources:\n  kmsg_path: /dev/kmsg\n  journal_dir: null\n")
    assert load_config(str(cfg), must_exist=True).sources == SourcesConfig()  # the defaults
    shown = load_config(str(cfg), must_exist=True).as_dict()["sources"]
    assert list(shown)[:3] == ["kernel_log", "journal_dir", "kmsg_path"]
    assert (shown["journal_dir"], shown["kmsg_path"]) == (None, "/dev/kmsg")


def test_kernel_log_names_only_the_registrys_kinds(tmp_path: Path) -> None:
    cfg = tmp_path / "g.yaml"
    cfg.write_text("sources:\n  kernel_log: scenario\n")
    with pytest.raises(ConfigError) as bad:
        load_config(str(cfg), must_exist=True)
    assert bad.value.lines() == [
        f"{cfg}:2:15: sources.kernel_log: 'scenario' is not one of auto, journald, kmsg, none"
    ]
