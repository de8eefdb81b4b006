"""The VM test's guest side: checks the installed gpuwatchd package under a live systemd.

Runs inside the Debian 12 guest that tests/vm/image.py builds (standard library only, the
guest's /usr/bin/python3). Two commands:

    vmcheck.py receiver   a webhook receiver on 127.0.0.1:9099 (vmcheck-receiver.service);
                          every POST body is appended to received.jsonl with the boot id
    vmcheck.py check      the checks (vmcheck.service): boot 1 runs the first half and
                          reboots; boot 2 runs the rest and powers the guest off

Every check writes one JSON line to /dev/ttyS1 (the host reads it from a file) and to
results.jsonl: {"boot": 1|2, "check": NAME, "ok": bool, "detail": ..., "diag": ...}. A
failed check carries systemctl status and journal lines in "diag". The host side asserts.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

STATE = Path("/var/lib/vmcheck")
RECEIVED = STATE / "received.jsonl"
RESULTS = STATE / "results.jsonl"
PHASE1 = STATE / "phase1.json"
REPORT_TTY = "/dev/ttyS1"
METRICS = "http://127.0.0.1:9835/metrics"
MODULE = "/usr/local/share/vmcheck/xid_printk.ko"
PARAM = "/sys/module/xid_printk/parameters/line"
UNIT = "gpuwatchd.service"
# Scenario bus ids: GPU 0 18, GPU 1 2A, GPU 2 3A, GPU 3 5D.
XID_GPU1 = "NVRM: Xid (PCI:0000:2a:00): 79, pid=1234, name=python3, GPU has fallen off the bus."
FORGED_GPU2 = "NVRM: Xid (PCI:0000:3a:00): 79, pid=4321, name=python3, GPU has fallen off the bus."


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


# -- receiver ---------------------------------------------------------------------------


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = min(int(self.headers.get("Content-Length", "0")), 1 << 20)
        body = self.rfile.read(length)
        try:
            doc = json.loads(body)
        except ValueError:
            doc = {"unparsed": body.decode("utf-8", "replace")}
        line = json.dumps({"boot": boot_id(), "at": time.time(), "body": doc})
        with RECEIVED.open("a") as f:
            f.write(line + "\n")
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


def receiver() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    ThreadingHTTPServer(("127.0.0.1", 9099), _Hook).serve_forever()
    return 0


# -- helpers ----------------------------------------------------------------------------


def sh(
    *argv: str, check: bool = False, timeout: float = 60, **kw: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout, **kw)


def show(*props: str, unit: str = UNIT) -> dict[str, str]:
    out = sh("systemctl", "show", unit, "-p", ",".join(props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def diagnostics() -> str:
    parts = [
        sh(
            "systemctl", "status", "--no-pager", "-l", "-n", "0", UNIT, "gpuwatchd-drain.socket"
        ).stdout,
        sh(
            "journalctl",
            "-b",
            "--no-pager",
            "-o",
            "short-monotonic",
            "-n",
            "60",
            "-u",
            UNIT,
            "-u",
            "gpuwatchd-drain@*",
            "-u",
            "vmcheck-receiver.service",
        ).stdout,
    ]
    return "\n".join(parts)[-6000:]


class Reporter:
    def __init__(self, boot: int) -> None:
        self.boot = boot
        self.failed = 0

    def __call__(self, check: str, ok: bool, detail: Any = "") -> bool:
        rec: dict[str, Any] = {
            "boot": self.boot,
            "check": check,
            "ok": bool(ok),
            "uptime": float(Path("/proc/uptime").read_text().split()[0]),
            "detail": detail,
        }
        if not ok:
            self.failed += 1
            rec["diag"] = diagnostics()
        line = json.dumps(rec, default=str)
        with RESULTS.open("a") as f:
            f.write(line + "\n")
        with open(REPORT_TTY, "w") as tty:
            tty.write(line + "\n")
        return bool(ok)

    def run(self, check: str, fn: Callable[[], tuple[bool, Any]]) -> bool:
        try:
            ok, detail = fn()
        except Exception as exc:  # a check that crashes is a failed check, with the reason
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        return self(check, ok, detail)


def wait_for(pred: Callable[[], Any], timeout: float, step: float = 0.25) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= end:
            return value
        time.sleep(step)


def metrics() -> dict[str, float]:
    out: dict[str, float] = {}
    with urllib.request.urlopen(METRICS, timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                with contextlib.suppress(ValueError):
                    out[name] = float(value)
    return out


def metric(name: str, default: float = 0.0) -> float:
    try:
        return metrics().get(name, default)
    except OSError:
        return default


def received() -> list[dict[str, Any]]:
    if not RECEIVED.exists():
        return []
    return [json.loads(x) for x in RECEIVED.read_text().splitlines() if x.strip()]


def alerts(status: str | None = None, name: str | None = None) -> list[dict[str, Any]]:
    """Every alert of every webhook message so far, with the message's boot id added."""
    out = []
    for msg in received():
        for a in msg["body"].get("alerts", []):
            labels = a.get("labels", {})
            if status is not None and a.get("status") != status:
                continue
            if name is not None and labels.get("alertname") != name:
                continue
            out.append({**a, "boot": msg["boot"]})
    return out


def drain_lines() -> list[str]:
    """What the site drain command was asked, as the helper logged it (every boot)."""
    out = sh("journalctl", "--no-pager", "-o", "cat", "-u", "gpuwatchd-drain@*").stdout
    marker = "vm-drain-record action="
    return [x[x.index(marker) :] for x in out.splitlines() if marker in x]


def active() -> bool:
    return show("ActiveState")["ActiveState"] == "active"


def main_pid() -> int:
    return int(show("MainPID")["MainPID"])


def proc_status(pid: int) -> dict[str, str]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        out[key] = value.strip()
    return out


def mounts_of(pid: int) -> dict[str, str]:
    """Mount point -> options, as the process sees them."""
    out = {}
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        f = line.split()
        out[f[4]] = f[5]
    return out


def printk(line: str) -> None:
    with open(PARAM, "w") as f:
        f.write(line)


# -- boot 1 -----------------------------------------------------------------------------


def check_package_files() -> tuple[bool, Any]:
    """Every path the package points operators to exists; the docs link to each other."""
    wanted = {
        "/usr/share/doc/gpuwatchd/docs/install.md",
        "/usr/share/doc/gpuwatchd/docs/config.md",
        "/usr/share/doc/gpuwatchd/docs/actions.md",
        "/usr/share/gpuwatchd/rules/schema.json",
        "/usr/share/man/man8/gpuwatchd.8.gz",
    }
    for unit in ("gpuwatchd.service", "gpuwatchd-drain.socket", "gpuwatchd-drain@.service"):
        docs = show("Documentation", unit=unit).get("Documentation", "")
        wanted.update(d.removeprefix("file://") for d in docs.split() if d.startswith("file://"))
    man = gzip.decompress(Path("/usr/share/man/man8/gpuwatchd.8.gz").read_bytes()).decode()
    pointers = Path("/usr/bin/gpuwatchd").read_text() + man
    pointers += Path("/etc/default/gpuwatchd-drain").read_text()
    wanted.update(
        p.rstrip(".,)")
        for p in re.findall(r"/usr/share/(?:doc/)?gpuwatchd/[\w./-]+", pointers)
        if not p.endswith("/")
    )
    missing = sorted(p for p in wanted if not Path(p).exists())
    doc_root = Path("/usr/share/doc/gpuwatchd")
    broken = []
    for md in sorted(doc_root.rglob("*.md")):
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if ":" in target:  # https:, mailto:, file:
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md}: {target}")
    scenarios = sorted(p.name for p in Path("/usr/share/gpuwatchd/scenarios").glob("*.yaml"))
    ok = not missing and not broken and bool(scenarios)
    return ok, {
        "missing": missing,
        "broken_links": broken,
        "checked": sorted(wanted),
        "scenarios": scenarios,
    }


def check_ready() -> tuple[bool, Any]:
    """Type=notify: systemd calls the unit active only after READY=1; STATUS= is shown."""
    ok = wait_for(active, 120)
    s = show("Type", "NotifyAccess", "ActiveState", "SubState", "StatusText", "MainPID", "Result")
    ok = ok and s["Type"] == "notify" and bool(s["StatusText"])
    started = sh("journalctl", "-b", "-u", UNIT, "--no-pager", "-o", "cat").stdout
    return ok and "Started gpuwatchd.service" in started, s


def check_hardening() -> tuple[bool, Any]:
    pid = main_pid()
    st = proc_status(pid)
    user = pwd.getpwnam("gpuwatchd")
    journal_gid = str(sh("getent", "group", "systemd-journal").stdout.split(":")[2])
    mnt = mounts_of(pid)
    marker = Path("/tmp/vmcheck-host-tmp")
    marker.write_text("x")
    kmsg_mode = os.stat(f"/proc/{pid}/root/dev/kmsg").st_mode & 0o777
    found = {
        "uid": st["Uid"].split(),
        "gid": st["Gid"].split(),
        "groups": st["Groups"].split(),
        "CapEff": st["CapEff"],
        "CapBnd": st["CapBnd"],
        "CapAmb": st["CapAmb"],
        "NoNewPrivs": st["NoNewPrivs"],
        "Seccomp": st["Seccomp"],
        "root_mount": mnt.get("/", ""),
        "state_mount": mnt.get("/var/lib/gpuwatchd", ""),
        "home_mount": mnt.get("/home", "none"),
        "private_tmp": not Path(f"/proc/{pid}/root{marker}").exists(),
        "dev_kmsg_mode": oct(kmsg_mode),
        "DevicePolicy": show("DevicePolicy")["DevicePolicy"],
    }
    uid = str(user.pw_uid)
    ok = (
        set(found["uid"]) == {uid}
        and set(found["gid"]) == {str(user.pw_gid)}
        and journal_gid in found["groups"]
        and int(st["CapEff"], 16) == 0
        and int(st["CapBnd"], 16) == 0
        and int(st["CapAmb"], 16) == 0
        and st["NoNewPrivs"] == "1"
        and st["Seccomp"] == "2"
        and found["root_mount"].startswith("ro")
        and found["state_mount"].startswith("rw")
        and found["home_mount"].startswith("ro")
        and found["private_tmp"]
        and kmsg_mode == 0
        and found["DevicePolicy"] == "closed"
    )
    # The unit's filter lines really bite: setpriority (@resources), which any user may
    # call to lower its own priority, fails with EPERM under them. The probe unit copies
    # the shipped unit's lines (no D-Bus in the guest, so no systemd-run).
    lines = [
        x
        for x in Path("/lib/systemd/system/gpuwatchd.service").read_text().splitlines()
        if x.startswith(
            (
                "SystemCallFilter=",
                "SystemCallErrorNumber=",
                "SystemCallArchitectures=",
                "NoNewPrivileges=",
                "User=",
                "Group=",
            )
        )
    ]
    Path("/run/systemd/system/vmcheck-seccomp.service").write_text(
        "[Service]\nType=oneshot\nStandardOutput=journal\n" + "\n".join(lines) + "\n"
        "ExecStart=/usr/bin/python3 -c \"import os; os.nice(1); print('nice allowed')\"\n"
    )
    sh("systemctl", "daemon-reload")
    sh("systemctl", "start", "vmcheck-seccomp.service", timeout=60)
    probe = sh("journalctl", "-b", "-u", "vmcheck-seccomp.service", "--no-pager", "-o", "cat")
    found["seccomp_probe"] = [x for x in probe.stdout.splitlines() if "nice" in x or "Error" in x][
        -2:
    ]
    found["seccomp_lines"] = lines
    security = sh("systemd-analyze", "security", UNIT).stdout
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", security)
    found["exposure"] = m.group(1) if m else security[-300:]
    ok = ok and any("Operation not permitted" in x for x in found["seccomp_probe"])
    ok = ok and m is not None and float(m.group(1)) <= 2.5
    return ok, found


def check_reload() -> tuple[bool, Any]:
    """systemctl reload: RELOADING=1 ... READY=1, same process, the new rule loaded."""
    before = metric("gpuwatchd_rules_loaded")
    pid = main_pid()
    Path("/etc/gpuwatchd/rules.d/vm.yaml").write_text(
        "rules:\n"
        "- name: VmReloadProbe\n"
        "  description: Added by the VM test before systemctl reload.\n"
        "  severity: info\n"
        "  condition:\n"
        "    threshold: {field: temperature_gpu, op: '>', value: 1000}\n"
        "  annotations:\n"
        "    summary: never fires\n"
    )
    since = time.time()
    r = sh("systemctl", "reload", UNIT, timeout=90)
    after = wait_for(
        lambda: metric("gpuwatchd_rules_loaded") > before and metric("gpuwatchd_rules_loaded"), 20
    )
    log = sh(
        "journalctl", "-u", UNIT, "--since", f"@{int(since) - 1}", "--no-pager", "-o", "cat"
    ).stdout
    detail = {
        "rc": r.returncode,
        "stderr": r.stderr.strip(),
        "rules_before": before,
        "rules_after": after,
        "same_pid": main_pid() == pid,
        "state": show("ActiveState", "SubState"),
        "log": [x for x in log.splitlines() if "eload" in x],
    }
    ok = (
        r.returncode == 0
        and bool(after)
        and detail["same_pid"]
        and active()
        and any("Reloaded gpuwatchd.service" in x for x in detail["log"])
        and any("reloaded configuration" in x for x in detail["log"])
    )
    return ok, detail


def check_kernel_xid() -> tuple[bool, Any]:
    """A kernel-written XID 79 pages and drains through the socket-activated helper."""
    r = sh("insmod", MODULE)
    if r.returncode != 0:
        return False, f"insmod {MODULE}: {r.stderr.strip()}"
    before = len(alerts("firing", "GpuXidFatal"))
    t0 = time.monotonic()
    printk(XID_GPU1)
    paged = wait_for(lambda: len(alerts("firing", "GpuXidFatal")) > before, 60)
    page_s = time.monotonic() - t0
    drained = wait_for(lambda: any("action=drain" in x for x in drain_lines()), 60)
    drain_s = time.monotonic() - t0
    entry = sh(
        "journalctl", "-k", "-b", "-o", "json", "--no-pager", "-g", "NVRM: Xid"
    ).stdout.splitlines()
    fields = json.loads(entry[-1]) if entry else {}
    detail = {
        "page_s": round(page_s, 2),
        "drain_s": round(drain_s, 2),
        "journal": {k: fields.get(k) for k in ("_TRANSPORT", "SYSLOG_FACILITY", "MESSAGE")},
        "drains": drain_lines(),
        "alert": alerts("firing", "GpuXidFatal")[-1:] if paged else None,
        "xid_lines": metric('gpuwatchd_kernel_log_xid_lines_total{source="journald"}'),
    }
    ok = bool(paged) and bool(drained) and fields.get("_TRANSPORT") == "kernel"
    return ok, detail


def _as_nobody(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return sh("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", *argv, **kw)


FORGED = 'gpuwatchd_kernel_log_forged_lines_total{source="journald"}'


def check_forgeries() -> tuple[bool, Any]:
    """Every way a local user (or root's userspace) can put the line into the log: each
    is counted as forged; none pages or drains."""
    pages0 = len(alerts("firing"))
    drains0 = len(drain_lines())
    native = (
        "import socket, sys\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n"
        "msg = 'MESSAGE=%s\\nSYSLOG_IDENTIFIER=kernel\\nSYSLOG_FACILITY=0\\n"
        "_TRANSPORT=kernel\\nPRIORITY=3\\n' % sys.argv[1]\n"
        "s.sendto(msg.encode(), '/run/systemd/journal/socket')\n"
    )
    tries: dict[str, Callable[[], subprocess.CompletedProcess[str]]] = {
        "logger": lambda: _as_nobody("logger", "-t", "kernel", FORGED_GPU2),
        "logger_kern_facility": lambda: _as_nobody(
            "logger", "-p", "kern.err", "-t", "kernel", FORGED_GPU2
        ),
        "systemd-cat": lambda: _as_nobody("systemd-cat", "-t", "kernel", "echo", FORGED_GPU2),
        "journal_native": lambda: _as_nobody("/usr/bin/python3", "-c", native, FORGED_GPU2),
        "dev_kmsg_root": lambda: sh("sh", "-c", f"printf '<3>%s\\n' '{FORGED_GPU2}' > /dev/kmsg"),
        # The kernel itself echoes the option text: tmpfs: Unknown parameter '...'.
        "tmpfs_userns": lambda: _as_nobody(
            "unshare",
            "-Ur",
            "-m",
            "--",
            "mount",
            "-t",
            "tmpfs",
            "-o",
            FORGED_GPU2.replace(",", ""),
            "none",
            "/mnt",
        ),
    }
    detail: dict[str, Any] = {}
    for name, fn in tries.items():
        before = metric(FORGED)
        r = fn()
        counted = wait_for(lambda b=before: metric(FORGED) > b, 15)
        detail[name] = {
            "rc": r.returncode,
            "counted": bool(counted),
            "stderr": r.stderr.strip()[:160],
        }
    echoed = sh("journalctl", "-k", "-b", "--no-pager", "-o", "cat", "-g", "tmpfs: Unknown").stdout
    time.sleep(3)  # give a wrong page or drain the time to happen
    detail["kernel_echo"] = echoed.strip()[-200:]
    detail["new_pages"] = [
        a["labels"]
        for a in alerts("firing")[pages0:]
        if "3A:00" in a["labels"].get("pci_bus_id", "")
    ]
    detail["new_drains"] = drain_lines()[drains0:]
    ok = (
        all(v["counted"] for k, v in detail.items() if k in tries)
        and not detail["new_pages"]
        and not detail["new_drains"]
        and "Unknown parameter" in echoed
    )
    return ok, detail


def check_watchdog() -> tuple[bool, Any]:
    """SIGSTOP: systemd's watchdog kills and restarts the daemon; nothing is sent twice."""
    dropin = Path("/run/systemd/system/gpuwatchd.service.d/vm-watchdog.conf")
    dropin.parent.mkdir(parents=True, exist_ok=True)
    # Shorter times than the shipped 60 s / 5 s, to keep the test fast; same mechanism.
    dropin.write_text("[Service]\nWatchdogSec=8s\nRestartSec=1s\nTimeoutAbortSec=3s\n")
    sh("systemctl", "daemon-reload", check=True)
    sh("systemctl", "restart", UNIT, check=True, timeout=120)
    wait_for(active, 60)
    time.sleep(3)
    sent0 = len(received())
    restarts0 = int(show("NRestarts")["NRestarts"])
    pid = main_pid()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    restarted = wait_for(
        lambda: int(show("NRestarts")["NRestarts"]) > restarts0 and active() and main_pid() != pid,
        90,
    )
    took = time.monotonic() - t0
    time.sleep(5)  # the restarted daemon would resend now if it were going to
    log = sh("journalctl", "-b", "-u", UNIT, "--no-pager", "-o", "cat", "-g", "atchdog").stdout
    dropin.unlink()
    sh("systemctl", "daemon-reload")
    detail = {
        "restart_after_s": round(took, 1),
        "log": log.strip().splitlines()[-3:],
        "sent_after_restart": [m["body"].get("status") for m in received()[sent0:]],
        "drains": drain_lines(),
    }
    ok = (
        bool(restarted)
        and "Watchdog timeout" in log
        and not received()[sent0:]
        and len([x for x in drain_lines() if "action=drain" in x]) == 1
    )
    return ok, detail


def boot1(report: Reporter) -> bool:
    """The first boot's checks; True when the guest is rebooting into the second."""
    report.run("package_files", check_package_files)
    if not report.run("ready_status", check_ready):
        return False
    report.run("hardening", check_hardening)
    report.run(
        "remap_ticket",
        lambda: (
            bool(wait_for(lambda: alerts("firing", "GpuRowRemapPending"), 30)),
            alerts("firing", "GpuRowRemapPending")[-1:],
        ),
    )
    report.run("reload", check_reload)
    report.run("kernel_xid_page_drain", check_kernel_xid)
    report.run("forgeries", check_forgeries)
    report.run("watchdog", check_watchdog)
    PHASE1.write_text(
        json.dumps(
            {
                "boot_id": boot_id(),
                "received": len(received()),
                "drains": len(drain_lines()),
                "xid_pages": len(alerts("firing", "GpuXidFatal")),
            }
        )
    )
    report("reboot", True, "rebooting")
    sh("systemctl", "reboot", "--no-block")
    return True


# -- boot 2 -----------------------------------------------------------------------------


def check_after_reboot(before: dict[str, Any]) -> tuple[bool, Any]:
    """The journal cursor resumes (boot 1's XID is not read again, so it does not page
    again); GPU 0's remap, still pending in a new boot, escalates to a page and a drain."""
    up = wait_for(active, 120)
    escalated = wait_for(
        lambda: [
            a
            for a in alerts("firing", "GpuRowRemapPending")
            # gpuwatchd's own severity (``severity`` carries Alertmanager's mapped label)
            if a["boot"] == boot_id() and a["labels"].get("gpuwatchd_severity") == "page"
        ],
        60,
    )

    def drain_log() -> list[str]:
        out = sh("journalctl", "-b", "-u", UNIT, "--no-pager", "-o", "cat").stdout
        return [x for x in out.splitlines() if x.startswith("drain ")]

    drained = wait_for(drain_log, 60)
    time.sleep(3)
    daemon_log = sh("journalctl", "-b", "-u", UNIT, "--no-pager", "-o", "cat").stdout
    first_starts = {
        a.get("startsAt") for a in alerts("firing", "GpuXidFatal") if a["boot"] == before["boot_id"]
    }
    new_xid_alerts = [
        a
        for a in alerts("firing", "GpuXidFatal")
        if a["boot"] == boot_id() and a.get("startsAt") not in first_starts
    ]
    detail = {
        "old_boot": before["boot_id"],
        "new_boot": boot_id(),
        "escalated": escalated[-1:] if escalated else None,
        "drain_log": drained,
        "new_xid_alerts": new_xid_alerts,
        "xid_lines_read_this_boot": metric(
            'gpuwatchd_kernel_log_xid_lines_total{source="journald"}'
        ),
        "xid_logged_this_boot": [x for x in daemon_log.splitlines() if "XID 79 on GPU 1" in x],
        "state_dir": sorted(p.name for p in Path("/var/lib/gpuwatchd").iterdir()),
    }
    ok = (
        bool(up)
        and before["boot_id"] != boot_id()
        and bool(escalated)
        and bool(drained)
        and not new_xid_alerts
        and detail["xid_lines_read_this_boot"] == 0
        and not detail["xid_logged_this_boot"]
    )
    return ok, detail


def check_remove_purge() -> tuple[bool, Any]:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    rm = sh("apt-get", "remove", "-y", "gpuwatchd", env=env, timeout=180)
    after_remove = {
        "rc": rm.returncode,
        "unit_state": show("LoadState", "ActiveState"),
        "config_kept": Path("/etc/gpuwatchd/gpuwatchd.yaml").exists(),
        "state_kept": Path("/var/lib/gpuwatchd").is_dir(),
        "program_gone": not Path("/usr/bin/gpuwatchd").exists(),
    }
    pg = sh("apt-get", "purge", "-y", "gpuwatchd", env=env, timeout=180)
    after_purge = {
        "rc": pg.returncode,
        # the edited conffile goes; the rule file the administrator added stays
        "conffile_gone": not Path("/etc/gpuwatchd/gpuwatchd.yaml").exists(),
        "admin_file_kept": Path("/etc/gpuwatchd/rules.d/vm.yaml").exists(),
        "state_gone": not Path("/var/lib/gpuwatchd").exists(),
        "enable_link_gone": not Path(
            "/etc/systemd/system/multi-user.target.wants/gpuwatchd.service"
        ).exists(),
        "dpkg": sh("dpkg-query", "-W", "-f=${db:Status-Abbrev}", "gpuwatchd").stdout.strip(),
        "user_kept": bool(sh("getent", "passwd", "gpuwatchd").stdout),
    }
    ok = (
        rm.returncode == 0
        and after_remove["unit_state"].get("ActiveState") == "inactive"
        and after_remove["config_kept"]
        and after_remove["state_kept"]
        and after_remove["program_gone"]
        and pg.returncode == 0
        and after_purge["conffile_gone"]
        and after_purge["admin_file_kept"]
        and after_purge["state_gone"]
        and after_purge["enable_link_gone"]
        and after_purge["dpkg"] in ("", "un")
    )
    return ok, {
        "remove": after_remove,
        "purge": after_purge,
        "output": (rm.stdout + rm.stderr + pg.stdout + pg.stderr)[-1500:],
    }


def boot2(report: Reporter) -> None:
    before = json.loads(PHASE1.read_text())
    report.run("reboot_resume_escalate", lambda: check_after_reboot(before))
    report.run("remove_purge", check_remove_purge)


def check() -> int:
    STATE.mkdir(parents=True, exist_ok=True)
    second = PHASE1.exists()
    report = Reporter(2 if second else 1)
    try:
        if second:
            boot2(report)
        elif boot1(report):
            return 0
    except Exception as exc:
        report("crash", False, f"{type(exc).__name__}: {exc}")
    report("done", True, {"failed": report.failed})
    sh("systemctl", "poweroff", "--no-block")
    return 0


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else ""
    if command == "receiver":
        sys.exit(receiver())
    if command == "check":
        sys.exit(check())
    print("usage: vmcheck.py receiver|check", file=sys.stderr)
    sys.exit(2)
