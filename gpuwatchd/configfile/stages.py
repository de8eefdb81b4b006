"""Each stage's own sections, cut out of the whole ``Config`` for the composition root
(the types are in ``config.stages``, beside the stages that take them)."""

from __future__ import annotations

from gpuwatchd.config.stages import ActionsSettings, RulesSettings
from gpuwatchd.configfile.loader import Config


def for_rules(config: Config) -> RulesSettings:
    return RulesSettings(
        rules=config.rules,
        xid=config.xid,
        fields=config.fields,
        ignore=config.gpus.ignore,
        state_dir=config.state_dir,
        source=config.source,
    )


def for_actions(config: Config) -> ActionsSettings:
    return ActionsSettings(
        node_name=config.node_name,
        state_dir=config.state_dir,
        receivers=config.receivers,
        routing=config.routing,
        drain=config.drain,
        source=config.source,
    )
