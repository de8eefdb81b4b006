"""``gpuwatchd check``: one-shot node health for Slurm prologs and epilogs, NHC and scripts.

Exit status: 0 healthy, 1 unhealthy, 2 cannot tell. The answer comes from the running
daemon when one answers (its GPU states and the alerts its rules hold firing), asked only
where it is proven to be the daemon: its status socket first (only the daemon can have
made it; the peer's uid is checked with ``SO_PEERCRED``), over HTTP only when
``web.ask_over_http`` is on or ``--url`` is given, and then only a listener proven by TLS
or, on this host, by the uid that owns it (see ``daemonclient``). Anything else on the
daemon's port (a user who bound it while the daemon is down) is "cannot tell", never an
answer. With no daemon at all (no live socket, nothing on the port), one poll of its
own: every GPU sampled once through the configured backend and judged by the same rules the
daemon runs (rules that need time, a ``for:`` or a window, cannot fire on one sample, and
XIDs seen before are not known without the daemon).

Unhealthy: a GPU whose health (``core.health``: the verdict ``status`` and the status API
show) is lost, stale, error or failing (a page fires on it; ``--fail-on ticket``: degraded
too, a ticket fires on it); fewer GPUs than ``gpus.expected``; no GPU at all; a node-level
alert of severity ``page`` (``--fail-on ticket``: tickets too). Cannot tell: the
config does not load, the daemon answered but not usefully (credentials, TLS, its own
/healthz failing), or ``--daemon`` was asked for and none answers.

Formats: ``human`` (default), ``json`` (one object) and ``nhc`` (one line, fit for NHC's
``die`` and a Slurm drain reason).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from gpuwatchd.config.paths import default_config_path
from gpuwatchd.configfile.loader import Config, load_config
from gpuwatchd.core.errors import BackendUnavailable, ConfigError
from gpuwatchd.core.health import (
    DEGRADED,
    EXIT_CANNOT_TELL,
    EXIT_OK,
    EXIT_UNHEALTHY,
    FAILING,
    gpu_health,
)
from gpuwatchd.core.statusdoc import StatusDocument

HEALTHY, UNHEALTHY, CANNOT_TELL = EXIT_OK, EXIT_UNHEALTHY, EXIT_CANNOT_TELL
VERDICTS = {HEALTHY: "healthy", UNHEALTHY: "unhealthy", CANNOT_TELL: "unknown"}
SEVERITY_RANK = {"info": 0, "ticket": 1, "page": 2}
LOCAL_POLL_SLACK = 2.0  # seconds on top of poll.call_timeout per GPU for the one-shot poll


@dataclass(frozen=True)
class Gpu:
    index: str
    pci_bus_id: str
    status: str  # ok, lost, stale, error
    health: str = ""  # the verdict (core.health): ok, degraded, failing, lost, stale, error
    rules: tuple[str, ...] = ()  # the firing page and ticket rules behind it


@dataclass(frozen=True)
class Firing:
    rule: str
    severity: str
    gpu: str | None = None
    count: int = 1


@dataclass
class Report:
    """What was seen and the verdict on it; ``source`` is ``daemon`` or ``local``."""

    source: str
    where: str
    gpus: list[Gpu] = field(default_factory=list)
    expected: int | None = None
    firing: list[Firing] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # make it unhealthy
    warnings: list[str] = field(default_factory=list)  # shown; do not change the verdict
    code: int = HEALTHY

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": VERDICTS[self.code],
            "exit_code": self.code,
            "source": self.source,
            "where": self.where,
            "gpus": [g.__dict__ for g in self.gpus],
            "gpus_expected": self.expected,
            "firing": [f.__dict__ for f in self.firing],
            "problems": self.problems,
            "warnings": self.warnings,
        }


def judge(report: Report, fail_on: str = "page") -> Report:
    """Fill each GPU's health (``core.health``, the verdict ``status`` and the status API
    show too), ``problems``, ``warnings`` and ``code``: a GPU that does not answer or is
    failing (a page fires on it) is a problem, one that is degraded (a ticket) a warning
    unless ``fail_on`` is ``ticket``; alerts on no GPU count by their own severity."""
    threshold = SEVERITY_RANK[fail_on]
    if not report.gpus:
        report.problems.append("no GPU found")
    on_gpu: dict[str, list[tuple[str, str]]] = {}
    known = {g.index for g in report.gpus}
    for f in report.firing:
        if f.gpu not in (None, "") and f.gpu in known:
            on_gpu.setdefault(str(f.gpu), []).append((f.rule, f.severity))
    judged = []
    for g in report.gpus:
        verdict = gpu_health(g.status, on_gpu.get(g.index, ()))
        judged.append(dataclasses.replace(g, health=verdict.health, rules=verdict.rules))
        text = f"GPU {g.index} ({g.pci_bus_id}) {verdict.text()}"
        if not verdict.answers or verdict.health == FAILING:
            report.problems.append(text)
        elif verdict.health == DEGRADED:
            (report.problems if threshold <= SEVERITY_RANK["ticket"] else report.warnings).append(
                text
            )
    report.gpus = judged
    if report.expected is not None and len(report.gpus) < report.expected:
        report.problems.append(f"{len(report.gpus)} GPU(s), expected {report.expected}")
    for f in report.firing:
        if f.gpu not in (None, "") and f.gpu in known and SEVERITY_RANK.get(f.severity, 0) > 0:
            continue  # in its GPU's verdict
        where = f" on GPU {f.gpu}" if f.gpu not in (None, "") else ""
        times = f" x{f.count}" if f.count > 1 else ""
        text = f"alert {f.rule} ({f.severity}){where}{times}"
        if SEVERITY_RANK.get(f.severity, 0) >= threshold:
            report.problems.append(text)
        else:
            report.warnings.append(text)
    report.code = UNHEALTHY if report.problems else HEALTHY
    return report


# -- asking the daemon ---------------------------------------------------------------------
def from_status(status: dict[str, Any]) -> tuple[list[Gpu], int | None, list[Firing] | None]:
    """GPU states, ``gpus.expected`` and firing alerts from /api/v1/status (``None`` for
    the alerts when the daemon's status has no ``alerts``: an older daemon)."""
    return from_document(StatusDocument.from_json(status))


def from_document(doc: StatusDocument) -> tuple[list[Gpu], int | None, list[Firing] | None]:
    """GPU states, ``gpus.expected`` and firing alerts from the daemon's status document."""
    gpus = [Gpu(str(g.index), g.pci_bus_id, g.status) for g in doc.gpus]
    firing = None
    if doc.alerts is not None:
        firing = [Firing(a.rule, a.severity, a.gpu) for a in doc.alerts]
    return gpus, doc.gpus_expected, firing


def from_metrics(text: str) -> tuple[list[Gpu], int | None, list[Firing]]:
    """GPU states, ``gpus.expected`` and firing alerts from the daemon's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    gpus: dict[str, Gpu] = {}
    expected: int | None = None
    firing: list[Firing] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "gpuwatchd_gpu_status" and s.value == 1:
                i = s.labels.get("gpu", "?")
                gpus[i] = Gpu(i, s.labels.get("pci_bus_id", ""), s.labels.get("status", "?"))
            elif s.name == "gpuwatchd_gpus_expected":
                expected = int(s.value)
            elif s.name == "gpuwatchd_alerts" and s.labels.get("state") == "firing" and s.value > 0:
                firing.append(
                    Firing(
                        s.labels.get("rule", "?"), s.labels.get("severity", "?"), None, int(s.value)
                    )
                )
    ordered = sorted(gpus.values(), key=lambda g: (len(g.index), g.index))
    return ordered, expected, firing


def ask_socket(config: Config, environ: dict[str, str]) -> Report | None:
    """The daemon's answer over its verified status socket; None when there is no live
    socket (no daemon runs); ``DaemonError`` when one is there but not provably the
    daemon's, or the daemon says it is not healthy."""
    from gpuwatchd.cli import statusclient
    from gpuwatchd.cli.daemonclient import DaemonError

    path = statusclient.find_socket(config.state_dir, environ)
    if path is None:
        return None
    try:
        doc = statusclient.read_verified(path, 5.0)
    except statusclient.StatusSocketError as exc:
        if exc.stale:
            return None
        raise DaemonError(statusclient.printable(str(exc))) from None
    health = doc.get("health")
    if isinstance(health, dict) and health.get("ok") is False:
        reason = statusclient.printable(str(health.get("detail", "")))[:200]
        raise DaemonError(f"the daemon at {path} is not healthy: {reason}")
    gpus, expected, firing = from_status(doc["status"])
    return Report("daemon", path, gpus, expected, firing or [])


def something_listens(base: str, timeout: float) -> bool:
    """Whether a TCP connection to ``base`` (a URL) is accepted: nothing is sent."""
    import socket
    import urllib.parse

    parts = urllib.parse.urlsplit(base)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((parts.hostname or "", port), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def ask_daemon(client: Any) -> Report:
    """``DaemonError`` when the daemon cannot be asked or says it is not healthy."""
    from gpuwatchd.cli.daemonclient import DaemonError

    status, body = client.get("/healthz")
    if status == 503:
        reason = body.decode("utf-8", "replace").strip()[:200]
        raise DaemonError(f"the daemon at {client.base} is not healthy: {reason}")
    if status != 200:
        client.get_ok("/healthz")  # raises with the reason (401, ...)
    try:
        data = json.loads(client.get_ok("/api/v1/status"))
    except ValueError:
        raise DaemonError(f"{client.base}/api/v1/status is not JSON") from None
    gpus, expected, firing = from_status(data)
    if firing is None:  # a daemon whose status lists no alerts: count them from /metrics
        _, _, firing = from_metrics(client.get_ok("/metrics").decode("utf-8", "replace"))
    return Report("daemon", client.base, gpus, expected, firing)


# -- polling once ourselves ------------------------------------------------------------------
def poll_once(config: Config) -> Report:
    """One sample of every GPU through the configured backend, judged by the rules."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.core.alerts import AlertState
    from gpuwatchd.core.clock import SystemClock
    from gpuwatchd.core.nodestate import NodeState
    from gpuwatchd.rules import rules_stage
    from gpuwatchd.service.backends import open_backend
    from gpuwatchd.sources.gpu.poller import Poller

    clock = SystemClock()
    stage = rules_stage(for_rules(config), clock, durable=False)
    # one look, in this process: no worker to supervise for a single poll
    poll = replace(config.poll, worker=False)
    backend = open_backend(str(config.backend), clock, extra_fields=config.fields, poll=poll)
    try:
        infos = backend.open()
        state = NodeState(config.node_name, clock.now(), config.gpus.expected)
        state.set_gpus(infos, clock.now())
        records: list[Any] = []
        poller = Poller(
            backend,
            infos,
            state,
            clock,
            config.poll.interval,
            config.poll.call_timeout,
            emit=records.append,
        )
        done = threading.Event()

        def run() -> None:
            try:
                poller.poll_once_sync()
            finally:
                done.set()

        # a wedged NVML call must not hang a prolog: give up after the call timeouts
        threading.Thread(target=run, name="check-poll", daemon=True).start()
        limit = len(infos) * (config.poll.call_timeout + LOCAL_POLL_SLACK)
        if not done.wait(max(limit, LOCAL_POLL_SLACK)):
            report = Report("local", str(config.backend))
            report.gpus = [Gpu(str(i.index), i.pci_bus_id, "stale") for i in infos]
            report.problems.append(f"NVML did not answer within {limit:g}s")
            return report
        for record in records:
            stage.observe(record)
        view = state.view()
        transitions = stage.evaluate(clock.now(), view)
    finally:
        backend.close()
    gpus = [Gpu(str(g.info.index), g.info.pci_bus_id, g.status.value) for g in view.gpus]
    firing = [
        Firing(t.rule, t.severity.value, t.labels.get("gpu"))
        for t in transitions
        if t.state is AlertState.FIRING
    ]
    return Report("local", str(config.backend), gpus, config.gpus.expected, firing)


# -- output ----------------------------------------------------------------------------------
def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.as_dict(), sort_keys=True)
    if fmt == "nhc":
        if report.code == HEALTHY:
            return f"gpuwatchd: healthy ({len(report.gpus)} GPUs)"
        if report.code == CANNOT_TELL:
            return "gpuwatchd: cannot tell: " + "; ".join(report.problems)
        return "gpuwatchd: " + "; ".join(report.problems)
    head = {
        HEALTHY: "HEALTHY",
        UNHEALTHY: "UNHEALTHY",
        CANNOT_TELL: "CANNOT TELL",
    }[report.code]
    source = "the running daemon" if report.source == "daemon" else "one local poll"
    lines = [f"gpuwatchd check: {head} ({source}, {report.where})"]
    if report.gpus:
        states = ", ".join(f"{g.index}={g.health or g.status}" for g in report.gpus)
        lines.append(f"  GPUs: {len(report.gpus)} ({states})")
    lines.extend(f"  problem: {p}" for p in report.problems)
    lines.extend(f"  warning: {w}" for w in report.warnings)
    return "\n".join(lines)


def cmd_check(args: argparse.Namespace) -> int:
    from gpuwatchd.cli.daemonclient import DaemonError, client_from_args
    from gpuwatchd.service.logsetup import setup_logging

    setup_logging("error")  # the verdict is the output; GPU state changes are in it

    def cannot_tell(where: str, message: str) -> int:
        report = Report(args.mode, where, code=CANNOT_TELL)
        report.problems.append(message)
        print(render(report, args.format))
        return CANNOT_TELL

    try:
        config = load_config(
            args.config or default_config_path(), must_exist=args.config is not None
        )
        if args.backend:
            import dataclasses

            from gpuwatchd.configfile.loader import BackendSpec

            config = dataclasses.replace(config, backend=BackendSpec.parse(args.backend))
    except ConfigError as exc:
        return cannot_tell("config", "; ".join(exc.lines()))
    except ValueError as exc:
        return cannot_tell("config", f"--backend: {exc}")
    report: Report | None = None
    if args.mode in ("auto", "daemon"):
        import os

        try:
            if not args.url:
                report = ask_socket(config, dict(os.environ))
            if report is None:
                client = client_from_args(args, config, require_proof=True)
                if args.url or config.web.ask_over_http:
                    report = ask_daemon(client)
                elif something_listens(client.base, args.timeout):
                    return cannot_tell(
                        "daemon",
                        f"something listens on {client.base} but there is no status socket "
                        "proving it is the daemon (not asked: it may be another user's "
                        "program; set web.ask_over_http to ask the daemon over HTTP)",
                    )
                else:
                    raise DaemonError(
                        f"cannot reach the daemon: no status socket, nothing listens on "
                        f"{client.base}",
                        unreachable=True,
                    )
        except ValueError as exc:
            return cannot_tell("daemon", str(exc))
        except DaemonError as exc:
            if args.mode == "daemon" or not exc.unreachable:
                return cannot_tell("daemon", str(exc))
            report = None  # nothing listens: no daemon runs, poll ourselves
    if report is None:
        try:
            report = poll_once(config)
        except ConfigError as exc:
            return cannot_tell("local", "; ".join(exc.lines()))
        except BackendUnavailable as exc:
            report = Report("local", str(config.backend))
            report.problems.append(f"GPU backend unavailable: {exc}")
    judge(report, args.fail_on)
    print(render(report, args.format))
    return report.code


def add_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    from gpuwatchd.cli.daemonclient import add_client_arguments

    p = subparsers.add_parser(
        "check",
        help="one-shot node health for prologs, epilogs and NHC (exit 0/1/2)",
        description="Check this node's GPUs once: exit 0 healthy, 1 unhealthy, 2 cannot tell. "
        "Asks the running daemon when one answers, else polls every GPU once itself.",
        epilog="examples:\n"
        "  gpuwatchd check                      # in a Slurm prolog: non-zero drains\n"
        "  gpuwatchd check --format nhc         # one line for NHC's die()\n"
        "  gpuwatchd check --daemon --format json --user prom --password-file /etc/gw.pw",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "-c", "--config", metavar="FILE", help=f"config file (default {default_config_path()})"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--daemon",
        dest="mode",
        action="store_const",
        const="daemon",
        help="only ask the running daemon (cannot tell when none answers)",
    )
    mode.add_argument(
        "--local",
        dest="mode",
        action="store_const",
        const="local",
        help="do not ask the daemon: poll every GPU once",
    )
    p.set_defaults(mode="auto")
    p.add_argument(
        "--format", choices=("human", "json", "nhc"), default="human", help="output format"
    )
    p.add_argument(
        "--fail-on",
        choices=("page", "ticket"),
        default="page",
        help="least severity of a firing alert that makes the node unhealthy (default page)",
    )
    p.add_argument(
        "--backend",
        metavar="nvml|scenario:PATH",
        help="GPU backend of the local poll (overrides the config's)",
    )
    add_client_arguments(p)
    p.set_defaults(func=cmd_check)
    return p
