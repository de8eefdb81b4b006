"""Maintenance silences: mute notifications (and drains) for a node or one GPU until a time.

Silences live in ``<state_dir>/silences.json``. ``gpuwatchd silence add|list|expire``
writes it (under an exclusive ``flock``, replaced atomically); the daemon only reads it,
again whenever the file changes, so the CLI needs no connection to the daemon and the
daemon no write access to a file an administrator created.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from gpuwatchd.config.sections import normalize_gpu_id
from gpuwatchd.core.atomicfile import open_directory, write_atomic_at
from gpuwatchd.core.statefile import open_state_file, read_state_file

FILE_NAME = "silences.json"
KEEP_EXPIRED = 7 * 86400.0  # expired silences stay listed (``list --all``) this long
MAX_BYTES = 4 * 1024 * 1024  # largest silences file read (thousands of silences)


@dataclass(frozen=True)
class Silence:
    id: str
    node: str
    gpu: str | None  # index ("3"), UUID (GPU-...) or PCI bus id (NVML form); None: whole node
    rule: str | None
    reason: str
    author: str
    created: float
    starts_at: float
    ends_at: float
    expired_at: float | None = None

    def active(self, now: float) -> bool:
        end = self.ends_at if self.expired_at is None else min(self.ends_at, self.expired_at)
        return self.starts_at <= now < end

    @property
    def end(self) -> float:
        return self.ends_at if self.expired_at is None else min(self.ends_at, self.expired_at)

    def matches(self, labels: Mapping[str, str]) -> bool:
        if labels.get("node", self.node) != self.node:
            return False
        if self.rule is not None and labels.get("rule", labels.get("alertname")) != self.rule:
            return False
        if self.gpu is None:
            return True
        if labels.get("gpu") == self.gpu or labels.get("uuid", "").lower() == self.gpu.lower():
            return True
        pci = labels.get("pci_bus_id")
        return bool(pci) and normalize_gpu_id(str(pci)) == self.gpu

    def as_dict(self, now: float | None = None) -> dict[str, Any]:
        out = asdict(self)
        if now is not None:
            out["active"] = self.active(now)
        return out


def normalize_gpu(text: str) -> str | None:
    """A GPU index (``3``), UUID or PCI bus id as silences store it; None if none of these."""
    text = text.strip()
    if text.isdigit():
        return str(int(text))
    return normalize_gpu_id(text)


def path_in(state_dir: str) -> str:
    return os.path.join(state_dir, FILE_NAME)


def _parse(data: Any) -> list[Silence]:
    out: list[Silence] = []
    if not isinstance(data, dict):
        return out
    for item in data.get("silences") or []:
        try:
            out.append(
                Silence(
                    id=str(item["id"]),
                    node=str(item["node"]),
                    gpu=None if item.get("gpu") is None else str(item["gpu"]),
                    rule=None if item.get("rule") is None else str(item["rule"]),
                    reason=str(item.get("reason", "")),
                    author=str(item.get("author", "")),
                    created=float(item["created"]),
                    starts_at=float(item["starts_at"]),
                    ends_at=float(item["ends_at"]),
                    expired_at=None
                    if item.get("expired_at") is None
                    else float(item["expired_at"]),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


def read_silences(path: str, *, dir_fd: int | None = None) -> list[Silence]:
    """Every silence in the file; an absent file has none. Raises OSError/ValueError.

    The file must be a regular file (not a link, FIFO or device) of at most ``MAX_BYTES``;
    with ``dir_fd``, ``path`` is its name in that directory.
    """
    try:
        data = read_state_file(path, MAX_BYTES, dir_fd=dir_fd)
    except FileNotFoundError:
        return []
    return _parse(json.loads(data.decode("utf-8")))


@contextlib.contextmanager
def _locked(path: str) -> Iterator[int]:
    """Hold the exclusive lock of ``path`` (``<path>.lock``); yields a descriptor of the
    directory, through which every file of the change is read and written.

    The state directory belongs to the service user while root runs ``silence add``: a
    name in it can become a link at any moment, so nothing is opened by path. The lock
    file is opened read-only through the directory descriptor (``flock`` needs no more, so
    a lock file that root created, mode 0644, is as usable by the service user as one it
    created itself), and never followed as a link.
    """
    with open_directory(os.path.dirname(path) or ".") as dir_fd:
        fd = open_state_file(
            os.path.basename(path) + ".lock", os.O_RDONLY | os.O_CREAT, 0o644, dir_fd=dir_fd
        )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield dir_fd
        finally:
            os.close(fd)


def _write(dir_fd: int, path: str, items: list[Silence]) -> None:
    doc = {"version": 1, "silences": [s.as_dict() for s in items]}
    data = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    write_atomic_at(dir_fd, os.path.basename(path), data)


def add_silence(
    path: str,
    *,
    node: str,
    gpu: str | None,
    rule: str | None,
    duration: float,
    reason: str,
    author: str,
    now: float,
) -> Silence:
    if duration <= 0:
        raise ValueError("the duration must be positive")
    silence = Silence(
        id=secrets.token_hex(4),
        node=node,
        gpu=gpu,
        rule=rule,
        reason=reason,
        author=author,
        created=now,
        starts_at=now,
        ends_at=now + duration,
    )
    with _locked(path) as dir_fd:
        name = os.path.basename(path)
        items = [s for s in read_silences(name, dir_fd=dir_fd) if now - s.end < KEEP_EXPIRED]
        items.append(silence)
        _write(dir_fd, path, items)
    return silence


def expire_silence(path: str, silence_id: str, now: float) -> Silence | None:
    """End a silence now; returns it, or None when no silence has that id (or prefix)."""
    with _locked(path) as dir_fd:
        items = read_silences(os.path.basename(path), dir_fd=dir_fd)
        hits = [s for s in items if s.id == silence_id] or [
            s for s in items if s.id.startswith(silence_id)
        ]
        if len(hits) != 1:
            return None
        target = hits[0]
        ended = Silence(**{**asdict(target), "expired_at": min(now, target.end)})
        _write(dir_fd, path, [ended if s.id == target.id else s for s in items])
    return ended


class SilenceView:
    """The daemon's read-only view of the silences file, re-read when the file changes."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._items: list[Silence] = []
        self.generation = 0  # changes when the file's content was re-read
        self.error: str | None = None

    def refresh(self) -> bool:
        """Re-read the file if it changed; True when it did."""
        if self.path is None:
            return False
        try:
            st = os.lstat(self.path)
            stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            self.error = f"cannot read {self.path}: {exc.strerror}"
            return False
        if stamp == self._stamp:
            return False
        try:
            self._items = read_silences(self.path) if stamp is not None else []
            self.error = None
        except (OSError, ValueError) as exc:
            self.error = f"cannot read {self.path}: {exc}"
            return False
        self._stamp = stamp
        self.generation += 1
        return True

    def all(self) -> list[Silence]:
        return list(self._items)

    def active(self, now: float) -> list[Silence]:
        return [s for s in self._items if s.active(now)]

    def match(self, labels: Mapping[str, str], now: float) -> Silence | None:
        for s in self._items:
            if s.active(now) and s.matches(labels):
                return s
        return None

    def next_change(self, now: float) -> float | None:
        """The next time a silence starts or ends (so muted alerts are looked at again)."""
        times = [t for s in self._items for t in (s.starts_at, s.end) if t > now]
        return min(times) if times else None
