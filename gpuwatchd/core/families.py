"""Metric families and their two expositions: the Prometheus text format 0.0.4 and
OpenMetrics 1.0 (what Prometheus asks for first).

gpuwatchd builds and renders its families itself rather than through prometheus_client's
generic objects because a scrape of 8 GPUs x 18 NVLink links has to stay within a couple
of milliseconds in either format: label sets are escaped once per GPU and reused, and the
two formats differ only in a few lines per family (the OpenMetrics family name of a
counter drops ``_total``, ``untyped`` is ``unknown``, HELP escapes quotes, ``# EOF`` ends
the body). ``to_client_metric`` turns a family into a prometheus_client ``Metric`` (tests
and the bench compare the two paths).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # prometheus_client is loaded only by a scrape that asks for OpenMetrics
    from prometheus_client.core import Metric

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OPENMETRICS_EOF = b"# EOF\n"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def label_text(names: Sequence[str], values: Sequence[str]) -> str:
    """``a="1",b="2"`` (the inside of the braces)."""
    return ",".join(f'{n}="{escape_label_value(v)}"' for n, v in zip(names, values, strict=True))


def format_value(value: float) -> str:
    if value != value:  # NaN
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value)}.0"
    return repr(float(value))


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


class Family:
    """One metric family: name, type, help, label names and samples."""

    __slots__ = ("help", "kind", "label_names", "name", "samples")

    def __init__(self, name: str, kind: str, help: str, label_names: Sequence[str]) -> None:
        if kind == "counter" and not name.endswith("_total"):
            raise ValueError(f"counter {name} must end in _total")
        self.name = name
        self.kind = kind
        self.help = help
        self.label_names = tuple(label_names)
        self.samples: list[tuple[str, float]] = []

    def add(self, values: Sequence[str], value: float) -> None:
        self.samples.append((label_text(self.label_names, values), value))

    def add_text(self, labels: str, value: float) -> None:
        """Add a sample whose label text is already escaped (hot path)."""
        self.samples.append((labels, value))

    def render(self, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {_escape_help(self.help)}\n")
        out.append(f"# TYPE {self.name} {self.kind}\n")
        name = self.name
        for labels, value in self.samples:
            if labels:
                out.append(f"{name}{{{labels}}} {format_value(value)}\n")
            else:
                out.append(f"{name} {format_value(value)}\n")

    def _openmetrics_head(self, out: list[str]) -> None:
        """The family's HELP and TYPE lines in OpenMetrics (a counter's family name has
        no ``_total``; the samples keep it)."""
        kind = self.kind
        name = self.name
        if kind == "counter":
            name = name[: -len("_total")]
        elif kind == "untyped":
            kind = "unknown"
        text = _escape_help(self.help).replace('"', '\\"')
        out.append(f"# HELP {name} {text}\n# TYPE {name} {kind}\n")

    def render_openmetrics(self, out: list[str]) -> None:
        """The family in OpenMetrics 1.0 (without the closing ``# EOF``)."""
        self._openmetrics_head(out)
        name = self.name
        for labels, value in self.samples:
            if labels:
                out.append(f"{name}{{{labels}}} {format_value(value)}\n")
            else:
                out.append(f"{name} {format_value(value)}\n")


class HistogramFamily(Family):
    """A histogram: per label set, cumulative bucket counts, a sum and a count."""

    __slots__ = ("buckets", "histograms")

    def __init__(
        self, name: str, help: str, label_names: Sequence[str], buckets: Sequence[float]
    ) -> None:
        super().__init__(name, "histogram", help, label_names)
        self.buckets = tuple(buckets)
        self.histograms: list[tuple[str, Sequence[int], float, int]] = []

    def add_histogram(
        self, values: Sequence[str], counts: Sequence[int], total: float, count: int
    ) -> None:
        """``counts[i]`` observations <= ``buckets[i]`` (cumulative); ``count`` is +Inf."""
        self.histograms.append((label_text(self.label_names, values), counts, total, count))

    def render(self, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {_escape_help(self.help)}\n")
        out.append(f"# TYPE {self.name} histogram\n")
        for labels, counts, total, count in self.histograms:
            sep = "," if labels else ""
            for le, n in zip(self.buckets, counts, strict=True):
                le_text = format_value(le)
                out.append(f'{self.name}_bucket{{{labels}{sep}le="{le_text}"}} {format_value(n)}\n')
            out.append(f'{self.name}_bucket{{{labels}{sep}le="+Inf"}} {format_value(count)}\n')
            brace = f"{{{labels}}}" if labels else ""
            out.append(f"{self.name}_sum{brace} {format_value(total)}\n")
            out.append(f"{self.name}_count{brace} {format_value(count)}\n")

    def render_openmetrics(self, out: list[str]) -> None:
        # the samples are written as in the text format; only the head differs
        head: list[str] = []
        self.render(head)
        self._openmetrics_head(out)
        out.extend(head[2:])


class Families:
    """Families by name, in first-seen order."""

    def __init__(self) -> None:
        self._by_name: dict[str, Family] = {}

    def get(self, name: str, kind: str, help: str, label_names: Iterable[str]) -> Family:
        fam = self._by_name.get(name)
        if fam is None:
            fam = Family(name, kind, help, tuple(label_names))
            self._by_name[name] = fam
        return fam

    def histogram(
        self, name: str, help: str, label_names: Iterable[str], buckets: Sequence[float]
    ) -> HistogramFamily:
        fam = self._by_name.get(name)
        if fam is None:
            fam = HistogramFamily(name, help, tuple(label_names), buckets)
            self._by_name[name] = fam
        assert isinstance(fam, HistogramFamily)
        return fam

    def __iter__(self) -> Iterator[Family]:
        return iter(self._by_name.values())

    def render(self) -> bytes:
        out: list[str] = []
        for fam in self._by_name.values():
            fam.render(out)
        return "".join(out).encode("utf-8")

    def render_openmetrics(self) -> bytes:
        """The families in OpenMetrics 1.0, without the closing ``# EOF`` (the caller
        appends more families, then ``OPENMETRICS_EOF``)."""
        out: list[str] = []
        for fam in self._by_name.values():
            fam.render_openmetrics(out)
        return "".join(out).encode("utf-8")


def _parse_labels(text: str) -> dict[str, str]:
    """Inverse of ``label_text`` for the values we write (used off the hot path only)."""
    labels: dict[str, str] = {}
    i = 0
    while i < len(text):
        eq = text.index("=", i)
        name = text[i:eq]
        j = eq + 2
        chars: list[str] = []
        while text[j] != '"':
            if text[j] == "\\":
                nxt = text[j + 1]
                chars.append("\n" if nxt == "n" else nxt)
                j += 2
            else:
                chars.append(text[j])
                j += 1
        labels[name] = "".join(chars)
        i = j + 2  # skip closing quote and comma
    return labels


def to_client_metric(fam: Family) -> Metric:
    """The family as a prometheus_client metric (for the registry/OpenMetrics path)."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        UnknownMetricFamily,
    )

    metric: Metric
    if isinstance(fam, HistogramFamily):
        hist = HistogramMetricFamily(fam.name, fam.help, labels=fam.label_names)
        for labels, counts, total, count in fam.histograms:
            parsed = _parse_labels(labels)
            buckets = [
                (format_value(le), float(n)) for le, n in zip(fam.buckets, counts, strict=True)
            ]
            buckets.append(("+Inf", float(count)))
            hist.add_metric([parsed[n] for n in fam.label_names], buckets, total)
        return hist
    if fam.kind == "counter":
        metric = CounterMetricFamily(fam.name, fam.help, labels=fam.label_names)
    elif fam.kind == "gauge":
        metric = GaugeMetricFamily(fam.name, fam.help, labels=fam.label_names)
    else:
        metric = UnknownMetricFamily(fam.name, fam.help, labels=fam.label_names)
    for labels, value in fam.samples:
        parsed = _parse_labels(labels)
        metric.add_metric([parsed[n] for n in fam.label_names], value)
    return metric
