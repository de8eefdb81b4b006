"""Where the daemon's log records go, and what they look like there.

Three destinations, chosen from where stderr leads:

- **journal**: stderr is a journald stream (``$JOURNAL_STREAM`` names stderr's
  ``device:inode``, as systemd sets it for ``StandardError=journal``). Records go through
  python-systemd's ``journal.send`` as structured entries: ``PRIORITY`` mapped from the
  level, ``SYSLOG_IDENTIFIER=gpuwatchd``, ``LOGGER``, ``THREAD_NAME``, ``CODE_*``, and
  ``GPU=``, ``XID=``, ``RULE=`` (plus ``UUID=``, ``PCI_BUS_ID=``) taken from the record's
  ``extra``::

      log.warning("XID %d on GPU %d", 79, 3, extra={"gpu": 3, "xid": 79})

  Without python-systemd the same stream gets ``<N>`` priority prefixes (sd-daemon(3)),
  which journald turns into ``PRIORITY=``.
- **tty**: short, aligned, coloured lines for a person at a terminal.
- **plain**: ``TIME LEVEL LOGGER: message key=value ...`` for files, pipes and containers.
- **json** (``log_format: json`` in the config; never chosen by itself): one JSON object per
  line on stderr, for log shippers: ``{"time": "2026-01-02T03:04:05.678Z", "level": "info",
  "logger": "gpuwatchd.alerts", "message": "...", "rule": "GpuXidFatal", "gpu": "3"}``,
  plus ``exception`` with the traceback when there is one.

Secrets never reach any destination: every value registered with ``register_secret`` (the
config's secret fields, credentials read at run time) and a few well-known token shapes
(Slack webhook paths, bearer tokens, passwords in URLs) are replaced by ``<redacted>``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import IO, Any, Literal

from gpuwatchd.configfile.loader import LOG_FORMATS  # auto: journal, tty or plain; or json
from gpuwatchd.core.secretforms import secret_forms

__all__ = [
    "FIELDS",
    "LOG_FORMATS",
    "JournalHandler",
    "JsonFormatter",
    "Mode",
    "choose_mode",
    "config_secrets",
    "journal_stream_matches",
    "redact",
    "register_secret",
    "set_level",
    "setup_logging",
    "syslog_priority",
]

Mode = Literal["journal", "tty", "plain", "json"]

FIELDS: Mapping[str, str] = {
    "gpu": "GPU",
    "xid": "XID",
    "rule": "RULE",
    "uuid": "UUID",
    "pci_bus_id": "PCI_BUS_ID",
}
"""``extra`` keys copied into journal fields (and shown as key=value elsewhere)."""

REDACTED = "<redacted>"
_PATTERNS = (
    re.compile(r"(hooks\.slack\.com/services/)[A-Za-z0-9/_-]+"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"),
    re.compile(r"(://[^/\s:@]+:)[^@\s/]+(?=@)"),  # https://user:PASSWORD@host
    re.compile(r"(?i)((?:routing_key|token|password|secret)[\"']?\s*[=:]\s*[\"']?)[^\s\"',&]+"),
)
_secrets: set[str] = set()
_secrets_lock = threading.Lock()


def register_secret(value: str | None) -> None:
    """Never log ``value``, nor its percent-encoded or -decoded forms (a receiver may echo
    the URL it was sent either way). Values shorter than 4 characters are ignored."""
    if value and len(value) >= 4:
        forms = secret_forms(value)
        with _secrets_lock:
            _secrets.update(forms)


def config_secrets(obj: Any) -> list[str]:
    """Every string held by a dataclass field marked ``metadata={"secret": True}``."""
    out: list[str] = []
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.metadata.get("secret"):
                out.extend(_strings(value))
            else:
                out.extend(config_secrets(value))
    elif isinstance(obj, tuple | list):
        for item in obj:
            out.extend(config_secrets(item))
    elif isinstance(obj, Mapping):
        for item in obj.values():
            out.extend(config_secrets(item))
    return out


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, tuple | list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, Mapping):
        for v in value.values():
            yield from _strings(v)


def redact(text: str) -> str:
    with _secrets_lock:
        secrets = sorted(_secrets, key=len, reverse=True)
    for s in secrets:
        if s in text:
            text = text.replace(s, REDACTED)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def escape_controls(text: str, keep: str = "") -> str:
    """``text`` with every control character except those in ``keep`` written as an escape
    (``\x1b``, ``\n``): text a log line quotes (a process name, a receiver's answer, a
    path) must not move the terminal's cursor, retitle it, ring its bell, or start what
    looks like a log line of its own."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii")
        for c in text
    )


class _Printable(logging.Filter):
    """Escapes control characters in what a record quotes: each argument whose text is not
    printable (newlines included: an argument never starts a line of its own), and the
    message itself (newlines kept: a message may span lines on purpose). The record's
    traceback is left as it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args:
            record.args = tuple(_printable_arg(a) for a in args)
        elif isinstance(args, dict):
            record.args = {k: _printable_arg(v) for k, v in args.items()}
        if isinstance(record.msg, str) and not record.msg.isprintable():
            record.msg = escape_controls(record.msg, keep="\n")
        return True


def _printable_arg(value: Any) -> Any:
    if isinstance(value, int | float) or value is None:
        return value  # %d, %x, %g need the number
    text = value if isinstance(value, str) else str(value)
    return value if text.isprintable() else escape_controls(text)


def syslog_priority(levelno: int) -> int:
    """Python level -> syslog priority (0 emerg ... 7 debug)."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def _fields(record: logging.LogRecord) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, name in FIELDS.items():
        value = getattr(record, key, None)
        if value is not None:
            out[name] = redact(escape_controls(str(value)))
    return out


def _message(record: logging.LogRecord, formatter: logging.Formatter) -> str:
    return redact(formatter.format(record))


# -- destinations ---------------------------------------------------------------------------
Sender = Callable[..., Any]


class JournalHandler(logging.Handler):
    """Structured journal entries through ``systemd.journal.send`` (or ``sender``)."""

    def __init__(self, sender: Sender | None = None, identifier: str = "gpuwatchd") -> None:
        super().__init__()
        if sender is None:
            import importlib

            sender = importlib.import_module("systemd.journal").send
        self._send = sender
        self.identifier = identifier
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            assert self.formatter is not None
            self._send(
                _message(record, self.formatter),
                PRIORITY=str(syslog_priority(record.levelno)),
                SYSLOG_IDENTIFIER=self.identifier,
                LOGGER=record.name,
                THREAD_NAME=record.threadName or "",
                CODE_FILE=record.pathname,
                CODE_LINE=record.lineno,  # python-systemd formats it with {:d}
                CODE_FUNC=record.funcName,
                **_fields(record),
            )
        except Exception:
            self.handleError(record)


class _TextFormatter(logging.Formatter):
    """Message plus ``key=value`` for the structured fields; optional ``<N>`` prefix."""

    def __init__(self, fmt: str, datefmt: str | None, *, prefix: bool, color: bool) -> None:
        super().__init__(fmt, datefmt)
        self.prefix = prefix
        self.color = color

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = " ".join(f"{k.lower()}={v}" for k, v in _fields(record).items())
        if extras:
            head, sep, tail = text.partition("\n")  # keep a traceback below the line
            text = f"{head} [{extras}]" if self.color else f"{head} {extras}"
            text += sep + tail
        text = redact(text)
        if self.color:
            text = _colour(record.levelno, text)
        if self.prefix:
            prio = syslog_priority(record.levelno)
            text = "\n".join(f"<{prio}>{line}" for line in text.split("\n"))
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, RFC 3339), level, logger, message, the
    structured fields (``FIELDS``, lower-case) and the traceback; secrets redacted."""

    def format(self, record: logging.LogRecord) -> str:
        import json
        from datetime import UTC, datetime

        stamp = datetime.fromtimestamp(record.created, UTC)
        out: dict[str, str] = {
            "time": stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key, value in _fields(record).items():
            out[key.lower()] = value  # already redacted
        if record.exc_info:
            out["exception"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, ensure_ascii=False)


def _colour(levelno: int, text: str) -> str:
    if levelno >= logging.ERROR:
        code = "31"  # red
    elif levelno >= logging.WARNING:
        code = "33"  # yellow
    elif levelno < logging.INFO:
        code = "2"  # dim
    else:
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


# -- choosing -------------------------------------------------------------------------------
def journal_stream_matches(fd: int, environ: Mapping[str, str]) -> bool:
    """True when ``fd`` is the stream systemd connected to the journal."""
    dev, sep, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not sep or not dev.isdigit() or not ino.isdigit():
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return st.st_dev == int(dev) and st.st_ino == int(ino)


def choose_mode(stream: IO[str], environ: Mapping[str, str]) -> Mode:
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        return "plain"
    if journal_stream_matches(fd, environ):
        return "journal"
    if not os.isatty(fd) or environ.get("TERM") == "dumb" or environ.get("NO_COLOR"):
        return "plain"  # a terminal that shows no colour (TERM=dumb) or does not want it
    return "tty"


_handler: logging.Handler | None = None


def setup_logging(
    level: str = "info",
    verbose: bool = False,
    *,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
    mode: Mode | None = None,
    sender: Sender | None = None,
    log_format: str = "auto",
) -> Mode:
    """Install gpuwatchd's one root handler (replacing an earlier one); returns the mode.

    ``log_format="json"`` chooses JSON lines on ``stream`` whatever stderr leads to."""
    global _handler
    out = sys.stderr if stream is None else stream
    env = os.environ if environ is None else environ
    chosen: Mode = "json" if log_format == "json" else (mode or choose_mode(out, env))
    handler: logging.Handler
    if chosen == "json":
        handler = logging.StreamHandler(out)
        handler.setFormatter(JsonFormatter())
    elif chosen == "journal":
        try:
            handler = JournalHandler(sender)
        except ImportError:  # no python-systemd: journald still parses <N> prefixes
            handler = logging.StreamHandler(out)
            handler.setFormatter(
                _TextFormatter("%(name)s: %(message)s", None, prefix=True, color=False)
            )
    elif chosen == "tty":
        handler = logging.StreamHandler(out)
        color = "NO_COLOR" not in env and env.get("TERM") != "dumb"
        handler.setFormatter(
            _TextFormatter(
                "%(asctime)s %(levelname)-7s %(name)s: %(message)s",
                "%H:%M:%S",
                prefix=False,
                color=color,
            )
        )
    else:
        handler = logging.StreamHandler(out)
        handler.setFormatter(
            _TextFormatter(
                "%(asctime)s %(levelname)s %(name)s: %(message)s", None, prefix=False, color=False
            )
        )
    handler.addFilter(_Printable())  # no terminal escape from quoted text, whatever the mode
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    _handler = handler
    for name in ("httpx", "httpcore"):  # their INFO/DEBUG lines carry URLs (secrets)
        logging.getLogger(name).setLevel(logging.WARNING)
    set_level(level, verbose)
    return chosen


def set_level(level: str, verbose: bool = False) -> None:
    """Change the root level (a reload); ``verbose`` (``-v``) always means debug."""
    logging.getLogger().setLevel(
        logging.DEBUG if verbose else getattr(logging, level.upper(), logging.INFO)
    )
