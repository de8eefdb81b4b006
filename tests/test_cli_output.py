"""What a person reads: `gpuwatchd --help` examples and the demo's colours (issue 14 item 5)."""

from __future__ import annotations

import argparse
import io
import shlex

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


def test_demo_colours_only_a_terminal_without_no_color() -> None:
    assert wants_color(Tty(), {})
    assert not wants_color(Tty(), {"NO_COLOR": "1"})
    assert wants_color(Tty(), {"NO_COLOR": ""})  # no-color.org: set and not empty
    assert not wants_color(io.StringIO(), {})
