"""Durations and field values written as text with a unit, shared by config, scenarios and
rules (``1h30m``, ``250ms``; ``1980MHz``, ``72GiB``, ``97%``)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from types import MappingProxyType

from gpuwatchd.core.fields import FieldSpec

_UNITS = (("w", 604800.0), ("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0))


def format_duration(seconds: float) -> str:
    """The shortest duration text for ``seconds`` (``4d``, ``1h30m``, ``250ms``)."""
    if seconds <= 0:
        return "0s"
    ms = round(seconds * 1000)
    if ms % 1000:
        if ms < 1000:
            return f"{ms}ms"
        return f"{seconds:g}s"
    rest = ms // 1000
    out = []
    for unit, size in _UNITS:
        n, rest = divmod(rest, int(size))
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


_DURATION_RE = re.compile(r"([0-9]{1,32}(?:\.[0-9]{1,32})?)(ms|s|m|h|d|w)", re.ASCII)
_DURATION_UNITS = {**dict(_UNITS), "ms": 0.001}


def parse_duration(text: str) -> float | None:
    """Seconds for a Prometheus-style duration (``90s``, ``5m``, ``1h30m``, ``250ms``), or
    ``None``: the one reader of duration text (config, rules, scenarios, the command line)."""
    text = text.strip()
    if not text:
        return None
    pos = 0
    total = 0.0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    return total if pos == len(text) else None


MAX_DURATION = 10 * 366 * 86400.0
"""Longest duration accepted anywhere (ten years): longer waits overflow timers and dates."""


def duration_or_seconds(text: str) -> float | None:
    """A duration (``30m``) or a plain number of seconds (``1800``), as a command line or an
    annotation gives it: ``None`` unless it is finite, not negative and at most
    ``MAX_DURATION`` (``inf``, ``nan`` and ``1e400`` are numbers to ``float``)."""
    seconds = parse_duration(text)
    if seconds is None:
        try:
            seconds = float(text)
        except ValueError:
            return None
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_DURATION:
        return None
    return seconds


_NUMBER_RE = re.compile(r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%]*)\s*")
_UNIT_SCALES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        "_hertz": {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9},
        "_bytes": {
            "b": 1.0,
            "kb": 1e3,
            "mb": 1e6,
            "gb": 1e9,
            "kib": 1024.0,
            "mib": 1024.0**2,
            "gib": 1024.0**3,
            "tib": 1024.0**4,
        },
        "_watts": {"w": 1.0, "kw": 1e3},
        "_celsius": {"c": 1.0},
        "_ratio": {"%": 0.01},
        "_joules_total": {"j": 1.0, "kj": 1e3, "mj": 1e6},
        "_seconds_total": {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    }
)


def value_with_unit(text: str, spec: FieldSpec) -> float | str:
    """A number written as text, optionally with a unit (``1980MHz``, ``72GiB``, ``97%``,
    ``1.98e9``). Returns the value in base units, or a message saying what is wrong."""
    match = _NUMBER_RE.fullmatch(text)
    family = next((suffix for suffix in _UNIT_SCALES if spec.metric.endswith(suffix)), None)
    units = _UNIT_SCALES.get(family or "", {})
    if match is None:
        hint = f" (units: {', '.join(units)})" if units else ""
        return f"{text!r} is not a number{hint}"
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        return number
    if unit not in units:
        accepted = f"units for {spec.name}: {', '.join(units)}" if units else "no units"
        return f"unknown unit {match.group(2)!r} ({accepted}; or a plain number in base units)"
    return number * units[unit]
