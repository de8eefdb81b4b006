"""Links, FIFOs, devices and huge files in the state directory (issue 15 item 3, and the
root-owned silence lock of issue 14 item 6).

Each test failed on main: the silence lock was followed as a link and created by root
wherever it pointed; ``silences.json`` -> /dev/zero was read until memory ran out; a FIFO
as ``silences.json`` or ``actions.db`` blocked its reader for ever; a lock file that root
created could not be opened by the service user."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from state_support import SERVICE_UID, as_user, bad_rule_rows, within

from gpuwatchd.actions.silences import SilenceView, add_silence, path_in, read_silences
from gpuwatchd.actions.store import Store
from gpuwatchd.core.statefile import UnsafeStateFile, open_state_file, read_state_file
from gpuwatchd.sources.kernel.cursor import PositionFile


def add(state: Path) -> Any:
    return add_silence(
        path_in(str(state)),
        node="n1",
        gpu=None,
        rule=None,
        duration=60,
        reason="maintenance",
        author="op",
        now=1000.0,
    )


def test_a_linked_lock_is_never_followed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    target = tmp_path / "etc-something"
    (state / "silences.json.lock").symlink_to(target)
    with pytest.raises(UnsafeStateFile, match="symbolic link"):
        add(state)
    assert not target.exists()
    assert not (state / "silences.json").exists()


def test_silences_linked_to_dev_zero_or_too_large_are_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    path = state / "silences.json"
    path.symlink_to("/dev/zero")
    with pytest.raises(UnsafeStateFile, match="symbolic link"):
        within(5, lambda: read_silences(str(path)))
    path.unlink()
    path.write_text(json.dumps({"silences": [], "pad": "x" * (5 * 1024 * 1024)}))
    with pytest.raises(UnsafeStateFile, match="larger than"):
        read_silences(str(path))
    with pytest.raises(UnsafeStateFile, match="device"):
        read_state_file("/dev/zero", 10)


def test_a_fifo_never_blocks_a_reader(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    os.mkfifo(state / "silences.json")
    view = SilenceView(path_in(str(state)))
    assert within(5, view.refresh) is False
    assert view.error is not None and "FIFO" in view.error
    with pytest.raises(UnsafeStateFile, match="FIFO"):
        within(5, lambda: add(state))
    os.mkfifo(state / "position.json")
    assert within(5, PositionFile(str(state / "position.json")).load) is None


def test_a_fifo_or_link_as_actions_db_is_not_opened(tmp_path: Path) -> None:
    def link_to_zero(path: Path) -> None:
        path.symlink_to("/dev/zero")

    for i, make in enumerate((os.mkfifo, link_to_zero)):
        state = tmp_path / f"s{i}"
        state.mkdir()
        make(state / "actions.db")
        db = str(state / "actions.db")
        store = within(10, functools.partial(Store, db))
        # moved aside unopened, as the rule store does (issue 24 item 4: one failure
        # model); before, the outbox ran in memory, lost at the next restart
        assert store.durable and store.set_aside == 1
        assert [p.name for p in state.iterdir() if ".unsafe-" in p.name]
        store.close()
    state = tmp_path / "wal"
    state.mkdir()
    os.mkfifo(state / "actions.db-wal")
    store = within(10, lambda: Store(str(state / "actions.db")))
    assert store.durable and store.set_aside == 1
    store.close()


def test_open_state_file_refuses_everything_but_regular_files(tmp_path: Path) -> None:
    (tmp_path / "dir").mkdir()
    with pytest.raises(UnsafeStateFile, match="directory"):
        open_state_file(str(tmp_path / "dir"))
    with pytest.raises(FileNotFoundError):
        open_state_file(str(tmp_path / "absent"))
    fd = open_state_file(str(tmp_path / "new"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    assert read_state_file(str(tmp_path / "new"), 1) == b"x"


def test_a_lock_left_by_root_is_usable_by_the_service_user(
    request: pytest.FixtureRequest,
) -> None:
    """``silence add`` as root leaves ``silences.json.lock`` (0644, root's); the service
    user must still be able to add silences."""
    # pytest's own temporary directories are private to root; this one must be reachable
    state = Path(tempfile.mkdtemp(prefix="gpuwatchd-test-state-"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    add(state)  # the administrator, first
    lock = state / "silences.json.lock"
    assert lock.stat().st_mode & 0o777 == 0o644
    if os.geteuid() == 0:
        os.chown(state, SERVICE_UID, SERVICE_UID)  # the service user's state directory
        user: int | None = SERVICE_UID
    else:
        lock.chmod(0o444)  # a lock this user may not write: what root's is to the service
        user = None

    def as_service() -> int:
        try:
            add(state)
            return 0 if len(read_silences(path_in(str(state)))) == 2 else 2
        except OSError:
            return 1

    assert as_user(user, as_service) == 0


# The service user's side of the race (issue 26 item 1): every temporary file that appears
# in its state directory is replaced, at once, by a link to a file root keeps private.
# Whatever root then does to that name by path lands on the private file.
_RACER = r"""
import os, sys, time
state, target, deadline = sys.argv[1], sys.argv[2], time.monotonic() + float(sys.argv[3])
swaps = 0
stop = os.path.join(state, "stop-racing")
while time.monotonic() < deadline and not os.path.exists(stop):
    for entry in os.scandir(state):
        if entry.name.startswith(".silences.json.") and not entry.is_symlink():
            link = os.path.join(state, "link-" + str(swaps))
            try:
                os.symlink(target, link)
                os.replace(link, entry.path)
                swaps += 1
            except OSError:
                try:
                    os.unlink(link)
                except OSError:
                    pass
print(swaps)
"""


def test_root_silence_add_never_changes_a_file_through_a_swapped_link(
    request: pytest.FixtureRequest,
) -> None:
    """Root's ``silence add`` in the service user's state directory, while that user (a
    real second uid) swaps each temporary file for a link to a root-private file, about as
    fast as the machine allows. On main the temporary file was ``chmod``-ed by path after
    its write: the private file became 0644 (world-readable) within a few adds. Now its
    mode is set with ``fchmod`` on the descriptor the file was created with (``O_EXCL``,
    ``O_NOFOLLOW``, through the directory's descriptor), so no swap reaches the target."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the race is between root and a second user")
    base = Path(tempfile.mkdtemp(prefix="gpuwatchd-test-race-"))
    request.addfinalizer(lambda: shutil.rmtree(base, ignore_errors=True))
    base.chmod(0o755)
    secret = base / "shadow"
    secret.write_text("root:$6$secret:19000:0:99999:7:::\n")
    secret.chmod(0o600)
    state = base / "state"
    state.mkdir()
    os.chown(state, SERVICE_UID, SERVICE_UID)  # the service user's state directory
    racer = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={SERVICE_UID}",
            f"--regid={SERVICE_UID}",
            "--clear-groups",
            sys.executable,
            "-c",
            _RACER,
            str(state),
            str(secret),
            "60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    adds = refused = 0
    try:
        deadline = time.monotonic() + 20.0
        while adds < 3000 and time.monotonic() < deadline:
            adds += 1
            try:
                add_silence(
                    path_in(str(state)),
                    node="n1",
                    gpu=None,
                    rule=None,
                    duration=60,
                    reason="maintenance",
                    author="root",
                    now=adds * 1e7,  # every earlier silence long over: the file stays small
                )
            except OSError:  # the swapped link became silences.json: refused, as it must
                refused += 1
                with contextlib.suppress(FileNotFoundError):
                    (state / "silences.json").unlink()
            assert secret.stat().st_mode & 0o777 == 0o600, f"after {adds} adds"
    finally:
        (state / "stop-racing").touch()
        out, _ = racer.communicate(timeout=30)
    swaps = int(out.strip() or 0)
    print(f"RELIABILITY silence race: {adds} adds, {swaps} swaps, {refused} refused")
    assert swaps > 0, "the racer never caught a temporary file: the test proved nothing"
    assert secret.stat().st_mode & 0o777 == 0o600
    assert secret.stat().st_uid == 0
    assert secret.read_text().startswith("root:$6$secret")


def test_a_fifo_put_under_the_running_outbox_never_wedges_it(tmp_path: Path) -> None:
    """Issue 26 item 5: ``actions.db`` (then its ``-wal``) replaced by a FIFO while the
    outbox runs. Failed on main: the next check of the file opened the FIFO through SQLite
    and waited for ever with the outbox's lock held (no page sent, SIGTERM's flush stuck).
    Now the FIFO is seen for what it is, moved aside, and the outbox is back on disk with
    everything it held."""
    db = tmp_path / "actions.db"
    store = Store(str(db))
    with store.tx() as conn:
        Store.next_counter(conn, "pages")
    assert store.durable
    db.unlink()
    os.mkfifo(db)
    within(10, store.maintain)  # notices the swap, writes itself back
    assert store.durable and db.is_file() and not db.is_symlink()
    assert any(".corrupt-" in p.name for p in tmp_path.iterdir())  # the FIFO, moved aside
    with store.tx() as conn:
        assert Store.next_counter(conn, "pages") == 2  # nothing lost
    wal = tmp_path / "actions.db-wal"
    wal.unlink(missing_ok=True)
    os.mkfifo(wal)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and stat_is_fifo(wal):
        within(10, store.maintain)  # the periodic check (every 5 s) meets the FIFO
        time.sleep(0.2)
    assert not stat_is_fifo(wal), "the FIFO -wal was never noticed"
    with store.tx() as conn:
        assert Store.next_counter(conn, "pages") == 3
    assert store.durable
    store.close()


def stat_is_fifo(path: Path) -> bool:
    import stat

    try:
        return stat.S_ISFIFO(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


# -- the rule state store at start-up (issue 26 item 5) ---------------------------------------
@pytest.mark.parametrize(
    "where", ["", "-wal"], ids=["rules.sqlite3", "rules.sqlite3-wal"]
)  # fmt: skip
@pytest.mark.parametrize("what", ["symlink", "fifo", "directory"])
def test_rule_state_files_of_the_wrong_type_are_moved_aside(
    tmp_path: Path, where: str, what: str
) -> None:
    """Failed on main: ``UnsafeStateFile`` out of the store, every start exited 1 (a crash
    loop under systemd). Now the file is renamed aside unopened, counted, and the store
    runs on a fresh database."""
    from gpuwatchd.rules.store import StateStore

    db = tmp_path / "rules.sqlite3"
    if where:
        StateStore(str(db), boot_id="b").close()
    target = Path(str(db) + where)
    target.unlink(missing_ok=True)
    if what == "symlink":
        target.symlink_to("/etc/hostname")
    elif what == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    store = within(10, lambda: StateStore(str(db), boot_id="b"))
    assert store.set_aside == 1 and not store.memory
    assert store.save_alerts([], 1.0) and store.load_alerts() == []
    aside = [p for p in tmp_path.iterdir() if ".unsafe-" in p.name]
    assert len(aside) == 1 and aside[0].name.startswith(target.name + ".unsafe-")
    store.close()


def test_the_daemon_starts_on_broken_rule_state(tmp_path: Path) -> None:
    """The real daemon, twice: a FIFO as ``rules.sqlite3-wal`` next to a database whose
    saved alerts hold JSON of the wrong shape (a list for labels, a string for
    annotations, text for a time) and a counter of text; then a directory as
    ``rules.sqlite3``. Failed on main: ``run`` exited 1 both times."""
    from conftest import ROOT
    from fault_support import Daemon, metric

    state = tmp_path / "state"
    state.mkdir()
    db = state / "rules.sqlite3"
    bad_rule_rows(db)
    os.mkfifo(str(db) + "-wal")
    config = f"state_dir: {state}\nsources: {{kernel_log: none}}\n"
    steady = ROOT / "tests" / "data" / "steady-4gpu.yaml"
    for run, expected in enumerate((5, 1)):  # the -wal and 4 rows; then the directory
        if run == 1:
            shutil.rmtree(state)
            state.mkdir()
            db.mkdir()
            (db / "something").write_text("x")
        d = Daemon(tmp_path, config, steady, name=f"daemon{run}")
        try:
            d.start()
            text = d.metrics()
            assert metric(text, "gpuwatchd_state_set_aside_total", store="rules") == expected
            assert metric(text, "gpuwatchd_state_durable", store="rules") == 1
            assert "moved aside" in d.output() or "skipping unreadable" in d.output()
        finally:
            assert d.stop() == 0, d.output()


def test_what_a_wal_holds_survives_a_start_that_cannot_write(
    request: pytest.FixtureRequest,
) -> None:
    """Issue 26 item 5: the daemon stopped with changes still in ``actions.db-wal`` (no
    checkpoint, its ``-shm`` gone), and starts as the service user in a directory it
    cannot write. SQLite cannot read that WAL in place (it would need a ``-shm``), so on
    main the in-memory outbox started from the database alone: what the WAL held (pending
    deliveries, drain ownership) was lost. Now the database and its WAL are copied
    somewhere private and the WAL replayed there."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the start runs as a second user")
    state = Path(tempfile.mkdtemp(prefix="gpuwatchd-test-wal-"))
    request.addfinalizer(lambda: shutil.rmtree(state, ignore_errors=True))
    state.chmod(0o755)  # root's: the service user may read, not write
    live = state / "live"
    live.mkdir()
    store = Store(str(live / "actions.db"))
    store.conn.execute("PRAGMA wal_autocheckpoint=0")  # everything stays in the WAL
    for _ in range(3):
        with store.tx() as conn:
            Store.next_counter(conn, "pending")
    crashed = state / "crashed"
    crashed.mkdir(mode=0o755)
    for suffix in ("", "-wal"):  # as a crash leaves them; the -shm is not kept
        shutil.copy(str(live / "actions.db") + suffix, str(crashed / "actions.db") + suffix)
        os.chmod(str(crashed / "actions.db") + suffix, 0o644)
    store.close()
    assert os.path.getsize(crashed / "actions.db-wal") > 0

    def start() -> int:
        outbox = Store(str(crashed / "actions.db"))
        row = outbox.conn.execute("SELECT value FROM meta WHERE key='pending'").fetchone()
        return 0 if row is not None and row[0] == "3" else 1

    assert as_user(SERVICE_UID, start) == 0
