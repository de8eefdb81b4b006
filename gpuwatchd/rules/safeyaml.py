"""YAML parsing with limits, for files an operator (or an attacker with write access to
rules.d) controls: a size cap and a cap on the number of nodes after alias expansion, so
that a "billion laughs" document is refused in linear time instead of eating the daemon.

Errors are ``ConfigError`` with ``PATH:LINE:COL`` like every other file error.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpuwatchd.config import yamlsrc
from gpuwatchd.config.yamlsrc import Node
from gpuwatchd.core.errors import ConfigError, Location

MAX_BYTES = 4 * 1024 * 1024
MAX_NODES = 200_000


def _at(path: str, mark: Any) -> Location:
    if mark is None:
        return Location(path, 1, 1)
    return Location(path, mark.line + 1, mark.column + 1)


# libyaml's parser where PyYAML has it (Debian's python3-yaml does): the same events, 20
# times faster, which is most of the cost of checking thousands of rule files.
_EVENT_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_expansion(text: str, path: str, max_nodes: int = MAX_NODES) -> None:
    """Count the nodes the document has once every alias is expanded; refuse recursive
    aliases and documents over ``max_nodes``. Syntax errors are left to the parser."""
    sizes: dict[str, int] = {}
    stack: list[list[object]] = []  # open collections: [expanded size, anchor]
    expanded = 0
    try:
        for event in yaml.parse(text, Loader=_EVENT_LOADER):
            n = 0
            if isinstance(event, yaml.AliasEvent):
                anchor = event.anchor
                if anchor in sizes:
                    n = sizes[anchor]
                elif any(frame[1] == anchor for frame in stack):
                    raise ConfigError.at(
                        _at(path, event.start_mark),
                        f"recursive YAML alias *{anchor} (it refers to a node that contains it)",
                    )
                else:
                    continue  # undefined alias: the parser reports it
            elif isinstance(event, yaml.ScalarEvent):
                n = 1
                if event.anchor:
                    sizes[event.anchor] = 1
            elif isinstance(event, yaml.CollectionStartEvent):
                expanded += 1
                stack.append([1, event.anchor])
                if len(stack) > yamlsrc.MAX_DEPTH:  # before PyYAML's scanner goes quadratic
                    raise ConfigError.at(
                        _at(path, event.start_mark),
                        f"YAML error: nested too deeply (more than {yamlsrc.MAX_DEPTH} levels)",
                    )
            elif isinstance(event, yaml.CollectionEndEvent):
                size, anchor_obj = stack.pop()
                assert isinstance(size, int)
                if isinstance(anchor_obj, str):
                    sizes[anchor_obj] = size
                if stack:
                    count = stack[-1][0]
                    assert isinstance(count, int)
                    stack[-1][0] = count + size
                continue
            else:
                continue
            expanded += n
            if stack:
                count = stack[-1][0]
                assert isinstance(count, int)
                stack[-1][0] = count + n
            if expanded > max_nodes:
                raise ConfigError.at(
                    _at(path, event.start_mark),
                    f"document too large after alias expansion (more than {max_nodes} "
                    "nodes): YAML aliases multiplying content are refused",
                )
    except yaml.YAMLError:
        return


def parse_limited(text: str, path: str) -> Node | None:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise ConfigError.at(
            Location(path, 1, 1), f"file too large (more than {MAX_BYTES // 1024 // 1024} MiB)"
        )
    check_expansion(text, path)
    return yamlsrc.parse(text, path)


def load_limited(path: str) -> Node | None:
    data = yamlsrc.read_file(path, MAX_BYTES)  # never blocks on a FIFO, never a device
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError.at(Location(path, 1, 1), f"not UTF-8 text: {exc.reason}") from None
    try:
        return parse_limited(text, path)
    except ConfigError as exc:
        yamlsrc.hide_private_text(exc.problems, path)
        raise ConfigError(exc.problems) from None
