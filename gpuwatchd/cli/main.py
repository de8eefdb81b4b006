"""The ``gpuwatchd`` command line. Each subcommand's handler returns an exit status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from gpuwatchd import __version__
from gpuwatchd.config.paths import default_config_path
from gpuwatchd.configfile.loader import (
    BackendSpec,
    Config,
    ListenAddress,
    load_config,
)
from gpuwatchd.core.clock import SystemClock
from gpuwatchd.core.errors import BackendUnavailable, ConfigError, GpuwatchdError
from gpuwatchd.core.health import (
    DEGRADED,
    EXIT_CANNOT_TELL,
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_USAGE,
    FAILING,
    OK,
)

log = logging.getLogger("gpuwatchd")

ANSWERING = (OK, DEGRADED, FAILING)


class UsageParser(argparse.ArgumentParser):
    """Every usage error (an unknown command or option, a bad value) exits 64 (EX_USAGE),
    never 2, which means "cannot tell" for every command (docs: man gpuwatchd, EXIT STATUS).
    Subcommand parsers are made with the parent's class, so they do the same."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


# Modules that add subcommands: each has ``add_parser(subparsers)`` and sets ``func``.
COMMAND_MODULES: tuple[str, ...] = (
    "xid",
    "drainhelper",
    "silence",
    "fleet",
    "rules",
    "backtest",
    "check",
)
# Commands built here, in main.py: ``run`` then needs none of the modules above (the
# daemon's memory is measured against a bare pynvml process; see docs/PERFORMANCE.md).
OWN_COMMANDS = frozenset({"run", "demo", "simulate", "check-config", "status"})


def _load(args: argparse.Namespace) -> Config:
    path = args.config or default_config_path()
    return load_config(path, must_exist=args.config is not None)


def _setup_logging(level: str, verbose: bool = False, log_format: str = "auto") -> None:
    """The journal when stderr is journald's stream, else tty or plain; or JSON lines when
    the config's log_format asks (see logsetup)."""
    from gpuwatchd.service.logsetup import setup_logging

    setup_logging(level, verbose, log_format=log_format)


def _config_errors(exc: ConfigError) -> int:
    for line in exc.lines():
        print(line, file=sys.stderr)
    return 1


# -- run ---------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    from gpuwatchd.service.backends import open_backend
    from gpuwatchd.service.daemon import Daemon

    def load() -> Config:  # also what a SIGHUP reload reads
        config = _load(args)
        if args.backend:
            config = _replace(config, backend=BackendSpec.parse(args.backend))
        if args.listen:
            config = _replace(config, listen=_parse_listen(args.listen))
        return config

    try:
        try:
            config = load()
        except ValueError as exc:
            print(f"gpuwatchd run: --backend: {exc}", file=sys.stderr)
            return EXIT_USAGE
        _setup_logging(config.log_level, args.verbose, config.log_format)
        clock = SystemClock()
        backend = open_backend(
            str(config.backend),
            clock,
            extra_fields=config.fields,
            poll=config.poll,
            nvml_events=config.sources.nvml_events,
        )
    except ConfigError as exc:
        return _config_errors(exc)
    except BackendUnavailable as exc:
        print(f"gpuwatchd run: {exc}", file=sys.stderr)
        return 1
    from gpuwatchd.service.assembly import Wiring
    from gpuwatchd.service.logsetup import config_secrets, register_secret, set_level
    from gpuwatchd.service.pipeline import Stage
    from gpuwatchd.service.sdnotify import Notifier
    from gpuwatchd.service.watchdog import SignalInbox, Supervisor, serve

    environ = dict(os.environ)
    notifier = Notifier.from_environ(unset=True)  # drain hooks must not inherit it
    extra_stages: tuple[Stage, ...] = ()
    if environ.get("GPUWATCHD_TEST_FAULT"):
        from gpuwatchd.testing.faults import stages_from_environ

        extra_stages = tuple(stages_from_environ(environ))
    try:  # bad rule files and unreadable receiver secrets are fatal before anything starts
        daemon = Daemon(config, backend, clock, wiring=Wiring(extra_stages=extra_stages))
    except ConfigError as exc:
        return _config_errors(exc)
    except GpuwatchdError as exc:  # actions cannot start: an unreadable secret, no outbox
        print(f"gpuwatchd run: {exc}", file=sys.stderr)
        return 1
    daemon.config_loader = load
    if daemon.node.actions is not None:
        for secret in daemon.node.actions.secrets:  # every log line is scrubbed of them
            register_secret(secret)

    def register_secrets(new: Config) -> None:  # after the actions took their new secrets
        secrets = list(config_secrets(new))
        if daemon.node.actions is not None:
            secrets += daemon.node.actions.secrets
        for secret in secrets:
            register_secret(secret)

    register_secrets(config)
    set_level(config.log_level, args.verbose)
    daemon.log_owner.set_level = lambda level: set_level(level, args.verbose)
    daemon.after_reload.append(register_secrets)
    supervisor = Supervisor.for_daemon(daemon, notifier, environ)
    with SignalInbox() as signals:
        try:
            daemon.start()  # a busy port does not stop it: the listener retries
        except ConfigError as exc:  # the web config file changed under us
            return _config_errors(exc)
        try:
            daemon.wait_started(config.poll.call_timeout + 1.0)
            supervisor.ready()
            serve(supervisor, daemon.reload, signals)
        finally:
            daemon.stop()
            notifier.close()
    return 0


def _replace(config: Config, **changes: object) -> Config:
    import dataclasses

    return dataclasses.replace(config, **changes)  # type: ignore[arg-type]


def _parse_listen(text: str) -> ListenAddress:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        print(f"gpuwatchd: --listen: {text!r} is not HOST:PORT", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    return ListenAddress(host.strip("[]"), int(port))


# -- simulate / demo ---------------------------------------------------------------------
def _scenario_path(text: str) -> str:
    import os

    from gpuwatchd.scenario.model import bundled_scenario_path, bundled_scenarios

    if os.path.exists(text) or "/" in text or text.endswith(".yaml"):
        return text
    if text in bundled_scenarios():
        return bundled_scenario_path(text)
    return text


def cmd_simulate(args: argparse.Namespace) -> int:
    from gpuwatchd.harness.simulate import run_simulation
    from gpuwatchd.scenario.model import load_scenario

    try:
        config = _load(args)
        scenario = load_scenario(_scenario_path(args.scenario), config.fields)
    except ConfigError as exc:
        return _config_errors(exc)
    _setup_logging("error")
    try:
        return run_simulation(
            scenario,
            config,
            sys.stdout,
            include_samples=args.samples,
            metrics_out=args.metrics_out,
            send=args.send,
        )
    except ConfigError as exc:  # the config's rule files
        return _config_errors(exc)


def cmd_demo(args: argparse.Namespace) -> int:
    from gpuwatchd.harness.demo import default_demo_config, run_demo
    from gpuwatchd.scenario.model import bundled_scenario_path, load_scenario

    try:
        config = _load(args) if args.config else default_demo_config()
        scenario = load_scenario(
            _scenario_path(args.scenario) if args.scenario else bundled_scenario_path("demo"),
            config.fields,
        )
    except ConfigError as exc:
        return _config_errors(exc)
    _setup_logging("error", args.verbose)
    listen = _parse_listen(args.listen) if args.listen else None
    return run_demo(scenario, config, seconds=args.seconds, forever=args.forever, listen=listen)


# -- check-config / status ---------------------------------------------------------------
def cmd_check_config(args: argparse.Namespace) -> int:
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules import rules_from_settings

    try:
        config = _load(args)
        rules = rules_from_settings(for_rules(config), args.rule_files)  # every file, all problems
    except ConfigError as exc:
        return _config_errors(exc)
    where = config.source or "built-in defaults (no config file)"
    if not args.print:
        print(f"rules: {len(rules.rules)} rule(s) from {len(rules.files)} file(s): OK")
    if args.print:
        import yaml

        sys.stdout.write(yaml.safe_dump(config.as_dict(), sort_keys=False))
    else:
        print(f"{where}: OK")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from gpuwatchd.cli import statusclient
    from gpuwatchd.cli.daemonclient import DaemonError, client_from_args

    notes: list[str] = []
    status: Any = None
    try:
        config = None if args.url and not args.config else _load(args)
    except ConfigError as exc:
        return _config_errors(exc)
    over_http = bool(args.url)
    if config is not None and not args.url:
        # the daemon's own socket first: only the daemon can have made it (a squatter on
        # the HTTP port cannot); HTTP only when the config says so, and then only a
        # listener proven to be the daemon (TLS, or the uid that owns it)
        sock = args.socket or statusclient.find_socket(config.state_dir, os.environ)
        doc = None
        if sock is not None:
            try:
                doc = statusclient.read_verified(sock, args.timeout)
            except statusclient.StatusSocketError as exc:
                if not exc.stale or not config.web.ask_over_http:
                    print(f"gpuwatchd status: {statusclient.printable(str(exc))}", file=sys.stderr)
                    return EXIT_CANNOT_TELL
        if doc is not None:
            if args.healthz:  # a probe: the daemon's own health, not the GPUs'
                health = doc.get("health") or {}
                print(statusclient.printable(str(health.get("detail", ""))))
                return EXIT_OK if health.get("ok") is True else EXIT_UNHEALTHY
            status = doc["status"]
            http = doc.get("http") or {}
            if http.get("listening") is False:
                notes.append(f"  http: NOT listening on {http.get('where')}: {http.get('problem')}")
        elif config.web.ask_over_http:
            over_http = True
        else:
            print(
                "gpuwatchd status: no status socket answers (is the daemon running?); "
                "HTTP is not asked, since whoever holds the port may not be the daemon "
                "(set web.ask_over_http, or give --url)",
                file=sys.stderr,
            )
            return EXIT_CANNOT_TELL
    if status is None and (over_http or config is None):
        try:
            client = client_from_args(args, config, require_proof=not args.url)
            if args.healthz:  # a probe: the daemon's own health, not the GPUs'
                code, body = client.get("/healthz")
                text = statusclient.printable(body.decode("utf-8", "replace").strip())
                print(text if code in (200, 503) else f"HTTP {code} {text}"[:300])
                return (
                    EXIT_OK if code == 200 else EXIT_UNHEALTHY if code == 503 else EXIT_CANNOT_TELL
                )
            status = json.loads(client.get_ok("/api/v1/status"))
        except (DaemonError, ValueError) as exc:
            print(f"gpuwatchd status: {statusclient.printable(str(exc))}", file=sys.stderr)
            return EXIT_CANNOT_TELL
    return _print_status(status, notes, args.json)


def _print_status(status: Any, notes: list[str], as_json: bool) -> int:
    """Print the daemon's status; the exit code is ``check``'s verdict on it (0 healthy,
    1 unhealthy), from the same per-GPU health (``core.health``)."""
    from gpuwatchd.cli import statusclient
    from gpuwatchd.cli.check import Report, from_document, judge
    from gpuwatchd.cli.statustext import status_text
    from gpuwatchd.core.statusdoc import StatusDocument

    if not as_json:
        status = statusclient.clean(status)  # never a terminal escape from the wire
    doc = StatusDocument.from_json(status)
    gpus, expected, firing = from_document(doc)
    report = judge(Report("daemon", "", gpus, expected, firing or []))
    if as_json:  # json.dump escapes every control character
        json.dump(doc.as_json(), sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
        return report.code
    for line in status_text(doc, notes, report.problems):
        print(line)
    return report.code


# -- parser ------------------------------------------------------------------------------
HELP_EXAMPLES = """\
examples:
  gpuwatchd check-config && systemctl reload gpuwatchd
                                  validate an edited config, then apply it
  gpuwatchd status                per-GPU health from the running daemon (exit 1:
                                  a GPU is not healthy, 2: no answer)
  journalctl -k -b -1 | gpuwatchd xid parse
                                  XIDs in the previous boot's kernel log
  gpuwatchd xid explain 79        what an XID means and what to do
  gpuwatchd silence add --gpu 3 --for 2h --reason "reseat GPU 3"
                                  mute GPU 3's pages and drains for maintenance
  gpuwatchd demo                  watch a fault being handled, in about a minute

  gpuwatchd COMMAND --help shows each command's options; man gpuwatchd has more.
"""


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole CLI; with ``command`` one of main.py's own, the command modules are left
    unimported (their parsers are only needed to run or to list them)."""
    parser = UsageParser(
        prog="gpuwatchd",
        description="GPU health daemon: NVML and kernel-log XID monitoring, Prometheus\n"
        "metrics, paging and scheduler drain.",
        epilog=HELP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuwatchd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument(
            "-c",
            "--config",
            metavar="FILE",
            help=f"config file (default {default_config_path()}, optional)",
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
    p.add_argument(
        "--send",
        action="store_true",
        help="really send notifications to the configured receivers (default: record them; "
        "drains are always only recorded)",
    )
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

    p = with_config(
        sub.add_parser("check-config", help="validate the config file and every rule file")
    )
    p.add_argument("--print", action="store_true", help="print the effective config")
    p.add_argument("rule_files", nargs="*", metavar="RULE_FILE", help="also check these rule files")
    p.set_defaults(func=cmd_check_config)

    p = with_config(sub.add_parser("status", help="ask the running daemon for per-GPU health"))
    p.add_argument(
        "--socket", help="the daemon's status socket (default: $RUNTIME_DIRECTORY, /run/gpuwatchd)"
    )
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.add_argument(
        "--healthz",
        action="store_true",
        help="only the daemon's /healthz: exit 0 when it is healthy (a probe command)",
    )
    from gpuwatchd.cli.daemonclient import add_client_arguments

    add_client_arguments(p)  # --url, --timeout, TLS and basic auth
    p.set_defaults(func=cmd_status)

    import importlib

    from gpuwatchd.cli.examples import attach

    if command not in OWN_COMMANDS:
        for name in COMMAND_MODULES:
            module = importlib.import_module(f"gpuwatchd.cli.{name}")
            module.add_parser(sub)
    attach(parser)  # every command's --help ends with examples
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    first = list(sys.argv[1:] if argv is None else argv)[:1]
    if first == ["run"]:
        # A reload asked for while the daemon starts (systemctl reload, logrotate) must not
        # kill it: SIGHUP's default action is to terminate. Ignored until the daemon's own
        # handler takes over.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    parser = build_parser(first[0] if first else None)
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except BrokenPipeError:  # `gpuwatchd simulate ... | head`
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
