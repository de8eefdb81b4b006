"""The ``gpuwatchd`` command line. Each subcommand's handler returns an exit status."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from types import FrameType

from . import __version__
from .clock import SystemClock
from .config import DEFAULT_CONFIG_PATH, BackendSpec, Config, ListenAddress, load_config
from .errors import BackendUnavailable, ConfigError

log = logging.getLogger("gpuwatchd")

# Modules that add subcommands: each has ``add_parser(subparsers)`` and sets ``func``.
COMMAND_MODULES: tuple[str, ...] = ("cli_xid",)


def _load(args: argparse.Namespace) -> Config:
    path = args.config or DEFAULT_CONFIG_PATH
    return load_config(path, must_exist=args.config is not None)


def _setup_logging(level: str, verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _config_errors(exc: ConfigError) -> int:
    for line in exc.lines():
        print(line, file=sys.stderr)
    return 1


# -- run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from .backend import open_backend
    from .daemon import Daemon

    try:
        config = _load(args)
        if args.backend:
            try:
                spec = BackendSpec.parse(args.backend)
            except ValueError as exc:
                print(f"gpuwatchd run: --backend: {exc}", file=sys.stderr)
                return 2
            config = _replace(config, backend=spec)
        if args.listen:
            config = _replace(config, listen=_parse_listen(args.listen))
        _setup_logging(config.log_level, args.verbose)
        clock = SystemClock()
        backend = open_backend(str(config.backend), clock)
    except ConfigError as exc:
        return _config_errors(exc)
    except BackendUnavailable as exc:
        print(f"gpuwatchd run: {exc}", file=sys.stderr)
        return 1
    daemon = Daemon(config, backend, clock)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        daemon.start()
    except OSError as exc:
        print(
            f"gpuwatchd run: cannot listen on {config.listen}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 1
    try:
        while not stop.wait(1.0):
            pass
    finally:
        daemon.stop()
    return 0


def _replace(config: Config, **changes: object) -> Config:
    import dataclasses

    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def _parse_listen(text: str) -> ListenAddress:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"gpuwatchd: --listen: {text!r} is not HOST:PORT")
    return ListenAddress(host.strip("[]"), int(port))


# -- simulate / demo ---------------------------------------------------------------------
def _scenario_path(text: str) -> str:
    import os

    from .scenario import bundled_scenario_path, bundled_scenarios

    if os.path.exists(text) or "/" in text or text.endswith(".yaml"):
        return text
    if text in bundled_scenarios():
        return bundled_scenario_path(text)
    return text


def cmd_simulate(args: argparse.Namespace) -> int:
    from .scenario import load_scenario
    from .simulate import run_simulation

    try:
        config = _load(args)
        scenario = load_scenario(_scenario_path(args.scenario))
    except ConfigError as exc:
        return _config_errors(exc)
    _setup_logging("error")
    return run_simulation(
        scenario, config, sys.stdout, include_samples=args.samples, metrics_out=args.metrics_out
    )


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo
    from .scenario import bundled_scenario_path, load_scenario

    try:
        config = _load(args)
        scenario = load_scenario(
            _scenario_path(args.scenario) if args.scenario else bundled_scenario_path("demo")
        )
    except ConfigError as exc:
        return _config_errors(exc)
    _setup_logging("error", args.verbose)
    listen = _parse_listen(args.listen) if args.listen else None
    return run_demo(scenario, config, seconds=args.seconds, forever=args.forever, listen=listen)


# -- check-config / status ---------------------------------------------------------------
def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        config = _load(args)
    except ConfigError as exc:
        return _config_errors(exc)
    where = config.source or "built-in defaults (no config file)"
    if args.print:
        import yaml

        sys.stdout.write(yaml.safe_dump(config.as_dict(), sort_keys=False))
    else:
        print(f"{where}: OK")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    if args.url:
        base = args.url.rstrip("/")
    else:
        try:
            config = _load(args)
        except ConfigError as exc:
            return _config_errors(exc)
        host = config.listen.host
        host = f"[{host}]" if ":" in host else host
        base = f"http://{host}:{config.listen.port}"
    try:
        with urllib.request.urlopen(f"{base}/api/v1/status", timeout=args.timeout) as resp:
            status = json.load(resp)
    except (urllib.error.URLError, OSError) as exc:
        print(f"gpuwatchd status: cannot reach the daemon at {base}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(status, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return 0
    print(f"node {status['node']}  gpuwatchd {status['version']}  backend {status['backend']}")
    for g in status["gpus"]:
        r = g.get("readings", {})
        temp = r.get("temperature_gpu")
        reasons = ",".join(g.get("clock_event_reasons", [])) or "-"
        print(
            f"  GPU {g['index']} {g['pci_bus_id']} {g['status']:<6} "
            f"temp={'-' if temp is None else f'{temp:.0f}C'} "
            f"ecc_corr={r.get('ecc_corrected_volatile', '-')} "
            f"ecc_uncorr={r.get('ecc_uncorrected_volatile', '-')} reasons={reasons}"
        )
    for name, s in status["sources"].items():
        print(f"  source {name}: {'up' if s['up'] else 'DOWN'} {s['detail']}")
    return 0 if all(g["status"] == "ok" for g in status["gpus"]) else 3


# -- parser ------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatchd",
        description="GPU health daemon: NVML and kernel-log XID monitoring, Prometheus "
        "metrics, paging and scheduler drain.",
    )
    parser.add_argument("--version", action="version", version=f"gpuwatchd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help=f"config file (default {DEFAULT_CONFIG_PATH}, optional)",
        )
        return p

    p = with_config(sub.add_parser("run", help="run the daemon"))
    p.add_argument(
        "--backend",
        metavar="nvml|scenario:PATH",
        help="GPU backend (overrides the config's backend)",
    )
    p.add_argument("--listen", metavar="HOST:PORT", help="HTTP address (overrides config)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_run)

    p = with_config(
        sub.add_parser(
            "simulate", help="replay a scenario on a virtual clock; print records as JSON lines"
        )
    )
    p.add_argument("scenario", metavar="SCENARIO", help="scenario file (or a bundled name)")
    p.add_argument("--metrics-out", metavar="FILE", help="write the final /metrics text here")
    p.add_argument("--samples", action="store_true", help="also print every GPU sample")
    p.set_defaults(func=cmd_simulate)

    p = with_config(
        sub.add_parser(
            "demo", help="watch the daemon handle a bundled fault scenario in about a minute"
        )
    )
    p.add_argument("--scenario", metavar="FILE", help="play this scenario instead of 'demo'")
    p.add_argument("--seconds", type=float, default=60.0, help="real seconds to play it in")
    p.add_argument("--forever", action="store_true", help="keep serving after the story ends")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="HTTP address (default: the config's, or a free port if busy)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_demo)

    p = with_config(sub.add_parser("check-config", help="validate the config file"))
    p.add_argument("--print", action="store_true", help="print the effective config")
    p.set_defaults(func=cmd_check_config)

    p = with_config(sub.add_parser("status", help="ask the running daemon for per-GPU health"))
    p.add_argument("--url", help="daemon base URL (default: from the config's listen)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")
    p.set_defaults(func=cmd_status)

    import importlib

    for name in COMMAND_MODULES:
        module = importlib.import_module(f"gpuwatchd.{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # `gpuwatchd simulate ... | head`
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
