"""``gpuwatchd drain-helper``: the privilege split for draining the node.

The daemon runs as the unprivileged ``gpuwatchd`` user with no capabilities. Draining
needs more (``scontrol update`` as root or SlurmUser; a site script with a cluster
credential), so it is done by a separate, tiny, socket-activated root service:

    daemon (user gpuwatchd, sandboxed)
      drain mode "exec" runs:  gpuwatchd drain-helper request        (still unprivileged)
        -> connects to /run/gpuwatchd-drain.sock  (root:gpuwatchd 0660, gpuwatchd-drain.socket)
           -> systemd starts gpuwatchd-drain@.service for that one connection (Accept=yes):
              gpuwatchd drain-helper serve   (root; stdin is the connection)

``serve`` accepts exactly one request per connection, from a peer whose SO_PEERCRED uid is
the ``gpuwatchd`` user (or root). The request is one JSON line with nothing but an action
and a reason::

    {"action": "drain" | "resume", "reason": "gpuwatchd: XID 79 GPU 3 00000000:3B:00.0",
     "node": "gpu-a17" (optional, must be this node), "incident": "id" (optional)}
    {"action": "claim", "claim": "gpuwatchd-claim: ticket 7 at 1764183000.125" | ""}

A claim is the fleet drain budget's place (docs/fleet.md): in ``slurm`` mode the helper puts
it into the node's ``Comment`` (keeping another owner's text there), or takes ours off when
empty; it must have exactly the claim's shape. Other modes answer a claim as done without
acting (dry-run) or refuse it.

Everything else is fixed on the root side: which node (``--node``, default this host's
name), which mechanism (``--mode``: dry-run, slurm, kubernetes or one site ``--command``),
which programs and credentials (``--scontrol``/``--sinfo``, ``--kubeconfig``), all from the
unit's root-owned environment file. Slurm and Kubernetes use the daemon's own drain drivers
(``gpuwatchd.actions``): an admin's drain is never rewritten and only gpuwatchd's own is
resumed. The helper never runs a shell, never takes a path or an argument from the request,
acts only on the local node, and drains only with reasons that start with ``gpuwatchd:``
(a resume needs no reason). The reply is one JSON line: ``{"ok": true|false, "detail":
"..."}``.

``request`` is the client for the daemon's exec drain mode. It reads the request from the
exec mode's environment (``GPUWATCHD_ACTION``, ``GPUWATCHD_REASON``, ``GPUWATCHD_NODE``,
``GPUWATCHD_INCIDENT``, ``GPUWATCHD_CLAIM``) or from options, and exits 0 (done), 1 (refused
or failed), 64 (a usage error) or 75 (EX_TEMPFAIL: the helper could not be reached; retry later).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pwd
import re
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("gpuwatchd.drain-helper")

__all__ = [
    "DEFAULT_SOCKET",
    "HelperConfig",
    "Request",
    "RequestError",
    "add_parser",
    "handle_connection",
    "parse_request",
    "perform",
]

DEFAULT_SOCKET = "/run/gpuwatchd-drain.sock"
REASON_PREFIX = "gpuwatchd:"
MAX_REQUEST = 4096
EX_TEMPFAIL = 75
EX_USAGE = 64  # a bad option (core.health.EXIT_USAGE; this module imports nothing of ours)
ACTIONS = ("drain", "resume", "claim")
MODES = ("dry-run", "slurm", "kubernetes", "command")
_REASON_RE = re.compile(r"gpuwatchd:[A-Za-z0-9 :._,/()#=+@%\[\]-]{1,190}")
_INCIDENT_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NODE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_KEYS = {"action", "reason", "node", "incident", "claim"}


class RequestError(ValueError):
    """A request the helper refuses without acting."""


@dataclass(frozen=True)
class Request:
    action: str
    reason: str
    incident: str | None = None
    claim: str = ""  # action claim: the claim's text ("": take ours off)


@dataclass(frozen=True)
class HelperConfig:
    node: str
    mode: str = "dry-run"
    allow_user: str = "gpuwatchd"
    scontrol: str = "/usr/bin/scontrol"
    sinfo: str = "/usr/bin/sinfo"
    command: tuple[str, ...] = ()
    kubeconfig: str | None = None
    timeout: float = 30.0


def parse_request(data: bytes, node: str) -> Request:
    """Validate one request strictly; ``RequestError`` says what is wrong."""
    if len(data) > MAX_REQUEST:
        raise RequestError(f"request longer than {MAX_REQUEST} bytes")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"not a JSON object: {exc}") from None
    except RecursionError:  # [[[[...]]]] deeper than the parser's stack: not a request
        raise RequestError("not a JSON object: nested too deeply") from None
    if not isinstance(obj, dict):
        raise RequestError("not a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise RequestError(f"unknown keys: {', '.join(unknown)}")
    action = obj.get("action")
    if action not in ACTIONS:
        raise RequestError(f"action must be one of {', '.join(ACTIONS)}")
    if action == "claim":
        return Request("claim", "", None, _claim_text(obj.get("claim")))
    if "claim" in obj:
        raise RequestError("claim is only for action claim")
    reason = obj.get("reason", "")
    if action == "resume" and reason == "":
        pass  # a resume acts on the scheduler's record of our drain, not on this text
    elif not isinstance(reason, str) or not _REASON_RE.fullmatch(reason):
        raise RequestError(
            f"reason must start with {REASON_PREFIX!r}, be at most 200 characters and use "
            "only letters, digits, spaces and :._,/()#=+@%[]-"
        )
    if "node" in obj and obj["node"] != node:
        raise RequestError(f"node must be this node ({node!r}) or left out")
    incident = obj.get("incident")
    if incident is not None and (
        not isinstance(incident, str) or not _INCIDENT_RE.fullmatch(incident)
    ):
        raise RequestError("incident must be 1-64 characters of letters, digits and ._-")
    return Request(str(action), str(reason), incident)


def _claim_text(value: Any) -> str:
    from gpuwatchd.actions.fleet import Claim, Mark

    if value == "":
        return ""
    if isinstance(value, str) and len(value) <= 80:
        parsed: Claim | Mark | None = Claim.parse("-", value)
        if parsed is None and value.startswith("gpuwatchd-fleet: tripped "):
            parsed = Mark.parse("-", value)  # the breaker, tripped (only a reset undoes it)
        if parsed is not None and parsed.text == value:
            return value
    raise RequestError(
        "claim must be empty, 'gpuwatchd-claim: choosing|ticket N at SECONDS [xid N]' or "
        "'gpuwatchd-fleet: tripped at SECONDS [xid N]', written exactly so"
    )


# -- the actions ----------------------------------------------------------------------------
Runner = Callable[
    [Sequence[str], Mapping[str, str] | None, float], "subprocess.CompletedProcess[str]"
]


def _run(
    argv: Sequence[str], env: Mapping[str, str] | None, timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _clean_env() -> dict[str, str]:
    """A fixed environment for programs the helper runs: nothing inherited but locale."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _command(cfg: HelperConfig, req: Request, run: Runner) -> tuple[bool, str]:
    env = _clean_env()
    env.update(
        GPUWATCHD_ACTION=req.action,
        GPUWATCHD_NODE=cfg.node,
        GPUWATCHD_REASON=req.reason,
        GPUWATCHD_INCIDENT=req.incident or "",
    )
    out = run(cfg.command, env, cfg.timeout)
    detail = (out.stdout.strip() or out.stderr.strip())[:300]
    if out.returncode != 0:
        return False, f"{cfg.command[0]} exited {out.returncode}: {detail}"
    return True, detail or f"{req.action} done by {cfg.command[0]}"


def _driver(cfg: HelperConfig) -> Any:
    """The daemon's own drain driver for the mode (one implementation of the policy)."""
    if cfg.mode == "slurm":
        from gpuwatchd.actions.drain.drivers.slurm import SlurmDriver

        return SlurmDriver(cfg.node, cfg.timeout, cfg.scontrol, cfg.sinfo)
    from gpuwatchd.actions.drain.drivers.kubernetes import (
        KubeClient,
        KubernetesDrainConfig,
        KubernetesDriver,
    )

    kcfg = KubernetesDrainConfig(kubeconfig=cfg.kubeconfig)
    return KubernetesDriver(KubeClient.from_config(kcfg, cfg.timeout), cfg.node, kcfg, time.time)


# Driver outcomes that are policy, not failure: reported as done (exit 0) with the reason.
_OK_RESULTS = {
    "drained",
    "already",
    "kept_admin",
    "noted",
    "dry_run",
    "resumed",
    "unnoted",
    "not_drained",
    "not_ours",
}


def perform(cfg: HelperConfig, req: Request, run: Runner = _run) -> tuple[bool, str]:
    """Carry out a validated request on this node; (ok, detail)."""
    if cfg.mode == "dry-run":
        what = (req.claim or "take the claim off") if req.action == "claim" else req.reason
        return True, f"dry-run: would {req.action} {cfg.node}: {what}"
    if req.action == "claim":
        return _claim(cfg, req)
    try:
        if cfg.mode == "command":
            return _command(cfg, req, run)
        if cfg.mode in ("slurm", "kubernetes"):
            from gpuwatchd.actions.drain.drivers.base import DrainError

            try:
                driver = _driver(cfg)
                try:
                    if req.action == "drain":
                        result = driver.drain({}, req.reason, False)
                    else:
                        result = driver.resume(None, False)
                finally:
                    driver.close()
            except DrainError as exc:
                return False, f"{req.action} failed: {exc}"
            return result.result in _OK_RESULTS, f"{result.result}: {result.detail}"
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        return False, f"{req.action} failed: {exc}"
    return False, f"unknown mode {cfg.mode!r}"


def _claim(cfg: HelperConfig, req: Request) -> tuple[bool, str]:
    if cfg.mode != "slurm":
        return False, f"claim: the fleet budget's claims are for mode slurm, not {cfg.mode}"
    from gpuwatchd.actions.drain.drivers.base import DrainError
    from gpuwatchd.actions.drain.drivers.slurm import put_claim, put_mark
    from gpuwatchd.actions.fleet import Claim, Mark

    try:
        mark = Mark.parse(cfg.node, req.claim)
        if mark is not None:
            put_mark(cfg.scontrol, cfg.sinfo, cfg.timeout, cfg.node, mark)
        else:
            put_claim(
                cfg.scontrol, cfg.sinfo, cfg.timeout, cfg.node, Claim.parse(cfg.node, req.claim)
            )
    except DrainError as exc:
        return False, f"claim failed: {exc}"
    return True, f"claim: {req.claim or 'taken off'}"


# -- the connection -------------------------------------------------------------------------
def peer_uid(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


def _read_line(sock: socket.socket, limit: int) -> bytes:
    data = b""
    while b"\n" not in data and len(data) <= limit:
        chunk = sock.recv(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return data.partition(b"\n")[0] if b"\n" in data else data


def handle_connection(sock: socket.socket, cfg: HelperConfig, run: Runner = _run) -> dict[str, Any]:
    """Serve one request on a connected socket; returns the reply it sent."""
    sock.settimeout(cfg.timeout)
    reply: dict[str, Any]
    uid = peer_uid(sock)
    allowed = {0}
    if cfg.allow_user:
        try:
            allowed.add(pwd.getpwnam(cfg.allow_user).pw_uid)
        except KeyError:
            log.warning("drain-helper: no user %r: only root may ask", cfg.allow_user)
    if uid not in allowed:
        reply = {"ok": False, "detail": f"peer uid {uid} is not allowed"}
        log.warning("drain-helper: refused a request from uid %d", uid)
    else:
        try:
            req = parse_request(_read_line(sock, MAX_REQUEST), cfg.node)
        except (RequestError, TimeoutError, OSError) as exc:
            reply = {"ok": False, "detail": f"bad request: {exc}"}
            log.warning("drain-helper: %s", reply["detail"])
        else:
            ok, detail = perform(cfg, req, run)
            reply = {"ok": ok, "detail": detail}
            log.log(logging.INFO if ok else logging.ERROR, "drain-helper: %s (uid %d)", detail, uid)
    with contextlib.suppress(OSError):  # the peer may have given up waiting
        sock.sendall(json.dumps(reply).encode() + b"\n")
    return reply


def _default_node() -> str:
    return socket.gethostname().partition(".")[0] or "localhost"


def cmd_serve(args: argparse.Namespace) -> int:
    from gpuwatchd.service.logsetup import setup_logging

    setup_logging("info")
    if args.mode == "command" and not args.command:
        print("gpuwatchd drain-helper serve: --mode command needs --command PATH", file=sys.stderr)
        return EX_USAGE
    if args.command and not os.path.isabs(args.command[0]):
        print("gpuwatchd drain-helper serve: --command must be an absolute path", file=sys.stderr)
        return EX_USAGE
    node = args.node or _default_node()
    if not _NODE_RE.fullmatch(node):
        print(f"gpuwatchd drain-helper serve: --node {node!r} is not a node name", file=sys.stderr)
        return EX_USAGE
    cfg = HelperConfig(
        node=node,
        mode=args.mode,
        allow_user=args.allow_user,
        scontrol=args.scontrol,
        sinfo=args.sinfo,
        command=tuple(args.command or ()),
        kubeconfig=args.kubeconfig,
        timeout=args.timeout,
    )
    fd = args.fd
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError as exc:
        print(f"gpuwatchd drain-helper serve: fd {fd} is not a socket: {exc}", file=sys.stderr)
        return EX_USAGE
    with sock:
        if sock.family != socket.AF_UNIX:
            print("gpuwatchd drain-helper serve: not an AF_UNIX connection", file=sys.stderr)
            return EX_USAGE
        reply = handle_connection(sock, cfg)
    return 0 if reply["ok"] else 1


def cmd_request(args: argparse.Namespace) -> int:
    env = os.environ
    request: dict[str, str] = {
        "action": args.action or env.get("GPUWATCHD_ACTION", ""),
        "reason": args.reason or env.get("GPUWATCHD_REASON", ""),
    }
    node = args.node or env.get("GPUWATCHD_NODE")
    if node:
        request["node"] = node
    incident = env.get("GPUWATCHD_INCIDENT")
    if incident:
        request["incident"] = incident
    if request["action"] == "claim":
        request = {"action": "claim", "claim": env.get("GPUWATCHD_CLAIM", "")}
    if request["action"] not in ACTIONS:
        print(
            "gpuwatchd drain-helper request: set --action or GPUWATCHD_ACTION to drain, "
            "resume or claim",
            file=sys.stderr,
        )
        return EX_USAGE
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
            sock.settimeout(args.timeout)
            sock.connect(args.socket)
            sock.sendall(json.dumps(request).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)
            data = _read_line(sock, 65536)
    except OSError as exc:
        print(f"gpuwatchd drain-helper request: {args.socket}: {exc}", file=sys.stderr)
        return EX_TEMPFAIL
    try:
        reply = json.loads(data)
        ok, detail = bool(reply["ok"]), str(reply["detail"])
    except (ValueError, KeyError, TypeError, RecursionError):
        print("gpuwatchd drain-helper request: no valid reply from the helper", file=sys.stderr)
        return EX_TEMPFAIL
    print(detail, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "drain-helper",
        help="the privileged side of draining (socket-activated) and its client",
        description="Drain or resume this node on behalf of the unprivileged daemon. "
        "See docs/install.md (privilege split).",
    )
    hs = p.add_subparsers(dest="helper_command", metavar="ACTION", required=True)

    s = hs.add_parser("serve", help="answer one request on a connected socket (as root)")
    s.add_argument(
        "--mode", choices=MODES, default="dry-run", help="how to drain (default dry-run)"
    )
    s.add_argument("--node", help="this node's scheduler name (default: short hostname)")
    s.add_argument("--allow-user", default="gpuwatchd", help="user allowed to ask (and root)")
    s.add_argument("--scontrol", default="/usr/bin/scontrol", help="scontrol path (slurm mode)")
    s.add_argument("--sinfo", default="/usr/bin/sinfo", help="sinfo path (slurm mode)")
    s.add_argument(
        "--kubeconfig",
        help="kubernetes mode: kubeconfig with the node-patching credential (root-only file); "
        "default: the in-cluster service account",
    )
    s.add_argument(
        "--command",
        nargs=argparse.REMAINDER,
        metavar="PATH [ARG ...]",
        help="command mode: absolute path and fixed arguments of a site program (must come "
        "last); it gets GPUWATCHD_ACTION, GPUWATCHD_NODE, GPUWATCHD_REASON, GPUWATCHD_INCIDENT",
    )
    s.add_argument("--fd", type=int, default=0, help="the connection's fd (default 0, stdin)")
    s.add_argument("--timeout", type=float, default=30.0, help="seconds for I/O and programs")
    s.set_defaults(func=cmd_serve)

    r = hs.add_parser("request", help="ask the helper to drain or resume (the exec drain hook)")
    r.add_argument("--action", choices=ACTIONS, help="default: $GPUWATCHD_ACTION")
    r.add_argument("--reason", help="default: $GPUWATCHD_REASON")
    r.add_argument("--node", help="default: $GPUWATCHD_NODE (checked by the helper)")
    r.add_argument("--socket", default=DEFAULT_SOCKET, help=f"default {DEFAULT_SOCKET}")
    r.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply")
    r.set_defaults(func=cmd_request)
