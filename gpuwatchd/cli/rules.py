"""``gpuwatchd rules``: test, format and list alert rules.

- ``gpuwatchd rules test FILE...``: run rule unit tests (docs/rules.md, "Testing rules");
  exit 1 with a readable diff when an expectation fails.
- ``gpuwatchd rules fmt [--check | --write] FILE...``: the canonical form of rule files.
- ``gpuwatchd rules list [-c CONFIG]``: the rules the daemon would load.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import Any

from gpuwatchd.core.errors import ConfigError


def cmd_test(args: argparse.Namespace) -> int:
    import logging

    from gpuwatchd.harness.ruletest import run_files

    logging.basicConfig(level=logging.ERROR)  # the scenario's own warnings are not results
    return run_files(args.files, sys.stdout)


def cmd_fmt(args: argparse.Namespace) -> int:
    from gpuwatchd.rules.canonical import canonical_text
    from gpuwatchd.rules.loader import parse_rules

    status = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            parse_rules(text, path)  # only valid rule files are formatted
            canonical = canonical_text(text, path)
        except OSError as exc:
            print(f"{path}:1:1: cannot read file: {exc.strerror}", file=sys.stderr)
            status = 1
            continue
        except ConfigError as exc:
            for line in exc.lines():
                print(line, file=sys.stderr)
            status = 1
            continue
        if args.write:
            if canonical != text:
                with open(path, "w", encoding="utf-8") as fh:
                    fh.write(canonical)
                print(f"{path}: rewritten")
        elif args.check:
            if canonical != text:
                diff = difflib.unified_diff(
                    text.splitlines(True), canonical.splitlines(True), path, f"{path} (canonical)"
                )
                sys.stdout.writelines(diff)
                status = 1
        else:
            sys.stdout.write(canonical)
    return status


def cmd_list(args: argparse.Namespace) -> int:
    from gpuwatchd.config.paths import default_config_path
    from gpuwatchd.configfile.loader import load_config
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules.loader import rules_from_settings

    try:
        config = load_config(
            args.config or default_config_path(), must_exist=args.config is not None
        )
        rules = rules_from_settings(for_rules(config))
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return 1
    for rule in rules.rules:
        extra = " drain" if rule.drain else ""
        print(f"{rule.name:32} {rule.severity.value:7} {rule.kind:17}{extra}  {rule.loc}")
    return 0


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("rules", help="test, format and list alert rules")
    sub = p.add_subparsers(dest="rules_command", metavar="COMMAND", required=True)

    t = sub.add_parser("test", help="run rule unit tests (like promtool test rules)")
    t.add_argument("files", nargs="+", metavar="FILE", help="rule test files")
    t.set_defaults(func=cmd_test)

    f = sub.add_parser("fmt", help="print (or check, or write) rule files in canonical form")
    group = f.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 and show a diff if not")
    group.add_argument("--write", action="store_true", help="rewrite the files in place")
    f.add_argument("files", nargs="+", metavar="FILE", help="rule files")
    f.set_defaults(func=cmd_fmt)

    ls = sub.add_parser("list", help="list the rules the daemon would load")
    ls.add_argument("-c", "--config", metavar="FILE", help="config file")
    ls.set_defaults(func=cmd_list)
