"""YAML loading that keeps source positions, and typed readers that report them.

Config, rule and scenario files all go through here, so that every mistake becomes a
``ConfigError`` naming ``PATH:LINE:COL``. A ``Node`` is a parsed YAML value together with
where it came from; the ``Reader`` helpers pull typed values out of nodes and collect
problems instead of stopping at the first one.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import yaml

from gpuwatchd.core.errors import ConfigError, Location
from gpuwatchd.core.statefile import open_regular
from gpuwatchd.core.units import MAX_DURATION as MAX_DURATION
from gpuwatchd.core.units import parse_duration as parse_duration  # config/actions.py uses it


@dataclass
class Node:
    """A YAML value with its location. Mappings hold ``{key: (key_node, value_node)}``."""

    value: Any
    loc: Location
    tag: str = ""

    def is_mapping(self) -> bool:
        return isinstance(self.value, dict)

    def is_sequence(self) -> bool:
        return isinstance(self.value, list)

    def get(self, key: str) -> Node | None:
        if not isinstance(self.value, dict):
            return None
        pair = self.value.get(key)
        return None if pair is None else pair[1]

    def items(self) -> Iterator[tuple[Node, Node]]:
        if isinstance(self.value, dict):
            yield from self.value.values()

    def plain(self) -> Any:
        """The value without positions (plain dicts, lists and scalars)."""
        if isinstance(self.value, dict):
            return {k: v.plain() for k, (_, v) in self.value.items()}
        if isinstance(self.value, list):
            return [v.plain() for v in self.value]
        return self.value


def _loc(path: str, mark: Any) -> Location:
    return Location(path, mark.line + 1, mark.column + 1)


# libyaml's parser and composer (C) where PyYAML was built with it, as Debian's is: the
# same node tree with the same marks, several times faster than the pure-Python one.
_BASE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):  # type: ignore[valid-type,misc]
    pass


# YAML 1.1 (PyYAML) reads a plain ``013`` as octal 11 and ``1:30`` as 90 (base 60): numbers
# nobody writing an XID code, a port or a count means. Such scalars are refused, with the
# fix in the message; quoted, they stay strings.
_LEADING_ZERO_RE = re.compile(r"[-+]?0[0-9_]+", re.ASCII)
_SEXAGESIMAL_RE = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?", re.ASCII)
_INT_TAG = "tag:yaml.org,2002:int"
_FLOAT_TAG = "tag:yaml.org,2002:float"


MAX_NUMBER_CHARS = 64
"""Longest plain number accepted (Python refuses to convert ints of more than 4300 digits)."""


def _check_number_spelling(path: str, node: yaml.ScalarNode) -> None:
    if node.style:  # quoted or a block: a string, as written (plain is None, or "" in libyaml)
        return
    text = node.value
    if node.tag in (_INT_TAG, _FLOAT_TAG) and len(text) > MAX_NUMBER_CHARS:
        raise ConfigError.at(
            _loc(path, node.start_mark),
            f"number too long ({len(text)} characters; at most {MAX_NUMBER_CHARS})",
        )
    if _LEADING_ZERO_RE.fullmatch(text):
        plain = ("-" if text.startswith("-") else "") + (text.lstrip("+-").lstrip("0_") or "0")
        raise ConfigError.at(
            _loc(path, node.start_mark),
            f"number {text!r} has a leading zero, which YAML 1.1 reads as octal "
            f"(or as a string): write {plain} for the number, or quote it for a string",
        )
    if node.tag in (_INT_TAG, _FLOAT_TAG) and _SEXAGESIMAL_RE.fullmatch(text):
        raise ConfigError.at(
            _loc(path, node.start_mark),
            f"{text!r} is a base-60 number in YAML 1.1 "
            f"({yaml.safe_load(text)!r}): quote it if a string is meant",
        )


def _construct_scalar(path: str, loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Node:
    _check_number_spelling(path, node)
    value = loader.construct_object(node, deep=True)
    if isinstance(value, str) and "\x00" in value:  # only a "\0" escape can make one
        raise ConfigError.at(
            _loc(path, node.start_mark), "a NUL character (\\0) is not allowed in a value"
        )
    return Node(value, _loc(path, node.start_mark), node.tag)


MAX_BYTES = 4 * 1024 * 1024
"""Largest YAML file (config, rules, scenario) that is read at all."""
MAX_NODES = 200_000
"""Most values a document may hold once every alias is expanded ("billion laughs")."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""


# libyaml's event parser where PyYAML has it: the pre-pass below costs a fraction of the
# composing that follows, which matters for thousands of rule files.
_EVENT_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_expansion(text: str, path: str, max_nodes: int = MAX_NODES) -> None:
    """Refuse, from the event stream and before any node is built, a document that nests
    deeper than ``MAX_DEPTH`` (before PyYAML's scanner goes quadratic on it), a recursive
    alias, or more than ``max_nodes`` values once every alias is expanded (a "billion
    laughs"), in time linear in the text. Syntax errors are left to the parser."""
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
                        _loc(path, event.start_mark),
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
                if len(stack) > MAX_DEPTH:
                    raise ConfigError.at(
                        _loc(path, event.start_mark),
                        f"YAML error: nested too deeply (more than {MAX_DEPTH} levels)",
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
                    _loc(path, event.start_mark),
                    f"document too large after alias expansion (more than {max_nodes} "
                    "nodes): YAML aliases multiplying content are refused",
                )
    except yaml.YAMLError:
        return


def _build(path: str, loader: yaml.SafeLoader, node: yaml.Node, depth: int = 0) -> Node:
    if depth > MAX_DEPTH:  # check_expansion refused it already; a guard against recursion
        raise ConfigError.at(
            _loc(path, node.start_mark),
            f"YAML error: nested too deeply (more than {MAX_DEPTH} levels)",
        )
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        out: dict[str, tuple[Node, Node]] = {}
        for key_node, value_node in node.value:
            key = _build(path, loader, key_node, depth + 1)
            if not isinstance(key.value, str | int | float | bool) or key.value is None:
                raise ConfigError.at(key.loc, "mapping keys must be plain scalars")
            skey = str(key.value)
            if skey in out:
                raise ConfigError.at(key.loc, f"duplicate key {skey!r}")
            value = _build(path, loader, value_node, depth + 1)
            out[skey] = (Node(skey, key.loc, key.tag), value)
        return Node(out, _loc(path, node.start_mark), node.tag)
    if isinstance(node, yaml.SequenceNode):
        items = [_build(path, loader, child, depth + 1) for child in node.value]
        return Node(items, _loc(path, node.start_mark), node.tag)
    assert isinstance(node, yaml.ScalarNode)
    return _construct_scalar(path, loader, node)


def parse(text: str, path: str, *, max_nodes: int = MAX_NODES) -> Node | None:
    """Parse YAML text into a ``Node`` tree; ``None`` for an empty document.

    Hostile input is refused with a ``ConfigError``, within limits: more than ``MAX_BYTES``
    of text, more than ``max_nodes`` values after alias expansion, nesting deeper than
    ``MAX_DEPTH``.
    """
    if len(text) > MAX_BYTES:
        raise ConfigError.at(Location(path, 1, 1), _too_large())
    check_expansion(text, path, max_nodes)
    try:
        loader = _Loader(text)
    except yaml.reader.ReaderError as exc:
        raise ConfigError.at(
            _reader_location(path, text, exc), f"YAML error: {exc.reason}"
        ) from None
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        return _build(path, loader, root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = _loc(path, mark) if mark is not None else Location(path, 1, 1)
        raise ConfigError.at(where, f"YAML syntax error: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:
        raise ConfigError.at(
            _reader_location(path, text, exc), f"YAML error: {exc.reason}"
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError.at(Location(path, 1, 1), f"YAML error: {exc}") from None
    except RecursionError:
        raise ConfigError.at(Location(path, 1, 1), "YAML error: nested too deeply") from None
    finally:
        loader.dispose()


def _reader_location(path: str, text: str, exc: yaml.reader.ReaderError) -> Location:
    """Line and column of a character PyYAML's reader refused (it gives an offset)."""
    before = text[: max(0, exc.position)]
    line = before.count("\n") + 1
    return Location(path, line, len(before) - (before.rfind("\n") + 1) + 1)


def _too_large() -> str:
    return f"file too large (more than {MAX_BYTES // (1024 * 1024)} MiB)"


def read_file(path: str, limit: int = MAX_BYTES, *, allow_pipe: bool = False) -> bytes:
    """The bytes of a config, rule or scenario file: a regular file (links are followed; a
    FIFO or device is refused without blocking), at most ``limit`` bytes.

    ``allow_pipe`` also accepts a pipe, read as it comes: the main config file is named by
    whoever runs the command, who may hand it over as ``-c <(generate-config)``. Files
    found through the config (rule files, the web config) never are pipes."""
    try:
        fd = _open_pipe(path) if allow_pipe else open_regular(path, follow_links=True)
    except OSError as exc:
        raise ConfigError.at(Location(path, 1, 1), f"cannot read file: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise ConfigError.at(Location(path, 1, 1), f"cannot read file: {exc.strerror}") from None
    if len(data) > limit:
        raise ConfigError.at(Location(path, 1, 1), _too_large())
    return data


def _open_pipe(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return fd
    os.close(fd)
    return open_regular(path, follow_links=True)  # refuses it, saying what it is


def is_private(path: str) -> bool:
    """True if ``path`` is reached through a symbolic link and its target is not readable
    by all (mode without o+r), or if that cannot be told.

    Errors about such a file name its lines but never quote its text: a rule file linked
    to /etc/shadow by whoever can write the rules directory must not have root's
    ``check-config`` (or the journal) print the password hashes. A file named directly
    (not through a link) is the administrator's own choice and is quoted as usual."""
    try:
        linked = os.path.realpath(path) != os.path.abspath(path)
        return linked and not os.stat(path).st_mode & stat.S_IROTH
    except (OSError, ValueError):
        return True


PRIVATE_TEXT = (
    "not valid here (its text is not shown: the file is reached through a symbolic link "
    "and is not readable by all)"
)


def hide_private_text(problems: list[tuple[Location, str]], path: str) -> None:
    """Replace, in place, the messages of ``problems`` located in ``path`` by
    ``PRIVATE_TEXT`` when ``path`` is private (see ``is_private``)."""
    if not any(loc.path == path for loc, _ in problems) or not is_private(path):
        return
    hidden = [(loc, PRIVATE_TEXT if loc.path == path else msg) for loc, msg in problems]
    problems[:] = list(dict.fromkeys(hidden))


def load_file(path: str, *, allow_pipe: bool = False) -> Node | None:
    """Read and parse a YAML file (at most ``MAX_BYTES``; see ``parse`` for the limits)."""
    data = read_file(path, allow_pipe=allow_pipe)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError.at(Location(path, 1, 1), f"not UTF-8 text: {exc.reason}") from None
    try:
        return parse(text, path)
    except ConfigError as exc:
        hide_private_text(exc.problems, path)
        raise ConfigError(exc.problems) from None


MAX_NUMBER = 2**53
"""Largest magnitude of a number setting that names no range of its own."""


def type_name(value: Any) -> str:
    """How an error message names a YAML value's type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


@dataclass
class Reader:
    """Collects problems while typed values are read out of nodes."""

    problems: list[tuple[Location, str]] = field(default_factory=list)

    def error(self, loc: Location, message: str) -> None:
        self.problems.append((loc, message))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)

    def fail(self, loc: Location, message: str) -> NoReturn:
        self.error(loc, message)
        raise ConfigError(self.problems)

    # -- structure -------------------------------------------------------------------
    def mapping(
        self, node: Node, allowed: set[str] | list[str], what: str, required: tuple[str, ...] = ()
    ) -> dict[str, Node] | None:
        """The keys of a mapping node; unknown keys are reported with a did-you-mean."""
        if not node.is_mapping():
            self.error(node.loc, f"{what}: expected a mapping, got {type_name(node.value)}")
            return None
        out: dict[str, Node] = {}
        allowed_set = set(allowed)
        for key_node, value_node in node.items():
            key = key_node.value
            if key not in allowed_set:
                hint = difflib.get_close_matches(key, sorted(allowed_set), n=1, cutoff=0.6)
                suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
                self.error(key_node.loc, f"{what}: unknown key {key!r}{suggestion}")
                continue
            out[key] = value_node
        for key in required:
            if key not in out and key in allowed_set and node.get(key) is None:
                self.error(node.loc, f"{what}: missing required key {key!r}")
        return out

    def sequence(self, node: Node, what: str) -> list[Node] | None:
        if not node.is_sequence():
            self.error(node.loc, f"{what}: expected a list, got {type_name(node.value)}")
            return None
        items: list[Node] = node.value
        return items

    # -- scalars ---------------------------------------------------------------------
    def string(self, node: Node, what: str, choices: tuple[str, ...] | None = None) -> str | None:
        if not isinstance(node.value, str):
            self.error(node.loc, f"{what}: expected a string, got {type_name(node.value)}")
            return None
        if choices is not None and node.value not in choices:
            hint = difflib.get_close_matches(node.value, choices, n=1, cutoff=0.6)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            self.error(
                node.loc,
                f"{what}: {node.value!r} is not one of {', '.join(choices)}{suggestion}",
            )
            return None
        return node.value

    def boolean(self, node: Node, what: str) -> bool | None:
        if not isinstance(node.value, bool):
            self.error(node.loc, f"{what}: expected true or false, got {type_name(node.value)}")
            return None
        return node.value

    def number(
        self,
        node: Node,
        what: str,
        minimum: float | None = None,
        maximum: float | None = None,
        integer: bool = False,
    ) -> float | None:
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            kind = "an integer" if integer else "a number"
            self.error(node.loc, f"{what}: expected {kind}, got {type_name(value)}")
            return None
        if integer and not isinstance(value, int):
            self.error(node.loc, f"{what}: expected an integer, got {value!r}")
            return None
        if not math.isfinite(float(value)):
            self.error(node.loc, f"{what}: must be a finite number")
            return None
        if minimum is not None and value < minimum:
            self.error(node.loc, f"{what}: must be >= {minimum:g}, got {value!r}")
            return None
        if maximum is not None and value > maximum:
            self.error(node.loc, f"{what}: must be <= {maximum:g}, got {value!r}")
            return None
        if abs(value) > MAX_NUMBER:
            self.error(node.loc, f"{what}: must be between -2^53 and 2^53, got {value!r}")
            return None
        return float(value)

    def integer(
        self, node: Node, what: str, minimum: int | None = None, maximum: int | None = None
    ) -> int | None:
        value = self.number(node, what, minimum, maximum, integer=True)
        return None if value is None else int(value)

    def duration(
        self,
        node: Node,
        what: str,
        minimum: float = 0.0,
        allow_zero: bool = True,
        maximum: float = MAX_DURATION,
    ) -> float | None:
        """A duration string (``30s``, ``5m``, ``1h30m``) or a plain number of seconds.

        At most ``maximum`` (ten years unless the setting says less): a longer one
        overflows the timers that wait for it."""
        value = node.value
        seconds: float | None
        if isinstance(value, bool):
            seconds = None
        elif isinstance(value, int | float):
            seconds = float(value)
        elif isinstance(value, str):
            seconds = parse_duration(value)
        else:
            seconds = None
        if seconds is None:
            self.error(
                node.loc,
                f"{what}: {value!r} is not a duration (use a number and a unit with no space: "
                "250ms, 30s, 5m, 2h, 1d, 1w; combined like 1h30m)",
            )
            return None
        if seconds < minimum or (not allow_zero and seconds == 0):
            self.error(node.loc, f"{what}: must be more than {minimum:g}s, got {value!r}")
            return None
        if math.isfinite(seconds) and seconds > maximum:
            self.error(
                node.loc,
                f"{what}: must be at most {maximum:g}s"
                f"{' (ten years)' if maximum == MAX_DURATION else ''}, got {value!r}",
            )
            return None
        return seconds

    def listen_address(self, node: Node, what: str) -> tuple[str, int] | None:
        """``HOST:PORT`` with an IP literal or ``localhost`` (``[::1]:9835`` for IPv6)."""
        value = node.value
        if not isinstance(value, str):
            self.error(node.loc, f"{what}: expected 'HOST:PORT', got {type_name(value)}")
            return None
        host, sep, port_text = value.rpartition(":")
        if not sep or not port_text.isdigit() or not host:
            self.error(node.loc, f"{what}: {value!r} is not an address of the form HOST:PORT")
            return None
        port = int(port_text)
        if not 0 <= port <= 65535:
            self.error(node.loc, f"{what}: port {port} is out of range 0-65535")
            return None
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if bare != "localhost":
            try:
                ipaddress.ip_address(bare)
            except ValueError:
                self.error(node.loc, f"{what}: {host!r} is not an IP address (or 'localhost')")
                return None
        return bare, port
