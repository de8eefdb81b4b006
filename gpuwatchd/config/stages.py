"""Each stage's part of the config: what the composition root hands a stage to build it.

No stage is built from the whole ``Config`` (tests/service/test_architecture.py checks that no
stage module imports it, and that no stage constructor takes one): the composition root
(``service.assembly``) cuts out the sections a stage reads with ``configfile.stages``, so
what a stage depends on is written in one type, and a reload can ask each stage about its
own sections only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuwatchd.config.actions import DrainConfig, RoutingConfig
from gpuwatchd.config.receivers import ReceiverConfig
from gpuwatchd.config.rules import RulesConfig
from gpuwatchd.config.sections import XidConfig
from gpuwatchd.core.fields import ExtraField


@dataclass(frozen=True)
class RulesSettings:
    """The rule engine's input: its ``rules`` and ``xid`` sections, plus facts it reads
    from others (the extra NVML ``fields`` rules may name, ``gpus.ignore``, where its
    state lives, and the config file for error locations)."""

    rules: RulesConfig
    xid: XidConfig
    fields: tuple[ExtraField, ...] = ()
    ignore: tuple[str, ...] = ()
    state_dir: str = ""
    source: str | None = None


@dataclass(frozen=True)
class ActionsSettings:
    """The actions stage's input: the ``receivers``, ``routing`` and ``drain`` sections,
    the node's name (pages, drain reasons) and where the outbox lives."""

    node_name: str
    state_dir: str
    receivers: tuple[ReceiverConfig, ...] = ()
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    source: str | None = field(default=None, compare=False)  # the file, for error locations

    @property
    def wanted(self) -> bool:
        """Whether anything is configured to receive actions (a receiver or a drain)."""
        return bool(self.receivers) or self.drain.mode != "none"
