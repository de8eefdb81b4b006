"""The OpenMetrics exposition, through prometheus_client: the same families as the text
format, in a private registry (no global state). Imported only when a scrape asks for
OpenMetrics, so that a daemon scraped in the text format never loads prometheus_client."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from gpuwatchd.core.families import to_client_metric
from gpuwatchd.exposition.metrics import MetricsRenderer

__all__ = ["CONTENT_TYPE_LATEST", "NodeCollector", "client_registry", "render"]


class NodeCollector(Collector):
    """The same families through prometheus_client (a private registry, no global state)."""

    def __init__(self, renderer: MetricsRenderer) -> None:
        self._renderer = renderer

    def describe(self) -> list[Metric]:
        return []  # registration never triggers a collection

    def collect(self) -> Iterator[Metric]:
        fams = self._renderer.families()
        self._renderer.process.add(fams)
        for fam in fams:
            yield to_client_metric(fam)


def client_registry(renderer: MetricsRenderer) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(renderer))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)  # type: ignore[no-untyped-call,no-any-return]
