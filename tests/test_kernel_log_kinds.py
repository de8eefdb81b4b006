"""Kernel-log sources as kinds (issue 24 item 3): one module each (its reader, whether it
can serve this host, how it is built) and one registry line; ``XidIntake`` has no
``if``/``isinstance`` chain over them."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from conftest import ROOT

from gpuwatchd.config.loader import KERNEL_LOG_CHOICES, SourcesConfig
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.intake import XidIntake, choose_kernel_log
from gpuwatchd.sources.kernel.registry import BY_NAME, KINDS


def test_every_kind_the_config_names_is_in_the_registry() -> None:
    named = set(KERNEL_LOG_CHOICES) - {"auto", "none"}
    assert {k.name for k in KINDS if not k.scripted} == named
    assert set(BY_NAME) == {k.name for k in KINDS}


def test_auto_takes_the_first_kind_that_can_serve(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sources = SourcesConfig(kernel_log="auto", journal_dir=str(tmp_path), kmsg_path=str(kmsg))
    assert choose_kernel_log(sources, object()) == "journald"  # a journal directory named
    explicit = dataclasses.replace(sources, kernel_log="kmsg")
    assert choose_kernel_log(explicit, object()) == "kmsg"


class Dropped:
    def emit(self, record: XidEvent) -> None:
        pass


def test_xid_intake_builds_the_kind_from_the_registry(tmp_path: Path) -> None:
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    sources = SourcesConfig(kernel_log="kmsg", kmsg_path=str(kmsg))
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
