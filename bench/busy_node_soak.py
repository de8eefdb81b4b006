"""A busy NVLink node, watched: soak, cost and kernel-line-to-page latency in one run.

On a lent multi-GPU machine (through the device tool; never on a production node: it writes
real XIDs into the kernel log). Side by side for ``--seconds``:

- an NCCL all-reduce on ``--nccl-gpus`` (bench/nccl_load.py);
- four real daemons (``python3 -m gpuwatchd run``, the NVML worker process on): 1 s polls and
  the default 5 s, each once plainly and once under glibc's malloc checker
  (``LD_PRELOAD=libc_malloc_debug.so.0 MALLOC_CHECK_=3``); each reads the real /dev/kmsg and
  NVML events, and pages a loopback webhook; an always-firing ticket and a long group_wait
  keep each node's alert group busy, so a page held for batching would show;
- a plain pynvml loop reading the same values with the cheapest calls, at 1 s and at 5 s,
  and a bare pynvml process (nvmlInit, then sleep);
- real XID 31s provoked on ``--xid-gpu`` every ``--xid-every`` seconds.

It reports, per daemon: alive at the end, RSS over time (daemon and worker), CPU % of one
core over the measuring window (daemon, worker, per thread), kernel line -> webhook
latency (from this script reading the line in /dev/kmsg to the webhook arriving), pages per
GPU, alerts on the busy GPUs, NVLink links up, and ``check``'s exit code; the same CPU and
RSS for the plain loops and the bare process. ``--out DIR`` gets soak.json and soak.txt.

    PYTHONPATH=. python3 bench/busy_node_soak.py --seconds 420 --out "$OUT"
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchlib import (
    BENCH_XID31_RULE,
    XID31_PROGRAM,
    cpu_seconds,
    free_port,
    pct,
    status_value,
    thread_cpu_seconds,
)

CHECKER = {"LD_PRELOAD": "libc_malloc_debug.so.0", "MALLOC_CHECK_": "3"}

RULES = (
    "rules:\n"
    + BENCH_XID31_RULE
    + """- name: BenchBusyTicket
  description: Always firing (bench only), so the node's alert group is never quiet.
  severity: ticket
  condition:
    threshold:
      field: temperature_gpu
      op: '>'
      value: -100
  annotations:
    summary: 'bench ticket on GPU {gpu}'
"""
)


# -- the plain loop and the bare process (run as children of this script) ------------------
def plain_loop(
    interval: float, seconds: float, threads: bool = False, events: bool = False
) -> None:
    """The same values as the daemon, with the cheapest calls, at the daemon's cadences.
    ``threads``: one thread per GPU, reading at the same moments (as the NVML worker's
    per-GPU threads do); ``events``: a thread waiting on XID events meanwhile (10 s waits,
    as the worker)."""
    import pynvml as nv

    nv.nvmlInit()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
    # The daemon's GPU-wide field ids: every poll, and energy (83) and PCIe replays (94)
    # on the slow cadence. It drops an id the GPU answers NOT_SUPPORTED for and asks
    # nvmlDeviceGetMemoryErrorCounter instead of the HBM ECC ids 11/12 (H200 answers
    # NOT_SUPPORTED for them), and nvmlDeviceGetTotalEnergyConsumption instead of 83:
    # so does this loop, per GPU, from one probe.
    wanted = (82, 83, 3, 4, 11, 12, 5, 6, 142, 143, 144, 145, 94, 230)
    kept: list[set[int]] = []
    for h in handles:
        answers = nv.nvmlDeviceGetFieldValues(h, [(f, 0) for f in wanted])
        kept.append({f for f, a in zip(wanted, answers, strict=True) if a.nvmlReturn != 3})
    links = []
    for h in handles:
        n = 0
        for link in range(18):
            try:
                nv.nvmlDeviceGetNvLinkState(h, link)
                n += 1
            except nv.NVMLError:
                break
        links.append(n)
    if events:
        event_set = nv.nvmlEventSetCreate()
        for h in handles:
            nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, event_set)

        def wait_events() -> None:
            while True:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlEventSetWait(event_set, 10000)

        threading.Thread(target=wait_events, daemon=True).start()
    started = time.monotonic()

    def read(h: Any, n: int, ok: set[int], state: bool, slow: bool, counters: bool) -> None:
        calls: list[tuple[Any, tuple[Any, ...]]] = [
            (nv.nvmlDeviceGetTemperature, (0,)),
            (nv.nvmlDeviceGetPowerUsage, ()),
            (nv.nvmlDeviceGetClockInfo, (1,)),
            (nv.nvmlDeviceGetClockInfo, (2,)),
            (nv.nvmlDeviceGetUtilizationRates, ()),
            (nv.nvmlDeviceGetMemoryInfo, ()),
            (nv.nvmlDeviceGetCurrentClocksEventReasons, ()),
            (nv.nvmlDeviceGetRowRemapperHistogram, ()),
        ]
        calls += [
            (nv.nvmlDeviceGetMemoryErrorCounter, (kind, 0, 2))
            for kind, fid in ((0, 11), (1, 12))
            if fid not in ok
        ]
        batch = [(f, 0) for f in wanted if f in ok and (slow or f not in (83, 94))]
        if batch:
            calls.append((nv.nvmlDeviceGetFieldValues, (batch,)))
        for fn, args in calls:
            with contextlib.suppress(nv.NVMLError):
                fn(h, *args)
        if state:  # the daemon's poll.state_interval
            for fn, args in (
                (nv.nvmlDeviceGetCurrPcieLinkGeneration, ()),
                (nv.nvmlDeviceGetCurrPcieLinkWidth, ()),
                (nv.nvmlDeviceGetComputeRunningProcesses, ()),
            ):
                with contextlib.suppress(nv.NVMLError):
                    fn(h, *args)
            for link in range(n):
                nv.nvmlDeviceGetNvLinkState(h, link)
        if slow:
            slow_calls: list[tuple[Any, tuple[Any, ...]]] = [
                (nv.nvmlDeviceGetViolationStatus, (0,)),
                (nv.nvmlDeviceGetViolationStatus, (1,)),
                (nv.nvmlDeviceGetMarginTemperature, ()),
            ]
            if 83 not in ok:
                slow_calls.append((nv.nvmlDeviceGetTotalEnergyConsumption, ()))
            for fn, args in slow_calls:
                with contextlib.suppress(nv.NVMLError):
                    fn(h, *args)
        if counters and n:
            per_link = [(f, link) for link in range(n) for f in (161, 162, 163)]
            nv.nvmlDeviceGetFieldValues(h, per_link)

    def loop(gpus: list[tuple[Any, int, set[int]]]) -> None:
        end = started + seconds
        next_slow = next_links = next_state = started
        tick = started
        while time.monotonic() < end:
            now = time.monotonic()
            for h, n, ok in gpus:
                read(h, n, ok, now >= next_state, now >= next_slow, now >= next_links)
            if now >= next_state:
                next_state = now + 15.0
            if now >= next_slow:
                next_slow = now + 120.0
            if now >= next_links:
                next_links = now + 600.0
            tick += interval  # every thread on the same grid: they read at the same moments
            time.sleep(max(0.0, tick - time.monotonic()))

    pairs = list(zip(handles, links, kept, strict=True))
    if not threads:
        loop(pairs)
        return
    workers = [threading.Thread(target=loop, args=([p],)) for p in pairs]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def bare(seconds: float) -> None:
    import pynvml as nv

    nv.nvmlInit()
    time.sleep(seconds)


# -- measuring ----------------------------------------------------------------------------
T = TypeVar("T")


def _alive(read: Callable[[int], T], pid: int, gone: T) -> T:
    """``read(pid)``, or ``gone`` once the process has ended (a daemon that died)."""
    try:
        return read(pid)
    except OSError:
        return gone


def cpu_s(pid: int) -> float:
    return _alive(cpu_seconds, pid, 0.0)


def threads(pid: int) -> dict[str, float]:
    return _alive(thread_cpu_seconds, pid, {})


def rss_kib(pid: int) -> int:
    kib = _alive(lambda p: status_value(p, "VmRSS"), pid, 0.0)
    return 0 if kib != kib else int(kib)  # NaN: no VmRSS line (a zombie)


def children(pid: int) -> list[int]:
    """Direct children (the NVML worker), by their parent pid in /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry))
    return out


class Hooks:
    """The loopback webhook: (arrival, daemon, alertname, gpu, status) per alert."""

    def __init__(self) -> None:
        self.got: list[tuple[float, str, str, str, str]] = []
        self.lock = threading.Lock()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                now = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                name = self.path.rsplit("/", 1)[-1]
                with hooks.lock:
                    for a in json.loads(body).get("alerts", []):
                        lab = a.get("labels", {})
                        hooks.got.append(
                            (now, name, lab.get("alertname", ""), lab.get("gpu", ""), a["status"])
                        )
                self.send_response(200)
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


class KmsgWatch:
    """Reads the real /dev/kmsg from now on: the time each NVRM Xid line was read."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        fd = os.open("/dev/kmsg", os.O_RDONLY)
        os.lseek(fd, 0, os.SEEK_END)
        self.fd = fd
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                rec = os.read(self.fd, 8192).decode("utf-8", "replace")
            except OSError:
                continue
            if "NVRM: Xid" in rec:
                self.lines.append((time.monotonic(), rec.split(";", 1)[-1].strip()[:200]))


def start_daemon(
    name: str,
    interval: str,
    env_extra: dict[str, str],
    port: int,
    hook_port: int,
    tmp: Path,
    sources: str = "{kernel_log: kmsg, nvml_events: true}",
) -> dict[str, Any]:
    state = tmp / name
    state.mkdir()
    (tmp / "bench-rules.yaml").write_text(RULES)
    poll = f"poll: {{interval: {interval}}}\n" if interval != "default" else ""
    cfg = state / "gpuwatchd.yaml"
    cfg.write_text(
        f"node_name: soak-{name}\nstate_dir: {state}\n{poll}"
        f"sources: {sources}\n"
        f"rules: {{files: [{tmp / 'bench-rules.yaml'}], disable: [GpuXidApplicationRepeated]}}\n"
        f'receivers:\n  - {{name: hook, type: webhook, url: "http://127.0.0.1:{hook_port}/{name}"}}\n'
        "routing: {group_by: [node], group_wait: 15s, repeat_interval: 4h}\n"
    )
    env = {**os.environ, **env_extra, "PYTHONFAULTHANDLER": "1"}
    log = (state / "daemon.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuwatchd", "run", "-c", str(cfg), "--listen", f"127.0.0.1:{port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    return {"name": name, "proc": proc, "port": port, "cfg": cfg, "log": state / "daemon.log"}


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return bytes(r.read())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=420.0)
    ap.add_argument("--warmup", type=float, default=60.0)
    ap.add_argument("--xid-gpu", type=int, default=0)
    ap.add_argument("--xid-every", type=float, default=8.0)
    ap.add_argument("--nccl-gpus", default="")
    ap.add_argument("--out", default=".")
    ap.add_argument("--cost-only", action="store_true", help="no checker daemons, no XIDs")
    ap.add_argument("--plain", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--plain-threads", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--plain-events", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain:
        plain_loop(args.plain, args.seconds, args.plain_threads, args.plain_events)
        return 0
    if args.bare:
        bare(args.seconds)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    import pynvml as nv

    nv.nvmlInit()
    n = nv.nvmlDeviceGetCount()
    nv.nvmlShutdown()
    nccl = args.nccl_gpus or ",".join(str(g) for g in range(n) if g != args.xid_gpu or n <= 2)
    total = args.seconds + 30
    procs: dict[str, subprocess.Popen[bytes]] = {}
    procs["nccl"] = subprocess.Popen(
        [sys.executable, "bench/nccl_load.py", "--gpus", nccl, "--seconds", str(total)],
        env=os.environ,  # nccl_load.py sets the NVLS variables itself
        stdout=(tmp / "nccl.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    time.sleep(15 if args.cost_only else 20)  # NCCL up: compute processes on the GPUs
    hooks = Hooks()
    kmsg = KmsgWatch()
    daemons = [
        start_daemon(name, interval, env, free_port(), hooks.port, tmp)
        for name, interval, env in (
            ("1s", "1s", {}),
            ("default", "default", {}),
            ("1s-checker", "1s", CHECKER),
            ("default-checker", "default", CHECKER),
        )
        if not (args.cost_only and env)
    ]
    me = Path(__file__).resolve()
    for name, extra in (
        ("plain-1s", ["--plain", "1"]),
        ("plain-5s", ["--plain", "5"]),
        ("bare", ["--bare"]),
    ):
        procs[name] = subprocess.Popen([sys.executable, str(me), *extra, "--seconds", str(total)])
    start = time.monotonic()
    stop = threading.Event()
    launches: list[float] = []

    def provoke() -> None:
        time.sleep(15)
        while not stop.wait(args.xid_every):
            launches.append(time.monotonic())
            subprocess.run(
                [sys.executable, "-c", XID31_PROGRAM],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": str(args.xid_gpu)},
                capture_output=True,
                timeout=60,
                check=False,
            )

    if not args.cost_only:
        threading.Thread(target=provoke, daemon=True).start()
    rss: dict[str, list[tuple[float, int, int]]] = {d["name"]: [] for d in daemons}
    cpu0: dict[str, Any] = {}
    while time.monotonic() - start < args.seconds:
        time.sleep(5 if args.cost_only else 10)
        t = round(time.monotonic() - start)
        for d in daemons:
            kids = children(d["proc"].pid)
            rss[d["name"]].append((t, rss_kib(d["proc"].pid), sum(rss_kib(k) for k in kids)))
        if not cpu0 and time.monotonic() - start >= args.warmup:
            cpu0 = {"t": time.monotonic()}
            for d in daemons:
                pid = d["proc"].pid
                cpu0[d["name"]] = (
                    cpu_s(pid),
                    {k: cpu_s(k) for k in children(pid)},
                    threads(pid),
                    {k: threads(k) for k in children(pid)},
                )
            for name in ("plain-1s", "plain-5s", "bare"):
                cpu0[name] = cpu_s(procs[name].pid)
    window = time.monotonic() - cpu0["t"]
    stop.set()
    report: dict[str, Any] = {
        "gpus": n,
        "nccl_gpus": nccl,
        "xid_gpu": args.xid_gpu,
        "window_s": round(window, 1),
        "xid_lines": len(kmsg.lines),
        "launches": len(launches),
        "daemons": {},
        "others": {},
    }
    for name in ("plain-1s", "plain-5s", "bare"):
        p = procs[name]
        report["others"][name] = {
            "cpu_pct": round((cpu_s(p.pid) - cpu0[name]) / window * 100, 4),
            "rss_kib": rss_kib(p.pid),
        }
    for d in daemons:
        name, proc = d["name"], d["proc"]
        r: dict[str, Any] = {"alive": proc.poll() is None, "exit": proc.poll()}
        if name in cpu0:
            c_main, c_kids, c_threads, c_kid_threads = cpu0[name]
            kids = children(proc.pid)
            main_pct = (cpu_s(proc.pid) - c_main) / window * 100
            kid_pct = sum(cpu_s(k) - c_kids.get(k, 0) for k in kids) / window * 100
            r["cpu_pct_daemon"] = round(main_pct, 4)
            r["cpu_pct_worker"] = round(kid_pct, 4)
            r["cpu_pct_total"] = round(main_pct + kid_pct, 4)
            now_threads = threads(proc.pid)
            r["cpu_pct_threads"] = {
                k: round((v - c_threads.get(k, 0)) / window * 100, 4)
                for k, v in sorted(now_threads.items())
                if v - c_threads.get(k, 0) > 0
            }
            if kids:
                before = c_kid_threads.get(kids[0], {})  # empty: a worker restarted since
                r["worker_threads"] = {
                    k: round((v - before.get(k, 0.0)) / window * 100, 4)
                    for k, v in sorted(threads(kids[0]).items())
                    if v - before.get(k, 0.0) > 0
                }
        r["rss_kib"] = rss[name]
        mine = [g for g in hooks.got if g[1] == name]
        pages = [g for g in mine if g[2] == "BenchXid31" and g[4] == "firing"]
        r["pages"] = len(pages)
        r["pages_by_gpu"] = {
            gpu: sum(1 for g in pages if g[3] == gpu) for gpu in {g[3] for g in pages}
        }
        r["other_alerts"] = sorted(
            {(g[2], g[3]) for g in mine if g[2] not in ("BenchXid31", "BenchBusyTicket")}
        )
        lat = []
        for t_line, _ in kmsg.lines:
            after = [g[0] for g in pages if g[0] >= t_line - 0.001]
            if after:
                lat.append((min(after) - t_line) * 1000)
        r["line_to_page_ms"] = {
            "n": len(lat),
            "p50": round(pct(lat, 0.5), 1) if lat else None,
            "p99": round(pct(lat, 0.99), 1) if lat else None,
            "max": round(max(lat), 1) if lat else None,
        }
        if r["alive"]:
            try:
                text = get(f"http://127.0.0.1:{d['port']}/metrics").decode()
                ups = [ln for ln in text.splitlines() if ln.startswith("gpuwatchd_nvlink_up{")]
                r["nvlink_links"] = len(ups)
                r["nvlink_links_up"] = sum(1 for ln in ups if float(ln.rsplit(" ", 1)[1]) == 1.0)
                status = json.loads(get(f"http://127.0.0.1:{d['port']}/api/v1/status"))
                r["gpu_status"] = {str(g["index"]): g["status"] for g in status["gpus"]}
                r["firing"] = sorted(
                    {(a["rule"], str(a["labels"].get("gpu"))) for a in status["alerts"]}
                )
                r["nvml_worker"] = status.get("nvml_worker")
            except OSError as exc:
                r["scrape_error"] = str(exc)
            chk = subprocess.run(
                [sys.executable, "-m", "gpuwatchd", "check", "-c", str(d["cfg"])],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            r["check_exit"] = chk.returncode
            r["check_out"] = chk.stdout[-400:]
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        tail = Path(d["log"]).read_bytes()[-3000:].decode("utf-8", "replace")
        r["log_tail"] = tail if not r["alive"] or "Traceback" in tail else tail[-600:]
        report["daemons"][name] = r
    for p in procs.values():
        p.kill()
    text = json.dumps(report, indent=1, default=str)
    (out / "soak.json").write_text(text)
    summary = cost_summary(report)
    (out / "soak.txt").write_text(summary)
    print(summary)
    return 0


def cost_summary(report: dict[str, Any]) -> str:
    """CPU side by side: each daemon (process + NVML worker) against the plain loop at its
    interval, as a ratio, with the per-thread split."""
    lines = [f"{report['gpus']} GPUs, NCCL on {report['nccl_gpus']}, {report['window_s']} s window"]
    others = report["others"]
    for name, d in report["daemons"].items():
        if "cpu_pct_total" not in d:
            lines.append(f"{name:16s} no CPU reading (alive={d['alive']})")
            continue
        plain = others["plain-1s" if name.startswith("1s") else "plain-5s"]["cpu_pct"]
        ratio = d["cpu_pct_total"] / plain if plain else float("nan")
        lines.append(
            f"{name:16s} {d['cpu_pct_total']:.4f} % of a core (daemon {d['cpu_pct_daemon']:.4f}"
            f" + worker {d['cpu_pct_worker']:.4f}) vs plain {plain:.4f} %: {ratio:.2f}x;"
            f" alive={d['alive']} pages={d['pages']} p99={d['line_to_page_ms']['p99']} ms"
        )
        for part in ("cpu_pct_threads", "worker_threads"):
            split = ", ".join(f"{k} {v:.4f}" for k, v in d.get(part, {}).items())
            lines.append(f"    {part}: {split}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
