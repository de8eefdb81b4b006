"""Helpers of the state-file tests: a call that must not block, a call as another user."""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVICE_UID = 65534  # nobody: stands for the service user when the tests run as root


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """``fn()``'s result, failing the test (not hanging it) if it takes longer."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the test thread
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still blocked after {seconds}s"
    if "error" in box:
        raise box["error"]
    return box.get("result")


def as_user(uid: int | None, fn: Callable[[], int]) -> int:
    """Run ``fn`` in a forked child, as ``uid`` when given; its result is the exit status
    (a fork, not a new interpreter: the interpreter may live where ``uid`` cannot read)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
            code = fn()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def bad_rule_rows(db: Path) -> None:
    """A rule state database with three saved alerts whose columns hold valid values of
    the wrong shape (a list for labels, a string for annotations, text for a time) and a
    counter of text."""
    from gpuwatchd.rules.store import StateStore

    StateStore(str(db), boot_id="b").close()
    conn = sqlite3.connect(db)
    row = ["fp", "GpuXid", "{}", "firing", "page", 1.0, 1.0, 1.0, 1, None, "{}", "b", 0, 1.0]
    for i, (col, value) in enumerate(((2, "[1, 2]"), (10, '"text"'), (5, "soon"))):
        bad = list(row)
        bad[0], bad[col] = f"fp{i}", value
        conn.execute("INSERT INTO alerts VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", bad)
    conn.execute("INSERT INTO counters VALUES ('k', 'x', 'y', 1.0)")
    conn.commit()
    conn.close()
