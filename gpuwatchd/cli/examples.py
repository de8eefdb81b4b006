"""The ``examples:`` section of every command's ``--help``, in one table.

``attach(parser)`` gives each command (every leaf of the parser tree, ``xid parse`` as
much as ``run``) the examples listed here, unless it brought its own epilog (``check``).
Every example line is a real invocation: tests/cli/test_cli_output.py parses each one with
the command's parser.
"""

from __future__ import annotations

import argparse

EXAMPLES: dict[str, tuple[tuple[str, str], ...]] = {
    "run": (
        ("gpuwatchd run", "the daemon, as systemd starts it (/etc/gpuwatchd/gpuwatchd.yaml)"),
        (
            "gpuwatchd run --backend scenario:thermal.yaml --listen 127.0.0.1:9900",
            "a scripted node at real speed, for a dashboard or an alerting test",
        ),
    ),
    "simulate": (
        ("gpuwatchd simulate demo", "the bundled demo scenario, as fast as it runs"),
        (
            "gpuwatchd simulate scenarios/ecc-leak.yaml -c site.yaml --metrics-out m.txt",
            "with site rules; keep the final /metrics",
        ),
    ),
    "demo": (
        ("gpuwatchd demo", "a fault handled end to end, in about a minute"),
        ("gpuwatchd demo --seconds 20 --forever", "faster, then keep serving /metrics"),
    ),
    "check-config": (
        (
            "gpuwatchd check-config -c /etc/gpuwatchd/gpuwatchd.yaml",
            "exit 1 with PATH:LINE:COL lines on an error",
        ),
        ("gpuwatchd check-config --print", "the effective config, defaults filled in"),
        ("gpuwatchd check-config site-rules.yaml", "also check a rule file not yet installed"),
    ),
    "status": (
        ("gpuwatchd status", "per-GPU health from the running daemon (exit 1: unhealthy)"),
        ("gpuwatchd status --json", "the raw status API document"),
        ("gpuwatchd status --healthz", "the daemon's own health: a probe command"),
    ),
    "xid parse": (
        ("dmesg | gpuwatchd xid parse", "XIDs in the kernel log, one JSON object each"),
        ("gpuwatchd xid parse /var/log/kern.log", "from a saved log file"),
    ),
    "xid explain": (
        ("gpuwatchd xid explain 79", "what XID 79 means and what to do"),
        ("gpuwatchd xid explain 48 --json", "the catalog entry as JSON"),
    ),
    "xid scan": (
        (
            "gpuwatchd xid scan --journal /srv/postmortem/node17/journal",
            "journal files copied from a node, with the daemon's trust rules",
        ),
        ("gpuwatchd xid scan --kmsg kmsg.dump", "a saved /dev/kmsg dump"),
    ),
    "drain-helper serve": (
        (
            "gpuwatchd drain-helper serve --mode slurm --fd 3",
            "as gpuwatchd-drain@.service runs it (socket activation)",
        ),
        (
            "gpuwatchd drain-helper serve --mode dry-run --fd 3",
            "log the requests, drain nothing",
        ),
    ),
    "drain-helper request": (
        (
            "gpuwatchd drain-helper request --action drain --reason 'gpuwatchd: XID 79 GPU 3'",
            "what the daemon's exec drain mode runs",
        ),
        ("gpuwatchd drain-helper request --action resume", "resume gpuwatchd's own drain"),
    ),
    "silence add": (
        (
            "gpuwatchd silence add --gpu 3 --for 2h --reason 'reseat GPU 3'",
            "mute GPU 3's pages and drains during maintenance",
        ),
        (
            "gpuwatchd silence add --rule GpuThermalSlowdown --for 1d --reason 'chiller work'",
            "one rule on the whole node",
        ),
    ),
    "silence list": (
        ("gpuwatchd silence list", "the active silences"),
        ("gpuwatchd silence list --all --json", "expired ones too, as JSON"),
    ),
    "silence expire": (("gpuwatchd silence expire 3f2a", "end a silence early (an id prefix)"),),
    "fleet status": (
        (
            "gpuwatchd fleet status",
            "budget, gpuwatchd's drains, claims, and whether draining is on",
        ),
        ("gpuwatchd fleet status --json", "the same as JSON"),
    ),
    "fleet pause": (("gpuwatchd fleet pause", "stop gpuwatchd's drains on every node"),),
    "fleet reset": (("gpuwatchd fleet reset", "drain again after a pause or a tripped breaker"),),
    "rules test": (
        ("gpuwatchd rules test rules/tests/*.yaml", "the shipped rules' unit tests"),
        ("gpuwatchd rules test site-tests.yaml", "your own rules against inline series"),
    ),
    "rules fmt": (
        ("gpuwatchd rules fmt --check /etc/gpuwatchd/rules.d/*.yaml", "exit 1 if not canonical"),
        ("gpuwatchd rules fmt --write site.yaml", "rewrite a file in canonical form"),
    ),
    "rules list": (
        ("gpuwatchd rules list", "every loaded rule: name, severity, condition"),
        ("gpuwatchd rules list -c /etc/gpuwatchd/gpuwatchd.yaml", "as the daemon loads them"),
    ),
    "backtest": (
        ("gpuwatchd backtest", "every labelled family: detection, lead time, false pages"),
        ("gpuwatchd backtest --family trickle --files 2 --json", "one family, quickly"),
    ),
}


def epilog(lines: tuple[tuple[str, str], ...]) -> str:
    out = ["examples:"]
    for command, what in lines:
        out.append(f"  {command}")
        out.append(f"      {what}")
    return "\n".join(out)


class ExamplesFormatter(argparse.HelpFormatter):
    """Wraps the description as usual; prints an ``examples:`` epilog line by line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


def leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command of the tree (``xid parse``, ``run``), with its parser."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(" ".join(path), parser)]
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in subs:
        for name, sub in action.choices.items():
            out.extend(leaves(sub, (*path, name)))
    return out


def attach(parser: argparse.ArgumentParser) -> None:
    for name, sub in leaves(parser):
        lines = EXAMPLES.get(name)
        if lines is None or sub.epilog:
            continue
        sub.epilog = epilog(lines)
        if sub.formatter_class is argparse.HelpFormatter:
            sub.formatter_class = ExamplesFormatter
