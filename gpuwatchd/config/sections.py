"""The daemon-wide config sections (``node_name``, ``listen``, ``poll``, ``gpus``, ``metrics``,
``sources``, ``xid``, ``web``, ...): their value types and their readers.

A reader has the shape ``(Reader, Node | None, ReadContext)`` and records every problem
as ``PATH:LINE:COL: message`` (all of them at once, in one ``ConfigError``); durations are
float seconds. The whole ``Config`` is assembled above every stage, in
``configfile/loader.py``, which lists these readers beside the ones each stage's kinds own
(receivers, kernel-log sources). Fields that hold secrets are declared with
``field(metadata={"secret": True})`` and are never shown by ``as_plain``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from gpuwatchd.config.fields import as_entry
from gpuwatchd.config.paths import SYSTEM_CONFIG_DIR
from gpuwatchd.config.yamlsrc import Node, Reader
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.fields import ExtraField

DEFAULT_CONFIG_PATH = SYSTEM_CONFIG_DIR + "/gpuwatchd.yaml"  # without $GPUWATCHD_CONFIG_DIR
DEFAULT_STATE_DIR = "/var/lib/gpuwatchd"
DEFAULT_PORT = 9835
LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_POLL_INTERVAL = 0.1
CALL_TIMEOUT_FACTOR = 10
SECRET_PLACEHOLDER = "<secret>"


# -- value types ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ListenAddress:
    """Where the HTTP server binds. ``host`` is an IP literal or ``localhost``."""

    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class BackendSpec:
    """``nvml`` (the real GPUs) or ``scenario:PATH`` (a scripted timeline)."""

    kind: Literal["nvml", "scenario"]
    path: str | None = None

    def __str__(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"

    @classmethod
    def parse(cls, text: str, base_dir: str | None = None) -> BackendSpec:
        """Parse the config value or the ``--backend`` option; ``ValueError`` if bad.

        A relative scenario path is taken relative to ``base_dir`` when given (the config
        file's directory), else left as written (relative to the working directory).
        """
        if text == "nvml":
            return cls("nvml")
        kind, _, path = text.partition(":")
        if kind == "scenario":
            if not path:
                raise ValueError("'scenario:' needs a path to a scenario file: scenario:PATH")
            if base_dir is not None and not os.path.isabs(path):
                path = os.path.normpath(os.path.join(base_dir, path))
            return cls("scenario", path)
        hint = difflib.get_close_matches(kind.lower(), ["nvml", "scenario:PATH"], n=1, cutoff=0.6)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ValueError(f"{text!r} is not a backend: use 'nvml' or 'scenario:PATH'{suggestion}")


# -- sections ------------------------------------------------------------------------------
@dataclass(frozen=True)
class PollConfig:
    interval: float = 5.0
    call_timeout: float = 2.0
    nvlink: bool = True
    processes: bool = True
    # NVML in a supervised worker process (docs/real-gpu.md); off: in the daemon's process
    worker: bool = True
    worker_hang_timeout: float = 30.0
    # the costly readings (energy, violations, margin, PCIe replay) and the per-link
    # NVLink error counters; see sources/gpu/nvml.py
    slow_interval: float = 120.0
    nvlink_counters_interval: float = 600.0
    state_interval: float = 15.0


@dataclass(frozen=True)
class GpusConfig:
    expected: int | None = None
    ignore: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetricsConfig:
    dcgm_compat: bool = False
    hostname_label: bool = True
    per_link: bool = True


@dataclass(frozen=True)
class KindSection:
    """A kernel-log kind's own keys of ``sources`` (``sources.journal_dir`` is journald's).
    Each kind's module subclasses it with its keys (frozen, every key with a default)."""


K = TypeVar("K", bound=KindSection)


@dataclass(frozen=True)
class SourcesConfig:
    kernel_log: str = "auto"
    # the kernel-log kinds' own sections that differ from their defaults, by kind; their
    # keys are read and shown as keys of ``sources`` (``as_plain``, ``config_keys``)
    kinds: Mapping[str, KindSection] = field(default_factory=dict, metadata={"spread": True})
    nvml_events: bool = True
    merge_window: float = 3.0
    backfill: float = 0.0

    def section(self, kind: str, cls: type[K]) -> K:
        """Kernel-log kind ``kind``'s own keys; its defaults when the file sets none."""
        value = self.kinds.get(kind)
        return value if isinstance(value, cls) else cls()


@dataclass(frozen=True)
class XidConfig:
    """Per-code overrides of the XID catalog: severity, action, the action's words
    (``text``) and membership of the fatal set (``fatal``)."""

    overrides: tuple[tuple[int, tuple[tuple[str, str | bool], ...]], ...] = ()

    def catalog(self) -> Any:
        """The XID catalog with these overrides applied (``gpuwatchd.xid.Catalog``)."""
        from gpuwatchd.xid.catalog import Catalog

        base = Catalog.default()
        if not self.overrides:
            return base
        return base.with_overrides({code: dict(fields) for code, fields in self.overrides})


@dataclass(frozen=True)
class WebSection:
    """The HTTP server's guards (see ``httpd`` and ``webconfig``)."""

    config_file: str | None = None  # exporter-toolkit web config: TLS, basic auth, headers
    max_request_bytes: int = 65536
    rate_limit: float = 50.0  # requests per second per client address; 0 turns it off
    rate_burst: int = 100
    # ``check`` and ``status`` may ask over HTTP when there is no status socket (a client
    # in another container); even then only a listener proven to be the daemon is believed
    ask_over_http: bool = False


def as_plain(value: Any) -> Any:
    """Dataclasses to dicts, tuples to lists, value types to their config strings.

    A dataclass field with ``metadata={"secret": True}`` shows as ``SECRET_PLACEHOLDER``
    when set; fields marked ``internal`` are left out; a mapping field marked ``sections``
    (``DrainConfig.drivers``) shows its entries as keys of the parent.
    """
    if isinstance(value, ListenAddress | BackendSpec):
        return str(value)
    if isinstance(value, ExtraField):
        return as_entry(value)
    if isinstance(value, XidConfig):
        return {"overrides": {code: dict(fields) for code, fields in value.overrides}}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if f.metadata.get("internal"):
                continue
            item = getattr(value, f.name)
            if f.metadata.get("sections"):  # sections shown as keys of their parent
                out.update({str(k): as_plain(v) for k, v in item.items()})
            elif f.metadata.get("spread"):  # sections whose keys are the parent's
                for section in item.values():
                    out.update(as_plain(section))
            elif f.metadata.get("secret") and item is not None:
                out[f.name] = SECRET_PLACEHOLDER
            else:
                out[f.name] = as_plain(item)
        return out
    if isinstance(value, tuple | list):
        return [as_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): as_plain(v) for k, v in value.items()}
    return value


# -- readers -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReadContext:
    environ: Mapping[str, str]
    base_dir: str | None  # directory of the config file, for relative paths
    # Values of the keys read so far, so a later section can check references to an
    # earlier one (routing names receivers).
    seen: dict[str, Any] = field(default_factory=dict)


def _section_keys(r: Reader, node: Node | None, cls: type, what: str) -> dict[str, Node]:
    """A section's keys; a missing or empty (null) section means all defaults."""
    if node is None or node.value is None:
        return {}
    names = [f.name for f in dataclasses.fields(cls)]
    return r.mapping(node, names, what) or {}


def _fmt_seconds(seconds: float) -> str:
    if 0 < seconds < 1 and seconds * 1000 == round(seconds * 1000):
        return f"{round(seconds * 1000)}ms"
    return f"{seconds:g}s"


def _duration(
    r: Reader,
    node: Node,
    what: str,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
) -> float | None:
    seconds = r.duration(node, what, minimum=-math.inf)
    if seconds is None:
        return None
    if not math.isfinite(seconds):
        r.error(node.loc, f"{what}: must be a finite duration, got {node.value!r}")
        return None
    if at_least is not None and seconds < at_least:
        r.error(node.loc, f"{what}: must be at least {_fmt_seconds(at_least)}, got {node.value!r}")
        return None
    if above is not None and seconds <= above:
        r.error(node.loc, f"{what}: must be more than {_fmt_seconds(above)}, got {node.value!r}")
        return None
    if at_most is not None and seconds > at_most:
        r.error(node.loc, f"{what}: must be at most {_fmt_seconds(at_most)}, got {node.value!r}")
        return None
    return seconds


def read_node_name(r: Reader, node: Node, ctx: ReadContext) -> str | None:
    value = r.string(node, "node_name")
    if value is None:
        return None
    if not value or len(value) > 253 or any(c.isspace() or not c.isprintable() for c in value):
        r.error(
            node.loc,
            f"node_name: {value!r} is not a node name "
            "(1-253 characters, no spaces or control characters)",
        )
        return None
    return value


def default_node_name(ctx: ReadContext) -> str:
    return socket.gethostname().partition(".")[0] or "localhost"


def read_listen(r: Reader, node: Node, ctx: ReadContext) -> ListenAddress | None:
    pair = r.listen_address(node, "listen")
    return None if pair is None else ListenAddress(*pair)


def read_backend(r: Reader, node: Node, ctx: ReadContext) -> BackendSpec | None:
    value = r.string(node, "backend")
    if value is None:
        return None
    try:
        return BackendSpec.parse(value, ctx.base_dir)
    except ValueError as exc:
        r.error(node.loc, f"backend: {exc}")
        return None


def read_state_dir(r: Reader, node: Node, ctx: ReadContext) -> str | None:
    value = r.string(node, "state_dir")
    if value is None:
        return None
    if not os.path.isabs(value):
        r.error(node.loc, f"state_dir: {value!r} is not an absolute path")
        return None
    return os.path.normpath(value)


def default_state_dir(ctx: ReadContext) -> str:
    # systemd's StateDirectory= sets $STATE_DIRECTORY (colon-separated if several).
    first = ctx.environ.get("STATE_DIRECTORY", "").split(":")[0]
    return first if os.path.isabs(first) else DEFAULT_STATE_DIR


def read_log_level(r: Reader, node: Node, ctx: ReadContext) -> str | None:
    value = r.string(node, "log_level")
    if value is None:
        return None
    if value.lower() in LOG_LEVELS:
        return value.lower()
    hint = difflib.get_close_matches(value.lower(), LOG_LEVELS, n=1, cutoff=0.6)
    suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
    r.error(node.loc, f"log_level: {value!r} is not one of {', '.join(LOG_LEVELS)}{suggestion}")
    return None


LOG_FORMATS = ("auto", "json")


def read_log_format(r: Reader, node: Node, ctx: ReadContext) -> str | None:
    return r.string(node, "log_format", LOG_FORMATS)


def read_poll(r: Reader, node: Node | None, ctx: ReadContext) -> PollConfig:
    keys = _section_keys(r, node, PollConfig, "poll")
    d = PollConfig()
    values: dict[str, Any] = {}
    if "interval" in keys:
        values["interval"] = _duration(
            r, keys["interval"], "poll.interval", at_least=MIN_POLL_INTERVAL, at_most=3600.0
        )
    if "call_timeout" in keys:
        timeout_node = keys["call_timeout"]
        timeout = _duration(r, timeout_node, "poll.call_timeout", above=0.0)
        interval = values.get("interval", d.interval)
        if timeout is not None and interval is not None:
            limit = interval * CALL_TIMEOUT_FACTOR
            if timeout >= limit:
                r.error(
                    timeout_node.loc,
                    f"poll.call_timeout: must be less than {CALL_TIMEOUT_FACTOR} x poll.interval "
                    f"({_fmt_seconds(limit)}), got {timeout_node.value!r}",
                )
                timeout = None
        values["call_timeout"] = timeout
    for name in ("nvlink", "processes", "worker"):
        if name in keys:
            values[name] = r.boolean(keys[name], f"poll.{name}")
    if "worker_hang_timeout" in keys:
        values["worker_hang_timeout"] = _duration(
            r, keys["worker_hang_timeout"], "poll.worker_hang_timeout", at_least=1.0, at_most=3600.0
        )
    for name in ("slow_interval", "nvlink_counters_interval", "state_interval"):
        if name in keys:
            values[name] = _duration(r, keys[name], f"poll.{name}", at_least=0.0, at_most=86400.0)
    return dataclasses.replace(d, **{k: v for k, v in values.items() if v is not None})


_UUID_RE = re.compile(
    r"GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
_PCI_RE = re.compile(
    r"(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])"
)


def normalize_gpu_id(text: str) -> str | None:
    """A GPU UUID or PCI bus id in NVML's form, or ``None`` if it is neither.

    UUIDs keep NVML's ``GPU-`` prefix with lowercase hex; PCI bus ids become NVML's
    ``00000000:3B:00.0`` (8-digit domain, uppercase), whether written that way, as sysfs
    and ``lspci -D`` do (``0000:3b:00.0``) or without a domain (``3b:00.0``).
    """
    text = text.strip()
    if _UUID_RE.fullmatch(text):
        return "GPU-" + text[4:].lower()
    m = _PCI_RE.fullmatch(text)
    if m:
        domain = int(m.group("domain") or "0", 16)
        return f"{domain:08X}:{m.group('bus').upper()}:{m.group('dev').upper()}.{m.group('fn')}"
    return None


def read_gpus(r: Reader, node: Node | None, ctx: ReadContext) -> GpusConfig:
    keys = _section_keys(r, node, GpusConfig, "gpus")
    d = GpusConfig()
    expected = d.expected
    if "expected" in keys and keys["expected"].value is not None:
        expected = r.integer(keys["expected"], "gpus.expected", minimum=0)
    ignore: list[str] = []
    items: list[Node] | None = None
    if "ignore" in keys and keys["ignore"].value is not None:
        items = r.sequence(keys["ignore"], "gpus.ignore")
    for item in items or []:
        what = "gpus.ignore"
        if isinstance(item.value, int) and not isinstance(item.value, bool):
            r.error(
                item.loc,
                f"{what}: {item.value!r} looks like a GPU index, which can change across "
                "reboots; use the GPU UUID (GPU-...) or PCI bus id (00000000:3B:00.0)",
            )
            continue
        text = r.string(item, what)
        if text is None:
            continue
        gpu_id = normalize_gpu_id(text)
        if gpu_id is None:
            r.error(
                item.loc,
                f"{what}: {text!r} is neither a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-"
                "xxxxxxxxxxxx) nor a PCI bus id (00000000:3B:00.0)",
            )
        elif gpu_id in ignore:
            r.error(item.loc, f"{what}: {text!r} is listed twice")
        else:
            ignore.append(gpu_id)
    return GpusConfig(expected=expected, ignore=tuple(ignore))


def read_metrics(r: Reader, node: Node | None, ctx: ReadContext) -> MetricsConfig:
    keys = _section_keys(r, node, MetricsConfig, "metrics")
    values = {name: r.boolean(n, f"metrics.{name}") for name, n in keys.items()}
    return dataclasses.replace(
        MetricsConfig(), **{k: v for k, v in values.items() if v is not None}
    )


SourceOptionReader = Callable[[Reader, Node, str, str | None], Any]
"""A kernel-log kind's reader of one of its ``sources`` keys: ``(reader, node, where,
base_dir)`` -> the value, or ``None`` after recording a problem (``base_dir``: the config
file's directory, for relative paths)."""


@dataclass(frozen=True)
class KindSectionReader:
    """How a kernel-log kind's own keys of ``sources`` are read, as its module gives it to
    the registry: ``section``, their type; ``options``, each key's reader."""

    section: type[KindSection]
    options: Mapping[str, SourceOptionReader]


def read_path(r: Reader, node: Node, what: str, base_dir: str | None) -> str | None:
    """A file or directory path; a relative one is taken from the config file's directory."""
    text = r.string(node, what)
    if text is not None and base_dir is not None and not os.path.isabs(text):
        text = os.path.normpath(os.path.join(base_dir, text))
    return text


def read_sources(
    r: Reader,
    node: Node | None,
    ctx: ReadContext,
    kinds: Sequence[str],
    sections: Mapping[str, KindSectionReader],
) -> SourcesConfig:
    """The ``sources`` section. ``kinds``: the values ``kernel_log`` may name besides
    ``auto`` and ``none``; ``sections``: each kernel-log kind's own keys, their type and
    readers (both from the kernel-log kinds' registry, which owns them)."""
    names = [f.name for f in dataclasses.fields(SourcesConfig)]
    own = [key for s in sections.values() for key in s.options]
    allowed = [*names[:1], *own, *names[2:]]  # the kinds' keys where ``kinds`` is
    keys: dict[str, Node] = {}
    if node is not None and node.value is not None:
        keys = r.mapping(node, allowed, "sources") or {}
    values: dict[str, Any] = {}
    if "kernel_log" in keys:
        values["kernel_log"] = r.string(
            keys["kernel_log"], "sources.kernel_log", ("auto", *kinds, "none")
        )
    found: dict[str, KindSection] = {}
    for kind, reader in sections.items():
        read_keys: dict[str, Any] = {}
        for name, read in reader.options.items():
            if name in keys and keys[name].value is not None:
                value = read(r, keys[name], f"sources.{name}", ctx.base_dir)
                if value is not None:
                    read_keys[name] = value
        section = reader.section(**read_keys)
        if section != reader.section():
            found[kind] = section
    values["kinds"] = found
    if "nvml_events" in keys:
        values["nvml_events"] = r.boolean(keys["nvml_events"], "sources.nvml_events")
    if "merge_window" in keys:
        values["merge_window"] = _duration(
            r, keys["merge_window"], "sources.merge_window", above=0.0, at_most=3600.0
        )
    if "backfill" in keys:
        values["backfill"] = _duration(
            r, keys["backfill"], "sources.backfill", at_most=366 * 86400.0
        )
    return dataclasses.replace(
        SourcesConfig(), **{k: v for k, v in values.items() if v is not None}
    )


def read_web(r: Reader, node: Node | None, ctx: ReadContext) -> WebSection:
    keys = _section_keys(r, node, WebSection, "web")
    values: dict[str, Any] = {}
    n = keys.get("config_file")
    if n is not None and n.value is not None:
        text = r.string(n, "web.config_file")
        if text is not None and ctx.base_dir is not None and not os.path.isabs(text):
            text = os.path.normpath(os.path.join(ctx.base_dir, text))
        if text is not None:
            from gpuwatchd.config.web import load_web_config

            try:
                load_web_config(text)  # every problem of that file, at its own location
                values["config_file"] = text
            except ConfigError as exc:
                r.error(n.loc, f"web.config_file: {text} does not load")
                r.problems.extend(exc.problems)
    if "max_request_bytes" in keys:
        values["max_request_bytes"] = r.integer(
            keys["max_request_bytes"], "web.max_request_bytes", minimum=1024, maximum=1 << 30
        )
    if "rate_limit" in keys:
        values["rate_limit"] = r.number(keys["rate_limit"], "web.rate_limit", minimum=0.0)
    if "rate_burst" in keys:
        values["rate_burst"] = r.integer(
            keys["rate_burst"], "web.rate_burst", minimum=1, maximum=1_000_000
        )
    if "ask_over_http" in keys:
        values["ask_over_http"] = r.boolean(keys["ask_over_http"], "web.ask_over_http")
    return dataclasses.replace(WebSection(), **{k: v for k, v in values.items() if v is not None})


def read_xid(r: Reader, node: Node | None, ctx: ReadContext) -> XidConfig:
    keys = _section_keys(r, node, XidConfig, "xid")
    if "overrides" not in keys or keys["overrides"].value is None:
        return XidConfig()
    from gpuwatchd.xid.catalog import OVERRIDE_FIELDS, Catalog

    table = keys["overrides"]
    if not table.is_mapping():
        r.error(
            table.loc,
            "xid.overrides: expected a mapping of XID number to {severity, action, text, fatal}",
        )
        return XidConfig()
    out: dict[int, tuple[tuple[str, str | bool], ...]] = {}
    for key_node, value_node in table.items():
        what = f"xid.overrides.{key_node.value}"
        key_text = str(key_node.value)
        if not (key_text.isascii() and key_text.isdigit() and len(key_text) <= 6):
            r.error(
                key_node.loc,
                f"xid.overrides: {key_node.value!r} is not an XID number (1 to 6 ASCII digits)",
            )
            continue
        code = int(key_node.value)
        fields = r.mapping(value_node, list(OVERRIDE_FIELDS), what)
        if fields is None:
            continue
        if not fields and not list(value_node.items()):
            r.error(value_node.loc, f"{what}: name at least one of {', '.join(OVERRIDE_FIELDS)}")
            continue
        pairs: list[tuple[str, str | bool]] = []
        for name, fnode in fields.items():
            value: str | bool | None
            if name == "fatal":
                value = r.boolean(fnode, f"{what}.fatal")
            else:
                value = r.string(fnode, f"{what}.{name}")
            if value is None:
                continue
            try:
                Catalog.default().with_overrides({code: {name: value}})
            except ValueError as exc:
                r.error(fnode.loc, f"{what}.{name}: {exc}")
                continue
            pairs.append((name, value))
        if pairs:
            out[code] = tuple(sorted(pairs))
    return XidConfig(tuple(sorted(out.items())))
