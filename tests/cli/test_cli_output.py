"""What a person reads: `gpuwatchd --help` examples and the demo's colours (issue 14 item 5)."""

from __future__ import annotations

import argparse
import io
import os
import pty
import shlex
import subprocess

from conftest import GPUWATCHD, ROOT

from gpuwatchd.cli.examples import leaves
from gpuwatchd.cli.main import HELP_EXAMPLES, build_parser
from gpuwatchd.harness.demo import wants_color


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_help_shows_examples_that_parse() -> None:
    parser = build_parser()
    assert "examples:" in parser.format_help()
    commands = [
        line.strip().split("  ")[0]
        for line in HELP_EXAMPLES.splitlines()
        if line.startswith("  gpuwatchd ") and "COMMAND" not in line
    ]
    assert len(commands) >= 5
    for command in commands:
        for part in command.split("|")[-1].split("&&"):
            argv = shlex.split(part)
            if argv[0] != "gpuwatchd":
                continue
            args = parser.parse_args(argv[1:])  # exits (SystemExit) on a wrong example
            assert isinstance(args, argparse.Namespace)


def test_every_command_has_help_examples_that_parse() -> None:
    """Issue 23 item 8: not only `check`: every command's --help ends with examples, and
    each example is a real invocation of that command."""
    parser = build_parser()
    commands = leaves(parser)
    assert len(commands) >= 18
    for name, sub in commands:
        text = sub.format_help()
        assert "\nexamples:\n" in text, f"gpuwatchd {name} --help has no examples"
        examples = [
            line.strip()
            for line in text.split("\nexamples:\n", 1)[1].splitlines()
            if line.startswith("  gpuwatchd ") or line.startswith("  dmesg |")
        ]
        assert examples, name
        for example in examples:
            argv = shlex.split(example.split("|")[-1], comments=True)
            assert argv[: 1 + name.count(" ") + 1] == ["gpuwatchd", *name.split()], example
            args = parser.parse_args(argv[1:])  # exits (SystemExit) on a wrong example
            assert isinstance(args, argparse.Namespace)


def test_demo_colours_only_a_terminal_without_no_color() -> None:
    assert wants_color(Tty(), {})
    assert not wants_color(Tty(), {"NO_COLOR": "1"})
    assert wants_color(Tty(), {"NO_COLOR": ""})  # no-color.org: set and not empty
    assert not wants_color(io.StringIO(), {})
    assert not wants_color(Tty(), {"TERM": "dumb"})  # issue 23 item 8


def test_term_dumb_gets_no_escape_sequence_from_the_demo() -> None:
    """The whole demo on a real terminal (a pty) whose TERM is dumb: not one escape
    sequence, from the narrator or from the log lines. Before: 128 of them."""
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "dumb"
    proc = subprocess.Popen(
        [*GPUWATCHD, "demo", "--seconds", "2", "--listen", "127.0.0.1:0", "-v"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
    )
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the demo closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
        assert proc.wait(120) == 0
    out = b"".join(chunks)
    assert b"Summary" in out, out[-2000:]
    assert b"\x1b" not in out, out[out.index(b"\x1b") - 200 :][:400]
