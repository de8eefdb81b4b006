"""Refuse regular expressions that can backtrack for ever, before they are used.

Python's ``re`` backtracks, holds the GIL while it does, and cannot be interrupted: one
``match_re`` such as ``(a+)+$`` or ``(?:a?){25}a{25}`` run on an unlucky label value
freezes every thread of the daemon (no polls, no pages, ``/healthz`` hangs). Matching
time is bounded by the shape of the pattern, so the shape is checked at load:

- no variable quantifier (``*``, ``+``, ``?``, ``{m,n}``) inside a repeated group
  (``(a+)+``, ``(a?){25}``, ``(.*a){3}``): the source of exponential time;
- no alternation inside a repeated group (``(a|ab)*``); alternatives of single characters
  are a character class to ``re`` and are fine (``(a|b)*``);
- no backreferences (``(a)\\1``);
- at most ``MAX_VARIABLE_REPEATS`` variable quantifiers along any one path through the
  pattern (``.*a.*b.*c`` is cubic in the input's length; a fourth makes it quartic);
- at most ``MAX_PATTERN_CHARS`` characters.

Within these rules the worst case is cubic in the length of the label value matched;
alert label values are short (names, numbers, UUIDs).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

MAX_PATTERN_CHARS = 512
MAX_VARIABLE_REPEATS = 3

_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})
_BACKREFS = frozenset({"GROUPREF", "GROUPREF_EXISTS", "GROUPREF_IGNORE"})
_parser: Any = importlib.import_module("re._parser")


class _Unsafe(Exception):
    pass


def _count(items: Any, in_repeat: bool) -> int:
    """Variable quantifiers along the worst path through ``items``; raises ``_Unsafe``."""
    total = 0
    for op, av in items:
        name = str(op)
        if name in _REPEATS:
            low, high, sub = av
            variable = low != high
            if in_repeat and variable:
                raise _Unsafe("a quantifier inside a repeated group (as in (a+)+ or (a?){9})")
            total += int(variable) + _count(sub, in_repeat or high > 1)
        elif name == "BRANCH":
            if in_repeat:
                raise _Unsafe("an alternation inside a repeated group (as in (a|ab)*)")
            total += max((_count(branch, in_repeat) for branch in av[1]), default=0)
        elif name == "SUBPATTERN":
            total += _count(av[3], in_repeat)
        elif name in ("ASSERT", "ASSERT_NOT"):
            total += _count(av[1], in_repeat)
        elif name == "ATOMIC_GROUP":
            total += _count(av, in_repeat)
        elif name in _BACKREFS:
            raise _Unsafe("a backreference")
    return total


def regex_problem(pattern: str) -> str | None:
    """Why ``pattern`` is refused (bad syntax or a shape that can backtrack), or None."""
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"longer than {MAX_PATTERN_CHARS} characters"
    try:
        re.compile(pattern)
        tree = _parser.parse(pattern)
    except re.error as exc:
        return f"bad regex: {exc}"
    except RecursionError:
        return "nested too deeply"
    try:
        repeats = _count(tree, False)
    except _Unsafe as exc:
        return f"can take exponential time ({exc})"
    except RecursionError:
        return "nested too deeply"
    if repeats > MAX_VARIABLE_REPEATS:
        return (
            f"has {repeats} quantifiers in a row (at most {MAX_VARIABLE_REPEATS}): "
            "matching time would grow as the input's length to that power"
        )
    return None
