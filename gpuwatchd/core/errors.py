"""The small error hierarchy every gpuwatchd module raises from.

Callers catch the narrowest class they can act on:

- ``ConfigError`` carries a location (path, line, column) so that every mistake in a
  config, rule or scenario file can be printed as ``PATH:LINE:COL: message``.
- ``BackendError`` and its subclasses come from the NVML seam. ``GpuLost`` means the
  card fell off the bus (a health event, not a crash); ``NotSupported`` means the field
  is absent on this GPU and should not be asked for again; ``CallTimeout`` means the call
  did not return within its budget.
"""

from __future__ import annotations

from dataclasses import dataclass


class GpuwatchdError(Exception):
    """Base class of every error gpuwatchd raises on purpose."""


@dataclass(frozen=True)
class Location:
    path: str
    line: int  # 1-based
    column: int  # 1-based

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.column}"


class ConfigError(GpuwatchdError):
    """One or more problems in a user-written YAML file."""

    def __init__(self, problems: list[tuple[Location, str]]) -> None:
        self.problems = sorted(problems, key=lambda p: (p[0].path, p[0].line, p[0].column))
        super().__init__("\n".join(f"{loc}: {msg}" for loc, msg in self.problems))

    @classmethod
    def at(cls, location: Location, message: str) -> ConfigError:
        return cls([(location, message)])

    def lines(self) -> list[str]:
        return [f"{loc}: {msg}" for loc, msg in self.problems]


class BackendError(GpuwatchdError):
    """An NVML (or scenario) call failed."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class GpuLost(BackendError):
    """The GPU has fallen off the bus or is otherwise inaccessible (GPU_IS_LOST)."""


class ResetRequired(BackendError):
    """The GPU needs a reset before it can be used again (RESET_REQUIRED)."""


class NotSupported(BackendError):
    """The field or call is not available on this GPU (NOT_SUPPORTED)."""


class CallTimeout(BackendError):
    """The call did not return within its time budget."""


class BackendUnavailable(BackendError):
    """The backend cannot start at all (no driver, no library, no GPUs)."""
