"""Annotation templates: ``"GPU {gpu} ({pci_bus_id}) at {value:.0f} C"``.

Placeholders are plain names in braces, optionally with a Python format spec; ``{{`` and
``}}`` are literal braces. Everything is checked when the rule file loads: an unknown
name, attribute or index access (``{gpu.__class__}``, ``{x[0]}``), a conversion (``!r``)
or a spec that does not fit the placeholder's type is a load error, and so is a spec whose
width or precision is larger than ``MAX_WIDTH`` / ``MAX_PRECISION`` (``{gpu:>200000000}``
would allocate 200 MB on every rendering). Rendering at alert time cannot fail, cannot
reach anything but the values it is given, and returns at most ``MAX_RENDERED`` characters.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NUMERIC = frozenset(
    {
        "value",
        "threshold",
        "count",
        "ratio",
        "baseline_rate",
        "peers_median",
        "deviation",
        "limit",
        "expected",
        "seen",
        "pci_seen",
        "generation",
        "generation_max",
        "width",
        "width_max",
        "processes",
        "utilization",
    }
)

_FORMATTER = string.Formatter()

MAX_WIDTH = 64
"""Widest field a format spec may ask for (``{gpu:>64}``)."""
MAX_PRECISION = 12
"""Most digits after the point a format spec may ask for (``{value:.12f}``)."""
MAX_RENDERED = 4096
"""Longest rendered annotation; the rest is cut (the literal text is the rule author's)."""

# Python's format-spec mini-language, read only to bound width and precision: a spec of
# ``>200000000`` would make every rendering allocate 200 MB (and fail with MemoryError).
_SPEC_RE = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>[0-9]*)[_,]?(?:\.(?P<precision>[0-9]*))?"
    r"[bcdeEfFgGnosxX%]?",
    re.ASCII | re.S,
)


def _spec_problem(spec: str) -> str | None:
    """Why ``spec`` is refused beyond what ``format`` itself checks, or None."""
    rest = spec[1:] if spec[1:2] in ("<", ">", "=", "^") else spec  # the fill may be any
    if not rest.isascii():
        return "only the fill character may be non-ASCII (Python reads any digit as a width)"
    m = _SPEC_RE.fullmatch(spec)
    if m is None:
        return None  # format() reports it
    width, precision = m.group("width"), m.group("precision")
    if width and (len(width) > 3 or int(width) > MAX_WIDTH):
        return f"width {width} is more than {MAX_WIDTH}"
    if precision and (len(precision) > 3 or int(precision) > MAX_PRECISION):
        return f"precision {precision} is more than {MAX_PRECISION}"
    return None


def _plain(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.6g}"
    return str(value)


@dataclass(frozen=True)
class Template:
    text: str
    parts: tuple[tuple[str, str | None, str], ...]  # (literal, name, spec)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(name for _, name, _ in self.parts if name is not None)

    def render(self, values: Mapping[str, object]) -> str:
        out: list[str] = []
        for literal, name, spec in self.parts:
            out.append(literal)
            if name is None:
                continue
            value = values.get(name)
            if spec and value is not None:
                try:
                    out.append(format(value, spec))
                    continue
                except (ValueError, TypeError):
                    pass  # e.g. a numeric spec on a value that is missing here
            out.append(_plain(value))
        text = "".join(out)
        return text if len(text) <= MAX_RENDERED else text[: MAX_RENDERED - 1] + "\u2026"


def compile_template(text: str, allowed: Iterable[str]) -> Template | str:
    """The compiled template, or a message saying what is wrong with it."""
    allowed_set = set(allowed)
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as exc:
        return f"bad template: {exc} (write {{{{ and }}}} for literal braces)"
    parts: list[tuple[str, str | None, str]] = []
    for literal, name, spec, conversion in parsed:
        if name is None:
            parts.append((literal, None, ""))
            continue
        if conversion:
            return f"placeholder {{{name}!{conversion}}}: conversions are not allowed"
        if not name.isidentifier():
            what = "an empty placeholder {}" if not name else f"placeholder {{{name}}}"
            return (
                f"{what} is not allowed: use a name such as {{gpu}} "
                "(no positions, attributes or indexes)"
            )
        if name not in allowed_set:
            import difflib

            hint = difflib.get_close_matches(name, sorted(allowed_set), n=1, cutoff=0.6)
            suggestion = f" (did you mean {{{hint[0]}}}?)" if hint else ""
            return f"unknown placeholder {{{name}}}{suggestion}; this rule can use: " + ", ".join(
                f"{{{n}}}" for n in sorted(allowed_set)
            )
        spec = spec or ""
        if "{" in spec or "}" in spec:
            return f"placeholder {{{name}}}: nested placeholders in a format spec are not allowed"
        if spec:
            problem = _spec_problem(spec)
            if problem is not None:
                return f"placeholder {{{name}:{spec}}}: format spec refused: {problem}"
            sample: object = 1.5 if name in NUMERIC else "x"
            try:
                format(sample, spec)
            except (ValueError, TypeError) as exc:
                kind = "a number" if name in NUMERIC else "text"
                return f"placeholder {{{name}:{spec}}}: bad format spec for {kind}: {exc}"
        parts.append((literal, name, spec))
    return Template(text, tuple(parts))
