"""Helpers every condition kind uses to read its YAML body, with located errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.fields import GPU_FIELDS, LINK_FIELDS, FieldSpec
from gpuwatchd.core.units import value_with_unit
from gpuwatchd.rules.model import OPS, Op
from gpuwatchd.xid import catalog as xid_catalog

MAX_WINDOW = 30 * 86400.0  # the counter history kept


def hint(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a choice is close to ``word``, else empty."""
    found = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean {found[0]!r}?)" if found else ""


class BodyReader:
    """Reads typed values from rule YAML, reporting every problem into one ``Reader``."""

    def __init__(
        self,
        r: Reader,
        catalog: xid_catalog.Catalog,
        gpu_fields: Mapping[str, FieldSpec] = GPU_FIELDS,
    ) -> None:
        self.r = r
        self.catalog = catalog
        # The built-in fields plus the config's extra NVML fields (``fields:``).
        self.gpu_fields = gpu_fields

    def error(self, node: Node, message: str) -> None:
        self.r.error(node.loc, message)

    def need(self, body: Node, keys: dict[str, Node], names: tuple[str, ...], what: str) -> bool:
        """True when every key in ``names`` is present; an error for each missing one."""
        missing = [n for n in names if n not in keys]
        for n in missing:
            self.r.error(body.loc, f"{what}: missing required key {n!r}")
        return not missing

    def duration(
        self, node: Node, what: str, *, positive: bool = False, maximum: float | None = None
    ) -> float | None:
        seconds = self.r.duration(node, what, allow_zero=not positive)
        if seconds is None:
            return None
        if maximum is not None and seconds > maximum:
            self.r.error(node.loc, f"{what}: at most 30d, got {node.value!r}")
            return None
        return seconds

    def window(self, node: Node, what: str) -> float | None:
        """A positive duration of at most the history kept (30 days)."""
        return self.duration(node, what, positive=True, maximum=MAX_WINDOW)

    def field(
        self, node: Node, what: str, *, counter: bool = False, allow_link: bool = True
    ) -> tuple[str, FieldSpec, bool] | None:
        """``(name, spec, per_link)`` of a known field name."""
        name = self.r.string(node, what)
        if name is None:
            return None
        if name in self.gpu_fields:
            spec, link = self.gpu_fields[name], False
        elif name in LINK_FIELDS and allow_link:
            spec, link = LINK_FIELDS[name], True
        else:
            choices = list(self.gpu_fields) + (list(LINK_FIELDS) if allow_link else [])
            extra = "" if allow_link or name not in LINK_FIELDS else " (a per-link field)"
            close = hint(name, choices)
            if not close and not extra:
                close = " (another NVML field id needs an entry in the config's `fields` section)"
            self.r.error(node.loc, f"{what}: unknown field {name!r}{extra}{close}")
            return None
        if counter and spec.kind != "counter" and not spec.integer:
            self.r.error(
                node.loc,
                f"{what}: {name!r} is a gauge; this condition needs a counter "
                "(compare gauges with 'threshold')",
            )
            return None
        return name, spec, link

    def op(self, node: Node | None, what: str, default: Op) -> Op | None:
        if node is None:
            return default
        value = self.r.string(node, what, OPS)
        return None if value is None else value  # type: ignore[return-value]

    def value(self, node: Node, what: str, spec: FieldSpec | None) -> float | None:
        """A number, or (for a field) a number with a unit like ``1980MHz`` or ``97%``."""
        raw = node.value
        if isinstance(raw, str) and spec is not None:
            parsed = value_with_unit(raw, spec)
            if isinstance(parsed, str):
                self.r.error(node.loc, f"{what}: {parsed}")
                return None
            return parsed
        return self.r.number(node, what)

    def strings(self, node: Node, what: str) -> list[tuple[str, Node]]:
        items = self.r.sequence(node, what)
        out: list[tuple[str, Node]] = []
        for item in items or []:
            text = self.r.string(item, what)
            if text is not None:
                out.append((text, item))
        return out

    def boolean(self, keys: dict[str, Node], name: str, what: str, default: bool) -> bool:
        if name not in keys:
            return default
        return bool(self.r.boolean(keys[name], f"{what}.{name}"))
