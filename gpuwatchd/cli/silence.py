"""``gpuwatchd silence add|list|expire``: maintenance silences per node or GPU.

Silences live in ``<state_dir>/silences.json`` (see ``actions/silences.py``); the running
daemon picks up a change within a second, with no restart and no connection to it.

    gpuwatchd silence add --gpu 3 --for 2h --reason "RMA ticket 1234"
    gpuwatchd silence list [--all] [--json]
    gpuwatchd silence expire ID
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from datetime import UTC, datetime

from gpuwatchd.config.paths import default_config_path
from gpuwatchd.configfile.loader import Config, load_config
from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.health import EXIT_USAGE
from gpuwatchd.core.units import duration_or_seconds


def _config(args: argparse.Namespace) -> Config:
    return load_config(args.config or default_config_path(), must_exist=args.config is not None)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _path(args: argparse.Namespace) -> tuple[str, Config]:
    from gpuwatchd.actions.silences import path_in

    config = _config(args)
    return path_in(config.state_dir), config


def cmd_add(args: argparse.Namespace) -> int:
    from gpuwatchd.actions.silences import add_silence, normalize_gpu

    duration = duration_or_seconds(args.duration)
    if duration is None or duration <= 0:
        print(
            f"gpuwatchd silence add: --for: {args.duration!r} is not a positive duration "
            "of at most ten years (e.g. 30m, 2h, 1d)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    gpu = None
    if args.gpu is not None:
        gpu = normalize_gpu(args.gpu)
        if gpu is None:
            print(
                f"gpuwatchd silence add: --gpu: {args.gpu!r} is not a GPU index, UUID or PCI "
                "bus id",
                file=sys.stderr,
            )
            return EXIT_USAGE
    if not args.reason.strip():
        print("gpuwatchd silence add: --reason must say why", file=sys.stderr)
        return EXIT_USAGE
    try:
        path, config = _path(args)
        silence = add_silence(
            path,
            node=args.node or config.node_name,
            gpu=gpu,
            rule=args.rule,
            duration=duration,
            reason=args.reason.strip(),
            author=args.author or getpass.getuser(),
            now=time.time(),
        )
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuwatchd silence add: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(silence.as_dict(time.time()), sort_keys=True))
    else:
        what = f"GPU {silence.gpu}" if silence.gpu else "the whole node"
        rule = f", rule {silence.rule}" if silence.rule else ""
        print(
            f"{silence.id}  silenced {what} on {silence.node}{rule} until {_when(silence.ends_at)}"
        )
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from gpuwatchd.actions.silences import read_silences

    try:
        path, _ = _path(args)
        items = read_silences(path)
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"gpuwatchd silence list: {exc}", file=sys.stderr)
        return 1
    now = time.time()
    shown = [s for s in items if args.all or s.active(now) or s.starts_at > now]
    if args.json:
        print(json.dumps([s.as_dict(now) for s in shown], indent=2, sort_keys=True))
        return 0
    if not shown:
        print("no silences" if args.all else "no active silences")
        return 0
    print(f"{'ID':<9} {'STATE':<8} {'NODE':<16} {'GPU':<16} {'RULE':<20} {'ENDS':<21} REASON")
    for s in shown:
        state = "active" if s.active(now) else ("future" if s.starts_at > now else "expired")
        print(
            f"{s.id:<9} {state:<8} {s.node:<16} {s.gpu or '*':<16} {s.rule or '*':<20} "
            f"{_when(s.end):<21} {s.reason} ({s.author})"
        )
    return 0


def cmd_expire(args: argparse.Namespace) -> int:
    from gpuwatchd.actions.silences import expire_silence

    try:
        path, _ = _path(args)
        silence = expire_silence(path, args.id, time.time())
    except ConfigError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"gpuwatchd silence expire: {exc}", file=sys.stderr)
        return 1
    if silence is None:
        print(
            f"gpuwatchd silence expire: no silence {args.id!r} (or the prefix is ambiguous)",
            file=sys.stderr,
        )
        return 1
    print(f"{silence.id}  expired at {_when(silence.end)}")
    return 0


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    top = subparsers.add_parser(
        "silence",
        help="maintenance silences per node or GPU (mute pages and drains)",
        description="Add, list and expire maintenance silences. A silence mutes "
        "notifications and drains for a node, or one GPU of it, until it ends. The running "
        "daemon reads them from its state directory; no restart needed.",
    )
    sub = top.add_subparsers(dest="silence_command", metavar="SILENCE_COMMAND", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help=f"config file, for state_dir and node_name (default {default_config_path()})",
        )
        p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("add", help="silence a node or one GPU for a while")
    common(p)
    p.add_argument(
        "--gpu",
        metavar="GPU",
        help="GPU index, UUID (GPU-...) or PCI bus id; default: the whole node",
    )
    p.add_argument("--node", metavar="NAME", help="node name (default: the config's node_name)")
    p.add_argument("--rule", metavar="RULE", help="only this rule (default: every rule)")
    p.add_argument(
        "--for",
        dest="duration",
        required=True,
        metavar="DURATION",
        help="how long: 30m, 2h, 1d, ...",
    )
    p.add_argument("--reason", required=True, help="why (shown in status and list)")
    p.add_argument("--author", help="who (default: the user running the command)")
    p.set_defaults(func=cmd_add)

    p = sub.add_parser("list", help="list active silences")
    common(p)
    p.add_argument("--all", action="store_true", help="also expired silences")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("expire", help="end a silence now")
    common(p)
    p.add_argument("id", metavar="ID", help="silence id (or a unique prefix)")
    p.set_defaults(func=cmd_expire)
    return top
