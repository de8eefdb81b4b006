"""Who applies a reloaded config section: the owner protocol that SIGHUP goes through.

Every top-level config key belongs to exactly one owner: the stage built from it. At a
reload the daemon diffs the running config against the new one, key by key, and asks each
owner to ``prepare`` its keys. An owner either returns how to apply them (``Prepared.apply``,
called only once every owner agreed), or names the changed keys it cannot apply while
running (``Prepared.refused``: key -> why). It raises ``ConfigError`` when a new value is
unusable (a rule file that does not load, a secret it cannot read): the whole reload is
refused then, and nothing changes.

A refused key keeps its running value; the daemon says so loudly (an error log line, the
``gpuwatchd_config_restart_required`` gauge and the ``config`` part of ``status``) until a
restart or a reload that puts the old value back. A changed key that no owner claims is
refused the same way: nothing is ever accepted silently.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

Apply = Callable[[], None]


@dataclass(frozen=True)
class Prepared:
    """An owner's answer: what to run to apply its keys, and the keys it refuses."""

    apply: Apply | None = None
    refused: Mapping[str, str] = field(default_factory=dict)


class SectionOwner(Protocol):
    """A stage that owns some top-level config keys and says how a reload reaches them."""

    @property
    def sections(self) -> tuple[str, ...]:
        """The top-level keys it owns."""
        ...

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        """``new``: the new value of each owned key; ``changed``: the owned keys whose value
        differs from the running one. Raises ``ConfigError`` to refuse the whole reload."""
        ...


@dataclass(frozen=True)
class RestartOnly:
    """An owner whose keys are read once at start: any change is refused with ``why``."""

    sections: tuple[str, ...]
    why: str

    def prepare(self, new: Mapping[str, Any], changed: frozenset[str]) -> Prepared:
        return Prepared(refused={key: self.why for key in changed})


def owner_table(owners: list[SectionOwner]) -> dict[str, SectionOwner]:
    """Each key's owner; ``ValueError`` when two owners claim one key."""
    table: dict[str, SectionOwner] = {}
    for owner in owners:
        for key in owner.sections:
            if key in table:
                raise ValueError(f"config key {key!r} has two owners")
            table[key] = owner
    return table


@dataclass(frozen=True)
class ReloadPlan:
    """What a reload will do: the changes to apply and the keys refused (key -> why)."""

    applies: tuple[Apply, ...]
    refused: Mapping[str, str]


def plan_reload(
    owners: list[SectionOwner], old: Mapping[str, Any], new: Mapping[str, Any]
) -> ReloadPlan:
    """Diff ``old`` against ``new`` (both: key -> section value) and ask every owner.

    Every owner is asked, changed keys or not (a rule file may have changed on disk under
    an unchanged ``rules`` section). A changed key without an owner is refused. Raises what
    an owner raises (``ConfigError``): then nothing is applied.
    """
    table = owner_table(owners)
    changed = frozenset(k for k in new if new[k] != old.get(k))
    refused: dict[str, str] = {
        k: "no part of the running daemon applies it" for k in sorted(changed - set(table))
    }
    applies: list[Apply] = []
    for owner in owners:
        mine = {k: new[k] for k in owner.sections if k in new}
        answer = owner.prepare(mine, changed & set(mine))
        refused.update({k: v for k, v in answer.refused.items() if k in changed})
        if answer.apply is not None:
            applies.append(answer.apply)
    return ReloadPlan(tuple(applies), dict(sorted(refused.items())))
