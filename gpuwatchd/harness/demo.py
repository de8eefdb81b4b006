"""``gpuwatchd demo``: the real daemon on a bundled fault scenario, sped up to about a minute.

The scenario backend runs on a ``DemoClock`` (a ``ScaledClock``: node time runs
``duration / seconds`` times faster than wall time); the daemon polls on worker threads
and serves /metrics exactly as ``run`` does. A narrator prints the story: the scenario's
notes, what gpuwatchd notices (lost or stale GPUs, XIDs, rising ECC counters, throttling,
temperatures near the slowdown threshold), how long before a double-bit error a
memory rule drained the node or paged (the lead times), then a summary of what is still
firing.

The story is played to its end whatever the speed: when the clock passes the scenario's
end, the demo waits until the daemon has caught up (every scripted kernel line and NVML
event read, every GPU polled and the rules evaluated after the end) before it sums up.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

from gpuwatchd.configfile.loader import Config, ListenAddress
from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.clock import Clock, ScaledClock
from gpuwatchd.core.fields import HEALTH_CLOCK_EVENT_REASONS, decode_clock_event_reasons
from gpuwatchd.core.health import DEGRADED, OK, firing_by_gpu, gpu_health
from gpuwatchd.core.records import DeviceEvent, DeviceEventKind, GpuSample, GpuStatus, XidEvent
from gpuwatchd.rules.stage import RulesStage
from gpuwatchd.scenario.backend import ScenarioBackend
from gpuwatchd.scenario.model import Scenario, format_duration
from gpuwatchd.service.assembly import Wiring
from gpuwatchd.service.daemon import Daemon
from gpuwatchd.service.handoff import Record


@dataclass
class Style:
    color: bool

    def _c(self, code: str, text: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def dim(self, text: str) -> str:
        return self._c("2", text)

    def bold(self, text: str) -> str:
        return self._c("1", text)

    def red(self, text: str) -> str:
        return self._c("1;31", text)

    def yellow(self, text: str) -> str:
        return self._c("33", text)

    def green(self, text: str) -> str:
        return self._c("32", text)

    def cyan(self, text: str) -> str:
        return self._c("36", text)


_WATCHED_COUNTERS = {
    "ecc_corrected_volatile": "corrected ECC errors",
    "ecc_uncorrected_volatile": "UNCORRECTED ECC errors",
    "remapped_rows_pending": "row remapping pending",
    "remapped_rows_failure": "row remapping FAILED",
    "pcie_replay": "PCIe replays",
}


_RETELL_SECONDS = 900.0  # repeat a rising counter at most every 15 min of node time...
_RETELL_SHARE = 1 / 30  # ...or every 1/30 of the story, whichever is longer (days: hours)
DOUBLE_BIT_XID = 48  # NVIDIA's XID for a double-bit (uncorrectable) ECC error
MIN_REAL_WAIT = 0.002  # seconds of wall time: the shortest wait a DemoClock sleeps
CATCH_UP_SECONDS = 10.0  # wall seconds the demo waits for the daemon at the story's end
STALE_REAL_SECONDS = 0.25  # wall seconds a poll may take before its GPU is stale
MERGE_REAL_SECONDS = 0.25  # wall seconds the two reports of one XID may arrive apart


class DemoClock(ScaledClock):
    """A ``ScaledClock`` whose waits sleep at least ``MIN_REAL_WAIT`` of wall time.

    Loops in the daemon wait a fixed number of clock seconds (a reader re-checks its
    source every second, the XID merger every quarter second); thousands of times faster
    than real time those waits would be microseconds and the loops would spin, starving
    the poll workers of CPU. A wait for an event that is set still returns at once.
    """

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if seconds <= 0:
            return event.is_set()
        return event.wait(max(seconds / self.factor, MIN_REAL_WAIT))


def hours_text(seconds: float) -> str:
    """A lead time as people say it: ``41 h``, or ``2h30m`` below ten hours."""
    if seconds >= 36000:
        return f"{seconds / 3600:.0f} h"
    return format_duration(max(60, round(seconds / 60) * 60))


class Narrator:
    """Turns records into readable lines; remembers what it already said."""

    def __init__(
        self,
        scenario: Scenario,
        out: TextIO,
        style: Style,
        clock: Clock,
        trend_rules: frozenset[str] = frozenset(),
    ) -> None:
        self.scenario = scenario
        self.out = out
        self.style = style
        self.clock = clock
        self.t0 = clock.now()  # scenario time 0: set to the backend's once it opens
        self.trend_rules = trend_rules  # memory-trend rules that page or drain
        self.muted = False
        self._lock = threading.Lock()
        # gpu -> (rule, verb, first firing) per verb: the first drain and the first page
        self._trend_pages: dict[int, list[tuple[str, str, float]]] = {}
        self._double_bits: dict[int, float] = {}  # gpu -> time of its first double-bit error
        self.leads: list[str] = []  # one line per double-bit error, for the summary
        self._notes = list(scenario.notes)
        self._retell = max(_RETELL_SECONDS, scenario.duration * _RETELL_SHARE)
        self._last: dict[tuple[int, str], float] = {}
        self._told: dict[tuple[int, str], tuple[float, float]] = {}  # (time, value) last told
        self._reasons: dict[int, frozenset[str]] = {}
        self._hot: set[int] = set()
        self._link_errors: dict[tuple[int, int], float] = {}
        self.findings = 0

    def _line(self, t: float, text: str) -> None:
        secs = int(max(0.0, t - self.t0))
        stamp = self.style.dim(f"[+{secs // 3600:d}:{secs // 60 % 60:02d}:{secs % 60:02d}]")
        self.out.write(f"{stamp} {text}\n")

    def _notes_until(self, elapsed: float) -> None:
        """Print the scenario's notes due by ``elapsed`` scenario seconds (lock held)."""
        while self._notes and self._notes[0].t <= elapsed:
            note = self._notes.pop(0)
            self._line(self.t0 + note.t, self.style.cyan("scenario: ") + note.text)

    def notes_until(self, elapsed: float) -> None:
        with self._lock:
            if not self.muted:
                self._notes_until(elapsed)
                self.out.flush()

    def say(self, t: float, text: str) -> None:
        """One line stamped with node time ``t``; the notes due by then come first, so the
        story is told before what gpuwatchd noticed about it."""
        with self._lock:
            if self.muted:
                return
            self._notes_until(t - self.t0)
            self._line(t, text)
            self.out.flush()

    def finding(self, t: float, text: str, severe: bool = False) -> None:
        self.findings += 1
        mark = self.style.red("!!") if severe else self.style.yellow("! ")
        self.say(t, f"{mark} {text}")

    def alert(self, t: AlertTransition) -> None:
        if t.state is AlertState.PENDING:
            return
        if (
            t.state is AlertState.FIRING
            and t.rule in self.trend_rules
            and (t.severity is AlertSeverity.PAGE or t.drain)
        ):
            self._trend_page(t)
        summary = t.annotations.get("summary") or t.rule
        tag = f"[{t.severity.value}]"
        if t.state is AlertState.FIRING:
            head = (
                self.style.red(f"ALERT {tag:<8}")
                if t.severity is AlertSeverity.PAGE
                else (self.style.yellow(f"ALERT {tag:<8}"))
            )
            action = t.annotations.get("action")
            extra = f"\n{' ' * 12}   what to do: {action}" if action else ""
            self.say(t.timestamp, f"{head} {t.rule}: {summary}{extra}")
        else:
            self.say(t.timestamp, self.style.green(f"RESOLVED {tag:<5}") + f" {t.rule}: {summary}")

    def _trend_page(self, t: AlertTransition) -> None:
        gpu_label = t.labels.get("gpu")
        if gpu_label is None or not gpu_label.isdigit():
            return
        gpu = int(gpu_label)
        verb = "paged" if t.severity is AlertSeverity.PAGE else "drained the node (a ticket)"
        with self._lock:
            if gpu in self._double_bits:
                return  # after the error it is no forecast
            seen = self._trend_pages.setdefault(gpu, [])
            if all(v != verb for _, v, _ in seen):  # the first of each kind is the lead
                seen.append((t.rule, verb, t.timestamp))

    def double_bit(self, gpu: int, when: float) -> None:
        """GPU ``gpu`` had its first double-bit error at ``when``: tell the lead time."""
        with self._lock:
            if gpu in self._double_bits:
                return
            self._double_bits[gpu] = when
            seen = [x for x in self._trend_pages.get(gpu, []) if x[2] <= when]
        for rule, verb, at in sorted(seen, key=lambda x: x[2]):
            text = (
                f"{rule} {verb} {hours_text(when - at)} of node time before "
                f"GPU {gpu}'s double-bit error"
            )
            self.say(when, self.style.bold("lead time: ") + text)
            self.leads.append(text)
        if not seen:
            text = f"GPU {gpu}'s double-bit error came with no memory drain or page before it"
            self.say(when, self.style.yellow("no lead time: ") + text)
            self.leads.append(text)

    def action(self, record: dict[str, Any]) -> None:
        """A page or drain the actions stage recorded (the demo sends nothing)."""
        now = self.clock.now()
        if record.get("record") == "notification":
            alerts = record.get("alerts", [])
            firing = [a for a in alerts if a.get("state") == "firing"]
            names = ", ".join(sorted({str(a.get("rule")) for a in firing})) or "resolves only"
            self.say(
                now,
                self.style.cyan("-> notified ") + f"{record.get('receiver')} "
                f"({record.get('type')}): {len(firing)} firing [{names}]",
            )
        elif record.get("record") == "drain":
            how = "dry run" if record.get("dry_run") else str(record.get("mode"))
            self.say(
                now,
                self.style.red("-> DRAIN ") + f"node {record.get('node')} ({how}): "
                f"{record.get('reason') or record.get('detail')}",
            )

    def record(self, record: Record) -> None:
        if isinstance(record, DeviceEvent):
            severe = record.kind in (DeviceEventKind.LOST, DeviceEventKind.ERROR)
            what = {
                DeviceEventKind.LOST: "fell off the bus (NVML: GPU is lost)",
                DeviceEventKind.RECOVERED: "answers again",
                DeviceEventKind.STALE: "is STALE: its NVML calls stopped returning",
                DeviceEventKind.FRESH: "answers again after a stall",
                DeviceEventKind.ERROR: "poll failed",
                DeviceEventKind.MISSING: "is missing",
            }[record.kind]
            text = f"GPU {record.gpu} ({record.pci_bus_id}) {what}"
            if record.kind in (DeviceEventKind.RECOVERED, DeviceEventKind.FRESH):
                self.say(record.timestamp, self.style.green("ok ") + text)
            else:
                self.finding(
                    record.timestamp, text + (f": {record.detail}" if record.detail else ""), severe
                )
        elif isinstance(record, XidEvent) and record.enriches:
            who = f"pid {record.pid} ({record.process})" if record.pid is not None else "-"
            self.say(
                record.timestamp,
                f"   GPU {record.gpu}: XID {record.xid} confirmed by {record.source}: {who}",
            )
        elif isinstance(record, XidEvent):
            self.finding(
                record.timestamp,
                f"GPU {record.gpu} ({record.pci_bus_id}): XID {record.xid} from {record.source}",
                severe=True,
            )
            if record.xid == DOUBLE_BIT_XID and record.gpu is not None:
                self.double_bit(record.gpu, record.timestamp)
        elif isinstance(record, GpuSample) and record.status is GpuStatus.OK:
            self._sample(record)

    def _sample(self, s: GpuSample) -> None:
        f = s.fields
        for name, label in _WATCHED_COUNTERS.items():
            value = f.get(name)
            if value is None:
                continue
            key = (s.gpu, name)
            before = self._last.get(key)
            self._last[key] = value
            if before is None or value <= before:
                continue
            told = self._told.get(key)
            severe = name in ("ecc_uncorrected_volatile", "remapped_rows_failure")
            if told is None or severe:
                self.finding(s.timestamp, f"GPU {s.gpu}: {label} {before:g} -> {value:g}", severe)
                self._told[key] = (s.timestamp, value)
                if name == "ecc_uncorrected_volatile":
                    self.double_bit(s.gpu, s.timestamp)
            elif s.timestamp - told[0] >= self._retell:
                elapsed = s.timestamp - told[0]
                hours = elapsed / 3600
                rate = (value - told[1]) / hours
                per = f"{rate:.0f}/h" if rate >= 1 else f"{rate * 24:.1f}/day"
                self.finding(
                    s.timestamp,
                    f"GPU {s.gpu}: {label} now {value:g} "
                    f"(+{value - told[1]:g} in {format_duration(round(elapsed / 60) * 60)},"
                    f" {per})",
                )
                self._told[key] = (s.timestamp, value)
        mask = f.get("clock_event_reasons")
        if mask is not None:
            reasons = frozenset(decode_clock_event_reasons(int(mask))) & HEALTH_CLOCK_EVENT_REASONS
            if reasons != self._reasons.get(s.gpu, frozenset()):
                if reasons:
                    clock = f.get("sm_clock")
                    at = f" (SM clock {clock / 1e6:.0f} MHz)" if clock else ""
                    self.finding(
                        s.timestamp,
                        f"GPU {s.gpu}: clocks held down by {', '.join(sorted(reasons))}{at}",
                    )
                else:
                    self.say(
                        s.timestamp, self.style.green("ok ") + f"GPU {s.gpu}: no longer throttled"
                    )
                self._reasons[s.gpu] = reasons
        temp = f.get("temperature_gpu")
        if temp is not None:
            if temp >= 85 and s.gpu not in self._hot:
                self._hot.add(s.gpu)
                self.finding(s.timestamp, f"GPU {s.gpu}: temperature {temp:.0f} C (>= 85 C)")
            elif temp < 80 and s.gpu in self._hot:
                self._hot.discard(s.gpu)
                self.say(
                    s.timestamp,
                    self.style.green("ok ") + f"GPU {s.gpu}: temperature back to {temp:.0f} C",
                )
        for ls in s.links:
            crc = ls.fields.get("nvlink_crc_errors")
            if crc is None:
                continue
            key2 = (s.gpu, ls.link)
            before = self._link_errors.get(key2)
            self._link_errors[key2] = crc
            if before is not None and crc > before:
                self.finding(
                    s.timestamp, f"GPU {s.gpu} NVLink {ls.link}: CRC errors {before:g} -> {crc:g}"
                )


def demo_config(
    base: Config, scenario: Scenario, listen: ListenAddress, factor: float = 1.0
) -> Config:
    """The config the demo runs: one poll per scenario step. Two limits that stand for
    wall-time latencies between threads keep a floor of wall time however fast node time
    runs (``factor`` times real time): the poll call timeout (a GPU is stale when its
    poll has not returned after ``STALE_REAL_SECONDS``, not after a few milliseconds of
    thread scheduling) and the XID merge window (the kernel-log and NVML reports of one
    XID arriving up to ``MERGE_REAL_SECONDS`` apart still make one incident)."""
    timeout = max(scenario.step, STALE_REAL_SECONDS * factor)
    poll = dataclasses.replace(base.poll, interval=scenario.step, call_timeout=timeout)
    window = max(base.sources.merge_window, MERGE_REAL_SECONDS * factor)
    sources = dataclasses.replace(base.sources, merge_window=window)
    return dataclasses.replace(base, poll=poll, listen=listen, sources=sources)


def default_demo_config() -> Config:
    from importlib import resources

    from gpuwatchd.configfile.loader import load_config

    path = resources.files("gpuwatchd").joinpath("data", "demo-config.yaml")
    return load_config(str(path), must_exist=True)


def wants_color(out: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour only on a terminal that can show it: never when NO_COLOR is set
    (no-color.org) or TERM is ``dumb``."""
    return not environ.get("NO_COLOR") and environ.get("TERM") != "dumb" and out.isatty()


def memory_trend_pages(daemon: Daemon) -> frozenset[str]:
    """The names of the loaded memory-trend rules that page or drain (whose lead times the
    narrator tells)."""
    rules = daemon.node.rules
    if not isinstance(rules, RulesStage):
        return frozenset()
    return frozenset(
        r.name
        for r in rules.engine.rules
        if r.kind == "memory_trend" and (r.severity is AlertSeverity.PAGE or r.drain)
    )


def wait_for_end(daemon: Daemon, backend: ScenarioBackend, timeout: float) -> bool:
    """Once the clock has passed the scenario's end, wait (up to ``timeout`` wall seconds)
    until the daemon has caught up with it: every scripted kernel line and NVML XID event
    read and merged, every GPU polled after the end, and then the rules evaluated. False if
    that took longer (an overloaded machine), in which case the summary may miss the end.

    Played thousands of times faster than real time, a few milliseconds of thread
    scheduling are hours of node time; without this the last events would be cut off.
    """
    deadline = time.monotonic() + timeout

    def until(done: Callable[[], bool]) -> bool:
        while not done():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        return True

    polls = {g.info.index: g.polls for g in daemon.state.view().gpus}

    def polled_after_end() -> bool:  # a poll in flight at the end may predate it: 2 more
        return all(g.polls >= polls.get(g.info.index, 0) + 2 for g in daemon.state.view().gpus)

    if not until(lambda: backend.next_event_after(-math.inf) is None):
        return False
    if not until(lambda: daemon.xids.merger.pending() == 0):
        return False
    if daemon.poller is not None and not until(polled_after_end):
        return False
    evaluations = daemon.evaluations  # one may be running: wait for a whole one after it
    return until(lambda: daemon.evaluations >= evaluations + 2)


def run_demo(
    scenario: Scenario,
    base: Config,
    *,
    seconds: float = 60.0,
    forever: bool = False,
    listen: ListenAddress | None = None,
    out: TextIO = sys.stdout,
    color: bool | None = None,
) -> int:
    style = Style(wants_color(out, os.environ) if color is None else color)
    factor = scenario.duration / seconds
    clock = DemoClock(factor)
    with tempfile.TemporaryDirectory(prefix="gpuwatchd-demo-") as state_dir:
        config = dataclasses.replace(
            demo_config(base, scenario, listen or base.listen, factor), state_dir=state_dir
        )
        return _play(
            scenario, config, clock, factor, seconds, forever, listen, out, style, state_dir
        )


def _play(
    scenario: Scenario,
    config: Config,
    clock: ScaledClock,
    factor: float,
    seconds: float,
    forever: bool,
    listen: ListenAddress | None,
    out: TextIO,
    style: Style,
    state_dir: str,
) -> int:
    narrator = Narrator(scenario, out, style, clock)
    # The rule engine in memory, pages and drains handed to the narrator (never sent).
    wiring = Wiring(
        durable=False, record=narrator.action, actions_db=os.path.join(state_dir, "demo.db")
    )

    def make_daemon(cfg: Config) -> tuple[Daemon, ScenarioBackend]:
        backend = ScenarioBackend(scenario, clock, real_stalls=True)
        daemon = Daemon(cfg, backend, clock, wiring=wiring, emit=narrator.record)
        daemon.pipeline.on_transition = narrator.alert
        narrator.trend_rules = memory_trend_pages(daemon)
        backend.open()  # scenario time 0 is now (the daemon's own open keeps it)
        narrator.t0 = backend.t0
        return daemon, backend

    daemon, backend = make_daemon(config)
    daemon.start()  # a busy port does not stop a daemon: its listener retries meanwhile
    if daemon.http is None:  # the port is busy (a daemon runs here?)
        daemon.stop()
        if listen is not None or config.listen.port == 0:
            raise SystemExit(f"gpuwatchd demo: cannot listen on {config.listen}: in use")
        # the default port: serve the demo on a free one instead
        config = dataclasses.replace(config, listen=ListenAddress(config.listen.host, 0))
        daemon, backend = make_daemon(config)
        daemon.start()
    url = daemon.http.url if daemon.http else "(no HTTP)"
    out.write(style.bold(f"gpuwatchd demo: {scenario.name}") + f" - {scenario.description}\n")
    out.write(
        f"  {len(daemon.infos)} GPUs, {format_duration(scenario.duration)} of node time "
        f"played {factor:,.0f}x faster (about {seconds:.0f} s). Poll every "
        f"{format_duration(scenario.step)} of node time. Pages and drains are printed, "
        "never sent.\n"
    )
    out.write(f"  Status page: {url}/   Metrics: {url}/metrics   API: {url}/api/v1/status\n\n")
    out.flush()
    stop = threading.Event()
    try:
        while not stop.is_set():
            elapsed = clock.now() - narrator.t0
            narrator.notes_until(elapsed)
            if elapsed >= scenario.duration:
                break
            stop.wait(0.02)
        caught_up = wait_for_end(daemon, backend, CATCH_UP_SECONDS)
        narrator.notes_until(math.inf)
        view = daemon.state.view()
        firing = daemon.node.firing()
        narrator.muted = not forever  # nothing after the summary unless it keeps serving
        if not caught_up:
            out.write(
                style.yellow(
                    f"\nThe daemon had not caught up with the end after {CATCH_UP_SECONDS:g} s "
                    "(an overloaded machine?): the summary may miss the last events.\n"
                )
            )
        out.write("\n" + style.bold("Summary") + f": {narrator.findings} findings.\n")
        by_gpu = firing_by_gpu(firing)
        for g in view.gpus:
            verdict = gpu_health(g.status.value, by_gpu.get(str(g.info.index), ()))
            paint = {OK: style.green, DEGRADED: style.yellow}.get(verdict.health, style.red)
            out.write(f"  GPU {g.info.index} {g.info.pci_bus_id} {paint(verdict.text())}\n")
        for line in narrator.leads:
            out.write(f"  Lead time: {line}.\n")
        out.write(f"  {len(firing)} alert(s) still firing")
        out.write(":\n" if firing else ".\n")
        for alert in firing:
            gpu = alert["labels"].get("gpu")
            where = f" on GPU {gpu}" if gpu is not None else ""
            out.write(
                f"    [{alert['severity']}] {alert['rule']}{where}: {alert['summary'] or ''}\n"
            )
        if forever:
            out.write(f"\nStill serving {url}/metrics (Ctrl-C to stop).\n")
            out.flush()
            daemon.wait()
    except KeyboardInterrupt:
        pass
    finally:
        daemon.stop()
    return 0
