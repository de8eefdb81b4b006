"""The whole configuration: one YAML file, every setting with a built-in default.

``load_config`` reads the file through ``config.yamlsrc`` so that every mistake is
reported as ``PATH:LINE:COL: message``, all of them at once, in one ``ConfigError``. The
result is a tree of frozen dataclasses; durations are float seconds.

This module sits above every stage: it asks each owner for its section reader (the
daemon-wide sections in ``config.sections``, the receivers' registry for each receiver
kind's reader, ``config.actions`` for routing and drain with the drain drivers' registry
for each driver's section reader, ``config.rules``) and lists them
in ``_ENTRIES``. No stage imports it: the composition root cuts a stage's own sections out
of a ``Config`` (``configfile.stages``). Adding a section: a frozen dataclass and a reader
``(Reader, Node | None, ReadContext)`` beside its owner, an entry in ``_ENTRIES`` and the
matching field on ``Config``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from gpuwatchd.config import yamlsrc
from gpuwatchd.config.actions import (
    DrainConfig,
    DriverSectionReader,
    RoutingConfig,
    read_drain,
    read_routing,
)
from gpuwatchd.config.fields import read_fields
from gpuwatchd.config.receivers import ReceiverConfig, read_receivers
from gpuwatchd.config.rules import RulesConfig, read_rules
from gpuwatchd.config.sections import (
    CALL_TIMEOUT_FACTOR,
    DEFAULT_CONFIG_PATH,
    DEFAULT_PORT,
    DEFAULT_STATE_DIR,
    LOG_FORMATS,
    LOG_LEVELS,
    SECRET_PLACEHOLDER,
    BackendSpec,
    GpusConfig,
    KindSectionReader,
    ListenAddress,
    MetricsConfig,
    PollConfig,
    ReadContext,
    SourcesConfig,
    WebSection,
    XidConfig,
    as_plain,
    default_node_name,
    default_state_dir,
    normalize_gpu_id,
    read_backend,
    read_gpus,
    read_listen,
    read_log_format,
    read_log_level,
    read_metrics,
    read_node_name,
    read_poll,
    read_sources,
    read_state_dir,
    read_web,
    read_xid,
)
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.fields import ExtraField

T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    node_name: str
    listen: ListenAddress
    backend: BackendSpec
    state_dir: str
    log_level: str
    poll: PollConfig
    gpus: GpusConfig
    metrics: MetricsConfig
    sources: SourcesConfig = field(default_factory=SourcesConfig)
    receivers: tuple[ReceiverConfig, ...] = ()
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    rules: RulesConfig = field(default_factory=RulesConfig)
    xid: XidConfig = field(default_factory=XidConfig)
    web: WebSection = field(default_factory=WebSection)
    fields: tuple[ExtraField, ...] = ()  # extra NVML field ids (config/fields.py)
    log_format: str = "auto"  # auto (journal, tty or plain) or json
    source: str | None = field(default=None, compare=False, metadata={"internal": True})
    """The file it was loaded from (``None``: built-in defaults only)."""

    def as_dict(self) -> dict[str, Any]:
        """Plain values in the config file's shape (secrets replaced), for printing.

        Dumped as YAML, the result is itself a valid config that loads to an equal
        ``Config``.
        """
        out = as_plain(self)
        assert isinstance(out, dict)
        # every drain driver's section, at its defaults where the file has none
        drain = out["drain"]
        sections = {mode: drain.pop(mode, None) for mode in self.drain.drivers}
        for mode, reader in _driver_readers().items():
            drain[mode] = sections.get(mode) or as_plain(reader.section())
        # every kernel-log kind's own keys, at their defaults where the file has none, in
        # the place of ``kinds``
        sources = out["sources"]
        own: dict[str, Any] = {}
        for kind, kind_reader in _kind_readers().items():
            own.update(as_plain(self.sources.section(kind, kind_reader.section)))
        rest = {k: v for k, v in sources.items() if k not in own}
        out["sources"] = {"kernel_log": rest.pop("kernel_log"), **own, **rest}
        return out


# -- the table of top-level keys -----------------------------------------------------------
@dataclass(frozen=True)
class _Entry(Generic[T]):
    """One top-level key: how to read it and what it is when absent.

    ``read`` returns ``None`` after recording a problem. A section reader (``section`` set)
    is also called with ``None`` when the key is absent and returns its defaults.
    """

    read: Callable[[Reader, Node, ReadContext], T | None]
    default: Callable[[ReadContext], T]
    section: type | None = None


def _section_entry(cls: type, read: Callable[[Reader, Node | None, ReadContext], T]) -> _Entry[T]:
    return _Entry(read=read, default=lambda ctx: read(Reader(), None, ctx), section=cls)


def _const(value: T) -> Callable[[ReadContext], T]:
    return lambda ctx: value


# The kinds' registries are imported when the file has their section: the registry lives
# in its stage's package, and a default daemon must not load the actions stage (httpx,
# OpenSSL; tests/service/test_daemon_imports.py) to learn that there are no receivers.
def _read_receivers(r: Reader, node: Node, ctx: ReadContext) -> tuple[ReceiverConfig, ...]:
    from gpuwatchd.actions.receivers.registry import READERS

    return read_receivers(r, node, READERS)


def _read_sources(r: Reader, node: Node | None, ctx: ReadContext) -> SourcesConfig:
    if node is None:
        return read_sources(r, None, ctx, (), {})
    from gpuwatchd.sources.kernel import registry

    return read_sources(r, node, ctx, registry.KERNEL_LOG_CHOICES[1:-1], registry.SECTIONS)


def _kind_readers() -> Mapping[str, KindSectionReader]:
    from gpuwatchd.sources.kernel.registry import SECTIONS

    return SECTIONS


def _driver_readers() -> Mapping[str, DriverSectionReader]:
    from gpuwatchd.actions.drain.drivers.registry import READERS

    return READERS


def _read_drain(r: Reader, node: Node | None, ctx: ReadContext) -> DrainConfig:
    # no section: the defaults, without loading the drivers (test_daemon_imports)
    return read_drain(r, node, _driver_readers() if node is not None else {})


_ENTRIES: dict[str, _Entry[Any]] = {
    "node_name": _Entry(read_node_name, default_node_name),
    "listen": _Entry(read_listen, _const(ListenAddress("127.0.0.1", DEFAULT_PORT))),
    "backend": _Entry(read_backend, _const(BackendSpec("nvml"))),
    "state_dir": _Entry(read_state_dir, default_state_dir),
    "log_level": _Entry(read_log_level, _const("info")),
    "poll": _section_entry(PollConfig, read_poll),
    "gpus": _section_entry(GpusConfig, read_gpus),
    "metrics": _section_entry(MetricsConfig, read_metrics),
    "sources": _section_entry(SourcesConfig, _read_sources),
    "receivers": _Entry(_read_receivers, _const(())),
    "routing": _section_entry(
        RoutingConfig,
        lambda r, n, ctx: read_routing(r, n, [rc.name for rc in ctx.seen.get("receivers", ())]),
    ),
    "drain": _section_entry(DrainConfig, _read_drain),
    "rules": _section_entry(RulesConfig, lambda r, n, ctx: read_rules(r, n, ctx.base_dir)),
    "xid": _section_entry(XidConfig, read_xid),
    "web": _section_entry(WebSection, read_web),
    "fields": _Entry(lambda r, n, ctx: read_fields(r, n), _const(())),
    "log_format": _Entry(read_log_format, _const("auto")),
}


def config_keys() -> list[str]:
    """Every key the config file accepts, dotted (``poll.interval``), in file order."""
    out: list[str] = []
    for name, entry in _ENTRIES.items():
        out.append(name)
        if entry.section is not None:
            for f in dataclasses.fields(entry.section):
                if f.metadata.get("sections"):  # the drain drivers' own sections
                    out.extend(f"{name}.{mode}" for mode in _driver_readers())
                elif f.metadata.get("spread"):  # the kernel-log kinds' own keys
                    out.extend(f"{name}.{k}" for s in _kind_readers().values() for k in s.options)
                else:
                    out.append(f"{name}.{f.name}")
    return out


# -- loading -------------------------------------------------------------------------------
def _build(root: Node | None, ctx: ReadContext, source: str | None) -> Config:
    r = Reader()
    keys: dict[str, Node] = {}
    if root is not None and root.value is not None:
        keys = r.mapping(root, list(_ENTRIES), "config") or {}
    values: dict[str, Any] = {}
    for name, entry in _ENTRIES.items():
        node = keys.get(name)
        value = entry.read(r, node, ctx) if node is not None else None
        values[name] = value if value is not None else entry.default(ctx)
        ctx.seen[name] = values[name]
    r.raise_if_any()
    return Config(**values, source=source)


def default_config(environ: Mapping[str, str] | None = None) -> Config:
    """The configuration when there is no file at all."""
    return _build(None, ReadContext(os.environ if environ is None else environ, None), None)


def load_config(
    path: str | None, *, must_exist: bool, environ: Mapping[str, str] | None = None
) -> Config:
    """Load and validate the config file at ``path``.

    ``path=None`` gives the built-in defaults without reading anything. A ``path`` that
    does not exist gives the defaults too, unless ``must_exist`` (the user named it with
    ``-c``). The CLI calls ``load_config(args.config or DEFAULT_CONFIG_PATH,
    must_exist=args.config is not None)``. An empty file means all defaults.

    ``environ`` (default ``os.environ``) supplies ``$STATE_DIRECTORY``.
    Raises ``ConfigError`` listing every problem as ``PATH:LINE:COL: message``.
    """
    env = os.environ if environ is None else environ
    if path is None or (not must_exist and not os.path.lexists(path)):
        return default_config(env)
    root = yamlsrc.load_file(path, allow_pipe=True)  # the file named on the command line
    ctx = ReadContext(env, os.path.dirname(os.path.abspath(path)))
    return _build(root, ctx, path)


__all__ = [
    "CALL_TIMEOUT_FACTOR",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_PORT",
    "DEFAULT_STATE_DIR",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "SECRET_PLACEHOLDER",
    "BackendSpec",
    "Config",
    "ConfigError",
    "GpusConfig",
    "ListenAddress",
    "MetricsConfig",
    "PollConfig",
    "ReadContext",
    "SourcesConfig",
    "WebSection",
    "XidConfig",
    "as_plain",
    "config_keys",
    "default_config",
    "load_config",
    "normalize_gpu_id",
]
