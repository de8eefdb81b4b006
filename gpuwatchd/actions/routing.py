"""Which receivers get an alert, and how it is grouped there.

A transition that names receivers (its rule's ``routes``) goes to exactly those. Otherwise
every route in ``routing.routes`` whose ``match`` (equality) and ``match_re`` (full-match
regex) all hold sends it to that route's receivers; when no route matches, the default
route applies: ``routing.receivers`` (``null``: every receiver) for alerts at least as
severe as ``routing.min_severity``. Matching sees the alert's labels plus ``rule`` (also
``alertname``) and ``severity``.

A ticket or info alert is repeated at most once a day (``routing.ticket_repeat_interval``,
or the route's ``repeat_interval`` if longer): a ticket nobody has closed yet needs no reminder
every four hours. Pages keep the route's ``repeat_interval``. A group repeats as often as
its most urgent firing alert asks (``Outbox``). A receiver's own resend interval
(Alertmanager's, which keeps the alert alive there) is left as it is.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuwatchd.actions.model import SEVERITY_RANK, match_labels
from gpuwatchd.actions.receivers import Receiver
from gpuwatchd.config.actions import RouteConfig, RoutingConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Destination:
    receiver: str
    group_by: tuple[str, ...]
    group_wait: float
    repeat_interval: float


class Router:
    def __init__(self, routing: RoutingConfig, receivers: Mapping[str, Receiver]) -> None:
        self.routing = routing
        self.receivers = receivers
        self._compiled = [
            (route, {k: re.compile(v) for k, v in route.match_re.items()})
            for route in routing.routes
        ]
        self._warned: set[str] = set()

    def _dest(self, name: str, route: RouteConfig | None, severity: str) -> Destination:
        r = self.routing
        rcv = self.receivers[name]
        group_by = route.group_by if route and route.group_by is not None else r.group_by
        wait = route.group_wait if route and route.group_wait is not None else r.group_wait
        repeat = (
            route.repeat_interval
            if route and route.repeat_interval is not None
            else r.repeat_interval
        )
        if rcv.group_wait_override is not None:
            wait = rcv.group_wait_override
        if rcv.repeat_override is not None:
            repeat = rcv.repeat_override
        elif severity != "page":
            repeat = max(repeat, r.ticket_repeat_interval)
        return Destination(name, group_by, wait, repeat)

    @staticmethod
    def _matches(
        route: RouteConfig, regexes: Mapping[str, re.Pattern[str]], labels: Mapping[str, str]
    ) -> bool:
        if any(labels.get(k, "") != v for k, v in route.match.items()):
            return False
        return all(rx.fullmatch(labels.get(k, "")) for k, rx in regexes.items())

    def route(self, rec: Mapping[str, Any]) -> list[Destination]:
        severity = str(rec["severity"])
        names = [str(n) for n in rec.get("routes") or ()]
        if names:
            out = []
            for n in names:
                if n in self.receivers:
                    out.append(self._dest(n, None, severity))
                elif n not in self._warned:
                    self._warned.add(n)
                    log.warning(
                        "rule %s routes to receiver %r, which is not configured", rec["rule"], n
                    )
            return out
        labels = match_labels(rec)
        seen: dict[str, Destination] = {}
        for route, regexes in self._compiled:
            if self._matches(route, regexes, labels):
                for n in route.receivers:
                    if n not in seen:
                        seen[n] = self._dest(n, route, severity)
        if seen:
            return list(seen.values())
        if SEVERITY_RANK.get(str(rec["severity"]), 0) < SEVERITY_RANK[self.routing.min_severity]:
            return []
        default = self.routing.receivers
        chosen = list(self.receivers) if default is None else list(default)
        return [self._dest(n, None, severity) for n in chosen if n in self.receivers]
