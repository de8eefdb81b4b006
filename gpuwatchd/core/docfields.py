"""One JSON converter for frozen dataclasses, driven by their fields.

``read(cls, data)`` builds ``cls`` from a JSON mapping and ``write(obj)`` gives it back;
each field's type annotation says how its value is read (a nested dataclass, a tuple or
mapping of them, ``X | None``, ``str``, ``int``, ``float | None``, ``bool``, a mapping of
strings, ``Any`` as is), and the JSON keys come out in field order. A lenient reader: a
value of the wrong kind becomes the field's "missing" value rather than an error, since
the document comes from a daemon of maybe another version.

What a field's type does not say goes in its metadata (``spec``): the value when the key
is missing, that ``None`` is left out rather than written as ``null``, a field whose
value is spread into its parent's keys (``flat``), or a field read and written by hooks.
A field named ``more`` keeps the keys no other field owns, unchanged, at its place.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
MORE = "more"

Reader = Callable[[Mapping[str, Any]], Any]
Writer = Callable[[Any], Mapping[str, Any]]


def spec(
    *,
    missing: Any = None,
    omit_none: bool = False,
    flat: bool = False,
    keys: tuple[str, ...] = (),
    reader: Reader | None = None,
    writer: Writer | None = None,
) -> dict[str, Any]:
    """A field's metadata: ``missing``, the value of an absent key (for ``str``: ""
    unless given); ``omit_none``, leave the key out while the value is ``None``; ``flat``,
    a dataclass whose keys sit in the parent's; ``reader``/``writer``, hooks given the
    whole mapping / the value (the writer returns the keys to put at its place), owning
    ``keys``."""
    return {
        "doc": {
            "missing": missing,
            "omit_none": omit_none,
            "flat": flat,
            "keys": keys,
            "reader": reader,
            "writer": writer,
        }
    }


_PLAIN = spec()["doc"]


def _opts(f: dataclasses.Field[Any]) -> dict[str, Any]:
    return f.metadata.get("doc", _PLAIN)  # type: ignore[no-any-return]


_Plan = tuple[tuple[dataclasses.Field[Any], Any, frozenset[str]], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """Each field, its resolved type and the JSON keys it owns (worked out once a class)."""
    known = _PLANS.get(cls)
    if known is not None:
        return known
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name.startswith("_"):
            continue
        opts = _opts(f)
        hint = hints[f.name]
        if opts["keys"]:
            owned = frozenset(opts["keys"])
        elif opts["flat"]:
            owned = _owned(hint)
        elif f.name == MORE:
            owned = frozenset()
        else:
            owned = frozenset({f.name})
        out.append((f, hint, owned))
    _PLANS[cls] = plan = tuple(out)
    return plan


def _owned(cls: type) -> frozenset[str]:
    return frozenset().union(*(owned for _, _, owned in _plan(cls)))


def _optional(hint: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (hint, False)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _value(hint: Any, value: Any, missing: Any) -> Any:
    """``value`` read as ``hint``."""
    inner, optional = _optional(hint)
    if optional and value is None:
        return None
    origin = typing.get_origin(inner)
    if inner is Any:
        return value
    if dataclasses.is_dataclass(inner):
        return _read_any(inner, value) if isinstance(value, Mapping) else None
    if inner is str:
        return str(value)
    if inner is bool:
        return bool(value)
    if inner is int:
        if optional:
            return value if isinstance(value, int) else None
        return int(value or 0)
    if inner is float:
        return float(value) if _is_number(value) else None
    if origin is tuple:
        (item, _) = typing.get_args(inner)
        if optional and not isinstance(value, list | tuple):
            return None
        if dataclasses.is_dataclass(item):
            return tuple(_read_any(item, v) for v in value or () if isinstance(v, Mapping))
        if item is str:
            return tuple(str(v) for v in value or ())
        return tuple(value or ())
    if origin in (Mapping, dict):
        if optional:
            return value if isinstance(value, Mapping) else None
        (_, item) = typing.get_args(inner)
        if item is str:
            return {str(k): str(v) for k, v in (value or {}).items()}
        if dataclasses.is_dataclass(item):
            return {
                str(k): _read_any(item, v)
                for k, v in (value or {}).items()
                if isinstance(v, Mapping)
            }
        return dict(value or {})
    raise TypeError(f"docfields: no reader for {hint!r}")


def _read_any(cls: Any, data: Mapping[str, Any]) -> Any:
    """A nested dataclass: through its own ``from_json`` where it has one (``Doc``)."""
    own = getattr(cls, "from_json", None)
    return own(data) if own is not None else read(cls, data)


def read(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls`` from its JSON mapping ``data``."""
    plan = _plan(cls)
    values: dict[str, Any] = {}
    for f, hint, _ in plan:
        opts = _opts(f)
        if opts["reader"] is not None:
            values[f.name] = opts["reader"](data)
        elif opts["flat"]:
            values[f.name] = _read_any(hint, data)
        elif f.name == MORE:
            owned = _owned(cls)
            values[f.name] = {k: v for k, v in data.items() if k not in owned}
        else:
            missing = opts["missing"]
            inner, _ = _optional(hint)
            if missing is None and inner is str and hint is str:
                missing = ""
            values[f.name] = _value(hint, data.get(f.name, missing), missing)
    return cls(**values)


def _plain(value: Any) -> Any:
    """A value as JSON: dataclasses written, tuples as lists, mappings as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _write_any(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _write_any(obj: Any) -> dict[str, Any]:
    own = getattr(obj, "as_json", None)
    return own() if own is not None else write(obj)


def write(obj: Any) -> dict[str, Any]:
    """The JSON mapping of the dataclass ``obj``, in field order."""
    out: dict[str, Any] = {}
    for f, _, _ in _plan(type(obj)):
        opts = _opts(f)
        value = getattr(obj, f.name)
        if opts["writer"] is not None:
            out.update(opts["writer"](value))
        elif f.name == MORE:
            out.update(value)
        elif value is None and opts["omit_none"]:
            continue
        elif opts["flat"]:
            out.update(_write_any(value))
        else:
            out[f.name] = _plain(value)
    return out


class Doc:
    """A dataclass read from and written to JSON by its fields (``read``, ``write``); a
    subclass overrides ``from_json``/``as_json`` only where its fields do not say it all."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> typing.Self:
        return read(cls, data)

    def as_json(self) -> dict[str, Any]:
        return write(self)
