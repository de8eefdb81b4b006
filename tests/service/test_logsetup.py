"""Logging: structured journal entries when stderr is the journal, text otherwise, no secrets.

The journal test runs the real python-systemd ``journal.send`` in a private mount
namespace where /run/systemd/journal/socket is a datagram socket bound by the test, and
parses what arrives in journald's native protocol.
"""

from __future__ import annotations

import io
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, free_port

from gpuwatchd.configfile.loader import Config, default_config
from gpuwatchd.service import logsetup

STEADY = ROOT / "tests" / "data" / "steady-4gpu.yaml"


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    if logsetup._handler is not None:
        root.removeHandler(logsetup._handler)
        logsetup._handler = None
    root.handlers[:] = handlers
    root.setLevel(level)


def parse_native(data: bytes) -> dict[str, str]:
    """journald's native protocol: KEY=value lines, or KEY\\n<u64 length><bytes>\\n."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data):
        nl = data.index(b"\n", i)
        line = data[i:nl]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            out[key.decode()] = value.decode()
            i = nl + 1
        else:
            (size,) = struct.unpack("<Q", data[nl + 1 : nl + 9])
            out[line.decode()] = data[nl + 9 : nl + 9 + size].decode()
            i = nl + 9 + size + 1
    return out


def test_journal_stream_detection(tmp_path: Path) -> None:
    f = tmp_path / "stderr"
    with f.open("w") as stream:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logsetup.journal_stream_matches(stream.fileno(), env)
        assert logsetup.choose_mode(stream, env) == "journal"
        assert logsetup.choose_mode(stream, {"JOURNAL_STREAM": f"{st.st_dev}:1"}) == "plain"
        assert logsetup.choose_mode(stream, {"JOURNAL_STREAM": "garbage"}) == "plain"
    assert logsetup.choose_mode(io.StringIO(), {}) == "plain"  # no file descriptor


def test_journal_handler_fields_priorities_and_redaction() -> None:
    sent: list[tuple[str, dict[str, Any]]] = []
    logsetup.register_secret("s3cr3t-routing-key")
    logsetup.setup_logging("debug", mode="journal", sender=lambda msg, **kw: sent.append((msg, kw)))
    log = logging.getLogger("gpuwatchd.test")
    log.warning("XID %d on GPU %d", 79, 3, extra={"gpu": 3, "xid": 79, "pci_bus_id": "0:3B"})
    log.error("paging with key s3cr3t-routing-key", extra={"rule": "xid-fatal"})
    log.debug("to https://hooks.slack.com/services/T000/B000/XXXXSECRET")
    log.critical("boom")
    log.info("plain")
    msgs = [m for m, _ in sent]
    assert msgs[0] == "XID 79 on GPU 3"
    assert sent[0][1]["PRIORITY"] == "4" and sent[0][1]["GPU"] == "3" and sent[0][1]["XID"] == "79"
    assert sent[0][1]["PCI_BUS_ID"] == "0:3B" and sent[0][1]["SYSLOG_IDENTIFIER"] == "gpuwatchd"
    assert sent[0][1]["LOGGER"] == "gpuwatchd.test" and sent[0][1]["CODE_FUNC"]
    assert sent[1] == (
        "paging with key <redacted>",
        {**sent[1][1], "PRIORITY": "3", "RULE": "xid-fatal"},
    )
    assert "XXXXSECRET" not in msgs[2] and sent[2][1]["PRIORITY"] == "7"
    assert [kw["PRIORITY"] for _, kw in sent[3:]] == ["2", "6"]
    assert "GPU" not in sent[4][1]


def test_text_modes() -> None:
    out = io.StringIO()
    logsetup.setup_logging("info", stream=out, mode="plain")
    log = logging.getLogger("gpuwatchd.test")
    log.warning("GPU lost", extra={"gpu": 5})
    log.debug("hidden")
    try:
        raise RuntimeError("bearer token follows: Bearer abc.def.ghi")
    except RuntimeError:
        log.exception("failed")
    text = out.getvalue()
    assert " WARNING gpuwatchd.test: GPU lost gpu=5\n" in text
    assert "hidden" not in text
    assert "Traceback" in text and "abc.def.ghi" not in text
    tty = io.StringIO()
    logsetup.setup_logging("info", stream=tty, mode="tty", environ={"TERM": "xterm"})
    log.error("bad", extra={"xid": 79})
    assert "\x1b[31m" in tty.getvalue() and "[xid=79]" in tty.getvalue()
    # the journal stream without python-systemd: <N> prefixes that journald understands
    fmt = logsetup._TextFormatter("%(message)s", None, prefix=True, color=False)
    record = logging.LogRecord("x", logging.WARNING, "f.py", 1, "two\nlines", None, None)
    assert fmt.format(record) == "<4>two\n<4>lines"


def test_config_secrets_are_found() -> None:
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Receiver:
        name: str
        url: str | None = dataclasses.field(default=None, metadata={"secret": True})

    @dataclasses.dataclass(frozen=True)
    class Holder:
        receivers: tuple[Receiver, ...]
        config: Config

    holder = Holder((Receiver("a", "https://x/secret-path"), Receiver("b")), default_config())
    assert logsetup.config_secrets(holder) == ["https://x/secret-path"]


def _in_private_journal(sock_path: Path, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Run argv in a mount namespace whose journal socket is ``sock_path``."""
    script = (
        "set -e\n"
        "mount -t tmpfs tmpfs /run\n"
        "mkdir -p /run/systemd/journal\n"
        "touch /run/systemd/journal/socket\n"
        f"mount --bind '{sock_path}' /run/systemd/journal/socket\n"
        'exec "$@"\n'
    )
    return subprocess.Popen(["unshare", "-m", "sh", "-c", script, "sh", *argv], **kw)


@pytest.fixture
def journal_socket(tmp_path: Path) -> Iterator[tuple[Path, socket.socket]]:
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace (unshare -m)")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"unshare -m not permitted here: {probe.stderr.decode().strip()}")
    path = tmp_path / "journal.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(10)
    yield path, sock
    sock.close()


def test_daemon_logs_structured_entries_to_the_journal(
    tmp_path: Path, journal_socket: tuple[Path, socket.socket]
) -> None:
    path, sock = journal_socket
    child = (
        "import logging, os, sys\n"
        "from gpuwatchd.service.logsetup import setup_logging\n"
        "st = os.fstat(2)\n"
        "os.environ['JOURNAL_STREAM'] = f'{st.st_dev}:{st.st_ino}'\n"
        "print(setup_logging('info'), file=sys.stdout, flush=True)\n"
        "logging.getLogger('gpuwatchd.x').error('XID %d', 79, extra={'gpu': 3, 'xid': 79})\n"
    )
    stderr_file = tmp_path / "stderr"
    with stderr_file.open("wb") as err:
        proc = _in_private_journal(
            path, [sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=err, cwd=ROOT
        )
        out, _ = proc.communicate(timeout=30)
    assert out.decode().strip() == "journal", stderr_file.read_text()
    entry = parse_native(sock.recv(65536))
    assert entry["MESSAGE"] == "XID 79"
    assert entry["PRIORITY"] == "3" and entry["GPU"] == "3" and entry["XID"] == "79"
    assert entry["SYSLOG_IDENTIFIER"] == "gpuwatchd" and entry["LOGGER"] == "gpuwatchd.x"
    assert stderr_file.read_text() == ""  # nothing duplicated on the stream

    # The real daemon: stderr connected to "the journal" (JOURNAL_STREAM names it).
    stderr_file = tmp_path / "daemon-stderr"
    stderr_file.touch()
    st = os.stat(stderr_file)
    env = dict(
        os.environ,
        JOURNAL_STREAM=f"{st.st_dev}:{st.st_ino}",
        PYTHONUNBUFFERED="1",
        STATE_DIRECTORY=str(tmp_path / "state"),
    )
    env.pop("NOTIFY_SOCKET", None)
    argv = [sys.executable, "-m", "gpuwatchd", "run", "--backend", f"scenario:{STEADY}"]
    argv += ["--listen", f"127.0.0.1:{free_port()}"]
    with stderr_file.open("ab") as err:
        proc = _in_private_journal(path, argv, stderr=err, env=env, cwd=ROOT)
    try:
        entries = []
        deadline = time.monotonic() + 20
        while not any(e["MESSAGE"].startswith("serving on") for e in entries):
            assert time.monotonic() < deadline, entries
            entries.append(parse_native(sock.recv(65536)))
        serving = next(e for e in entries if e["MESSAGE"].startswith("serving on"))
        assert serving["PRIORITY"] == "6" and serving["LOGGER"] == "gpuwatchd.service.daemon"
    finally:
        proc.terminate()
        proc.wait(15)
    assert stderr_file.read_text() == ""


# -- redaction: every form of a secret, and nothing but secrets (issue 15 item 15, issue 14) --
def test_percent_encoded_and_decoded_forms_of_a_secret_are_redacted() -> None:
    """Failed on main: a receiver echoing the percent-decoded URL put the token in the log
    (redaction matched the configured string only)."""
    from gpuwatchd.actions.secrets import redact as redact_for_status
    from gpuwatchd.actions.secrets import url_secrets

    url = "https://hooks.example.net/hook?token=T0KEN%2B5ecret%2F77c1"
    for secret in url_secrets(url):
        logsetup.register_secret(secret)
    for echo in ("T0KEN+5ecret/77c1", "T0KEN%2B5ecret%2F77c1", "T0KEN 5ecret/77c1"):
        line = f"receiver said: 404 no route for /hook?token={echo}"
        assert echo not in logsetup.redact(line), echo
        assert echo not in redact_for_status(line, url_secrets(url)), echo


def test_plain_words_of_a_url_are_not_secrets() -> None:
    """Failed on main: every path segment of 8 characters or more of a receiver URL was
    redacted everywhere (``/usr/lib/gpuwatchd/drain<redacted>.sh``)."""
    from gpuwatchd.actions.secrets import url_secrets

    url = "https://alerts.example.net/gpuwatchd/drain-hooks/c2VjcmV0LXBhdGgtMTIz?node=gpu-a17"
    secrets = url_secrets(url)
    assert "c2VjcmV0LXBhdGgtMTIz" in secrets
    assert not {"gpuwatchd", "drain-hooks", "gpu-a17"} & set(secrets)
    for secret in secrets:
        logsetup.register_secret(secret)
    line = "running /usr/lib/gpuwatchd/drain-hooks.sh for gpu-a17"
    assert logsetup.redact(line) == line
    for secret in url_secrets("http://127.0.0.1:8080/hook"):  # no token in it at all
        logsetup.register_secret(secret)
    line = "drain: running /etc/gpuwatchd/drain/hook.sh"
    assert logsetup.redact(line) == line
    assert "c2VjcmV0LXBhdGgtMTIz" not in logsetup.redact(f"posted to {url}")
    assert url_secrets("https://x.example/h?sig=abcd&page=2") == [
        "https://x.example/h?sig=abcd&page=2",
        "/h?sig=abcd&page=2",
        "abcd",
    ]


# -- control characters (issue 26) -------------------------------------------------------------
def test_a_process_name_never_puts_terminal_escapes_into_the_log(tmp_path: Path) -> None:
    """A user's process named ``a, b<ESC>[2J`` (the kernel escapes it in /dev/kmsg as
    ``\\x1b``) hits a real XID 79. Failed on main: the driver's ``name=`` field was cut at
    ``, `` and the rest, escape sequence included, led the XID's message, which the daemon's
    warning quoted raw, so reading the log cleared the screen (ESC, or BEL rang). Now every
    control character a log line quotes is written escaped, and the name stays whole (the
    kernel's comm is at most 15 bytes: ``tests/xid/test_xid_process_name.py``), so the warning
    quotes the driver's message."""
    from fault_support import STEADY, Daemon, KmsgFile, fault_config, wait_until

    kmsg = KmsgFile(tmp_path / "kmsg.dump")
    d = Daemon(tmp_path, fault_config(tmp_path / "state", kmsg.path), STEADY)
    d.start()
    try:
        kmsg.append(
            "NVRM: Xid (PCI:0000:18:00): 79, pid=1234, name=a, b\\x1b[2J\\x07, GPU has fallen "
            "off the bus."
        )
        wait_until(lambda: "XID 79 on GPU 0" in d.output(), 20, "the XID 79 warning")
    finally:
        d.stop()
    out = d.output()
    assert "\x1b" not in out and "\x07" not in out, [
        line for line in out.splitlines() if "\x1b" in line or "\x07" in line
    ]
    assert "via kmsg: GPU has fallen off the bus." in out


def test_quoted_text_cannot_start_a_log_line_of_its_own() -> None:
    stream = io.StringIO()
    logsetup.setup_logging("info", stream=stream, mode="plain")
    try:
        logging.getLogger("t").warning(
            "name %s, %d", "x\n2026-01-01 00:00:00 ERROR forged\x1b]0;t\x07", 7
        )
    finally:
        logsetup.setup_logging("info", stream=io.StringIO(), mode="plain")
    text = stream.getvalue()
    assert text.count("\n") == 1 and "\x1b" not in text and "\x07" not in text
    assert "x\\n2026-01-01 00:00:00 ERROR forged\\x1b]0;t\\x07, 7" in text
