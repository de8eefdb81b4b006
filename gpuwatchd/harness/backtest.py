"""``gpuwatchd backtest``: score the memory rules on labelled, seeded scenario families.

Each family describes one kind of GPU history (a leak that ends in an uncorrectable error,
a steady trickle, one bad job's burst, a benign row remap, a node-wide XID, ...).
``generate`` expands a family into scenario files in the ordinary scenario format: 8 GPUs
per file, each GPU its own seeded trace (or the node's 8 together), 30 days at a 5-minute
step. ``run_family`` plays every file through the real pipeline on the virtual clock
(``harness.simulate.Simulation``, the shipped rules or a config's) and scores its two tiers
of action apart: *pages* (page-severity rules) and *drains* (rules that drain the node at
the next job boundary), leaving out ``GpuXidFatal``, which answers the uncorrectable error
itself:

- precursor families: the share of traces paged before the uncorrectable error, the lead
  time (p10, p50) from the first page to that error and the shares paged 1, 6 and 24 h
  ahead; the share drained 24 h ahead and paged-or-drained 6 and 24 h ahead; for traces the
  GPU certifies, the share paged within an hour of the certificate;
- every family: pages and drains that are not a detection (on a benign GPU) per 1000
  GPU-days;
- the fleet: benign rates weighted by how common each history is in a fleet (``weight``:
  the share of GPU-days, set for a fleet with 5 % of GPU-days error-active; about 95 % of
  GPUs never log a corrected error), and the same at 1 %.

The same seed always gives the same traces and the same scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.configfile.loader import Config, default_config
from gpuwatchd.core.alerts import AlertSeverity
from gpuwatchd.harness.simulate import SIM_EPOCH, Simulation
from gpuwatchd.scenario.model import parse_scenario

DAY = 86400.0
HOUR = 3600.0
GPUS = 8
DAYS = 30
LONG_DAYS = 56  # for the family whose weekly phase lasts 4-6 weeks
STEP = "5m"
BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")  # the scenario's H100 node
CORRECTED = "ecc_corrected_volatile"
CORRECTED_DEV = "ecc_corrected_volatile_dev"
ERROR_ACTIVE = 0.05  # share of a fleet's GPU-days with corrected errors (the benign weights)


@dataclass
class Trace:
    """One GPU's history: timeline events (scenario YAML lines without the GPU) and its
    label: when the uncorrectable error comes (None: benign), for corroborated traces when
    the GPU first certified the fault, and for stepped leaks when the rate first rose
    (``rise_at``: what an oracle test would know, ``bench/detection_bound.py``)."""

    events: list[tuple[float, str]] = field(default_factory=list)
    dbe_at: float | None = None
    corroborated_at: float | None = None
    rise_at: float | None = None
    days: int = DAYS  # the trace's length
    # drive the device-memory counter too (the scenario mirrors the total into it only
    # while the timeline never names it): needed wherever the counters are reset
    both: bool = False

    def add(self, t: float, count: int) -> None:
        if count > 0 and 0 <= t < self.days * DAY:
            if self.both:
                text = f"add: {{{CORRECTED}: {count}, {CORRECTED_DEV}: {count}}}"
            else:
                text = f"add: {{{CORRECTED}: {count}}}"
            self.events.append((t, text))

    def reset(self, t: float) -> None:
        """A driver reload or GPU reset: the volatile counters start over (``both`` only)."""
        assert self.both
        if 0 <= t < self.days * DAY:
            self.events.append((t, f"set: {{{CORRECTED}: 0, {CORRECTED_DEV}: 0}}"))

    def at(self, t: float, text: str) -> None:
        if 0 <= t < self.days * DAY:
            self.events.append((t, text))

    def poisson(self, rng: random.Random, start: float, end: float, per_day: float) -> None:
        """Errors one at a time at random (a Poisson process of ``per_day``)."""
        if per_day <= 0:
            return
        t = start + rng.expovariate(per_day / DAY)
        while t < end:
            self.add(t, 1)
            t += rng.expovariate(per_day / DAY)

    def xid_line(self, t: float, code: int, pid: int, bus: str = "{bus}") -> None:
        if 0 <= t < self.days * DAY:
            self.events.append(
                (
                    t,
                    f'kernel_log: "NVRM: Xid (PCI:0000:{bus}:00): {code}, pid={pid}, '
                    f'name=python3, XID {code} reported"',
                )
            )

    def dbe(self, t: float, gpu_placeholder: str = "{bus}") -> None:
        self.dbe_at = t
        self.events.append(
            (t, "add: {ecc_uncorrected_volatile: 1, remapped_rows_uncorrectable: 1}")
        )
        self.events.append(
            (
                t,
                f'kernel_log: "NVRM: Xid (PCI:0000:{gpu_placeholder}:00): 48, pid=4242, '
                "name=python3, An uncorrectable double bit error (DBE) has been detected on "
                'GPU in the framebuffer at partition 2, subpartition 0."',
            )
        )


Maker = Callable[[random.Random], Trace]
NodeMaker = Callable[[random.Random], list[Trace]]


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    make: Maker
    precursor: bool
    weight: float = 0.0  # share of a fleet's GPU-days with this history (benign only)
    corroborated: bool = False  # the GPU certifies the fault (scored: paged >= 1 h ahead)
    xid: bool = False  # its evidence is XID lines (for the table; every family is scored alike)
    days: int = DAYS  # the length of each trace (every trace of the family alike)
    make_node: NodeMaker | None = None  # the 8 traces of a file together (node-wide events)


# -- precursors ------------------------------------------------------------------------------
def _inside(tr: Trace, *times: float) -> tuple[float, ...]:
    """The phase boundaries of a leak moved earlier, all alike, so that its uncorrectable
    error (the last one) comes at least a minute before the trace ends: up to 3 + 19 + 8 + 1
    days would not fit 30 (the scenario then refused the DBE after its end). The same draws
    whatever the shift, so a leak that fitted is unchanged."""
    shift = max(0.0, times[-1] - (tr.days * DAY - 60.0))
    return tuple(t - shift for t in times)


def _leak_steps(rng: random.Random) -> Trace:
    return _stepped_leak(rng, Trace(), (14, 19))


def _leak_steps_long(rng: random.Random) -> Trace:
    return _stepped_leak(rng, Trace(days=LONG_DAYS), (28, 42))


def _stepped_leak(rng: random.Random, tr: Trace, weekly_days: tuple[float, float]) -> Trace:
    """Poisson 1/week for ``weekly_days``, 1/day for 4-8 days, 1/hour for a day, then the
    uncorrectable error."""
    start = rng.uniform(0, 3) * DAY
    daily_at = start + rng.uniform(*weekly_days) * DAY
    hourly_at = daily_at + rng.uniform(4, 8) * DAY
    end = hourly_at + DAY
    start, daily_at, hourly_at, end = _inside(tr, start, daily_at, hourly_at, end)
    tr.poisson(rng, start, daily_at, 1 / 7)
    tr.poisson(rng, daily_at, hourly_at, 1.0)
    tr.poisson(rng, hourly_at, end, 24.0)
    tr.rise_at = daily_at
    tr.dbe(end)
    return tr


def _doubling(hours: float) -> Maker:
    def make(rng: random.Random) -> Trace:
        tr = Trace()
        start = rng.uniform(4, 12) * DAY
        rate = rng.uniform(0.5, 2.0)  # per day at the start
        if hours >= 48:
            length = rng.uniform(10, 16) * DAY
        else:
            length = rng.uniform(7, 10) * DAY if hours >= 24 else rng.uniform(4, 6) * DAY
        end = min(start + length, (DAYS - 0.5) * DAY)
        t = start
        while t < end:
            seg_end = min(t + 6 * HOUR, end)
            per_day = rate * 2 ** ((t - start) / (hours * HOUR))
            tr.poisson(rng, t, seg_end, per_day)
            t = seg_end
        tr.dbe(end)
        return tr

    return make


def _late_storm(rng: random.Random) -> Trace:
    tr = Trace()
    start = rng.uniform(10, 25) * DAY
    tr.poisson(rng, start, start + 2 * DAY, 24.0)
    tr.dbe(start + 2 * DAY)
    return tr


def _corroborated(rng: random.Random) -> Trace:
    tr = Trace()
    start = rng.uniform(5, 22) * DAY
    tr.poisson(rng, start, start + 3 * DAY, rng.uniform(12, 48))
    first = min((t for t, _ in tr.events), default=start)
    corro = first + rng.uniform(0.5, 6) * HOUR  # the GPU certifies what it already shows
    if rng.random() < 0.5:
        tr.events.append((corro, "add: {remapped_rows_correctable: 1}"))
    else:
        tr.events.append(
            (
                corro,
                'kernel_log: "NVRM: Xid (PCI:0000:{bus}:00): 92, pid=4242, name=python3, '
                'High single-bit ECC error rate detected"',
            )
        )
    tr.corroborated_at = corro
    tr.dbe(start + 3 * DAY)
    return tr


# -- benign -----------------------------------------------------------------------------------
def _trickle(rng: random.Random) -> Trace:
    tr = Trace()
    per_day = rng.choice((1 / 7, 1.0, 24.0, 2400.0))
    if per_day > 100:  # 100 an hour: as a steady ramp (too many single events)
        tr.events.append((0.0, f"ramp: {{field: {CORRECTED}, rate: 100, per: 1h}}"))
    else:
        tr.poisson(rng, 0.0, DAYS * DAY, per_day)
    return tr


def _heavy_episodes(rng: random.Random) -> Trace:
    tr = Trace()
    per_day = rng.choice((1 / 7, 1.0, 4.0))
    t = rng.expovariate(per_day / DAY)
    while t < DAYS * DAY:
        size = min(int(rng.paretovariate(1.1)), 100000)
        spread = rng.uniform(0, 20 * 60)  # an episode lasts up to 20 minutes
        first = max(size // 2, 1)
        tr.add(t, first)
        tr.add(t + spread, size - first)
        t += rng.expovariate(per_day / DAY)
    return tr


def _burst(rng: random.Random) -> Trace:
    tr = Trace()
    t = rng.uniform(1, 28) * DAY
    length = rng.uniform(600, 12 * HOUR)
    total = int(10 ** rng.uniform(1, 6))
    per_hour = max(total / (length / HOUR), 1.0)
    tr.events.append((t, f"ramp: {{field: {CORRECTED}, rate: {per_hour:.3f}, per: 1h}}"))
    tr.events.append((t + length, f"ramp: {{field: {CORRECTED}, rate: 0, per: 1h}}"))
    return tr


def _job_modulated(rng: random.Random) -> Trace:
    tr = Trace()
    per_hour = rng.uniform(1, 20)
    t = rng.uniform(0, 3) * DAY
    while t < DAYS * DAY:
        length = rng.uniform(2, 48) * HOUR
        tr.poisson(rng, t, min(t + length, DAYS * DAY), per_hour * 24)
        t += length + rng.uniform(2, 5) * DAY
    return tr


def _step(rng: random.Random) -> Trace:
    tr = Trace()
    start = rng.uniform(1, 25) * DAY
    tr.poisson(rng, start, DAYS * DAY, rng.choice((1.0, 4.0, 24.0, 240.0)))
    return tr


def _resets(rng: random.Random) -> Trace:
    tr = Trace(both=True)  # the reload zeroes the device-memory counter the rules read too
    tr.poisson(rng, 0.0, DAYS * DAY, rng.choice((1.0, 4.0)))
    t = rng.uniform(1, 4) * DAY
    while t < DAYS * DAY:
        tr.reset(t)
        t += rng.uniform(1, 6) * DAY
    return tr


def _sram(rng: random.Random) -> Trace:
    """SRAM errors only: the total counts them, the device-memory counter does not."""
    tr = Trace()
    tr.events.append((0.0, "set: {ecc_corrected_volatile_dev: 0}"))
    tr.poisson(rng, rng.uniform(0, 10) * DAY, DAYS * DAY, rng.choice((4.0, 24.0)))
    tr.poisson(rng, 20 * DAY, 22 * DAY, 96.0)  # and a sharp rise, in SRAM
    return tr


def _xid92_steps(rng: random.Random) -> Trace:
    """The seeds' quiet killer: XID 92 once a week, then daily, then every few hours."""
    tr = Trace()
    t = rng.uniform(0, 3) * DAY
    daily_at = t + rng.uniform(14, 18) * DAY
    hourly_at = daily_at + rng.uniform(4, 7) * DAY
    end = hourly_at + rng.uniform(1, 2) * DAY
    for start, stop, per_day in (
        (t, daily_at, 1 / 7),
        (daily_at, hourly_at, 1.0),
        (hourly_at, end, 8.0),
    ):
        x = start + rng.expovariate(per_day / DAY)
        while x < stop:
            tr.xid_line(x, 92, rng.randrange(1000, 60000))
            x += rng.expovariate(per_day / DAY)
    tr.dbe(end)
    return tr


def _xid_one_job(rng: random.Random) -> Trace:
    """One job printing the same XID (13 or 92) hundreds of times, once or twice a month."""
    tr = Trace()
    for _ in range(rng.choice((1, 2))):
        t = rng.uniform(1, 28) * DAY
        code = rng.choice((13, 92))
        pid = rng.randrange(1000, 60000)
        for k in range(rng.randrange(50, 400)):
            tr.xid_line(t + 20 * k, code, pid)
    return tr


# -- issue 25: the shapes that fool a rate test, and what the GPU certifies -------------------
UE_CONTAINED = "add: {ecc_uncorrected_volatile: 1, remapped_rows_uncorrectable: 1}"


def _trickle_step(rng: random.Random) -> Trace:
    """A workload change: a trickle (1/week or 1/day) steps up 4-10x for good."""
    tr = Trace()
    base = rng.choice((1 / 7, 1 / 7, 1.0))
    step_at = rng.uniform(8, 25) * DAY
    tr.poisson(rng, 0.0, step_at, base)
    tr.poisson(rng, step_at, DAYS * DAY, base * rng.uniform(4, 10))
    return tr


def _overdispersed(rng: random.Random) -> Trace:
    """A trickle whose daily rate varies from day to day (gamma, shape 0.5: the day counts
    are negative binomial, variance far above the mean)."""
    tr = Trace()
    mean = rng.choice((0.5, 1.0, 4.0))
    for day in range(DAYS):
        rate = mean * rng.gammavariate(0.5, 2.0)
        tr.poisson(rng, day * DAY, (day + 1) * DAY, rate)
    return tr


def _sessions_on_trickle(rng: random.Random) -> Trace:
    """A trickle, plus job sessions (2-48 h at 1-10 an hour) and short bursts every 2-5 days."""
    tr = Trace()
    tr.poisson(rng, 0.0, DAYS * DAY, rng.choice((1 / 7, 1.0)))
    t = rng.uniform(0, 5) * DAY
    while t < DAYS * DAY:
        if rng.random() < 0.5:
            length = rng.uniform(2, 48) * HOUR
            tr.poisson(rng, t, min(t + length, DAYS * DAY), rng.uniform(1, 10) * 24)
        else:
            length = rng.uniform(600, 3 * HOUR)
            tr.add(t, int(10 ** rng.uniform(1, 4)))
            tr.add(t + length, int(10 ** rng.uniform(0, 3)))
        t += length + rng.uniform(2, 5) * DAY
    return tr


def _benign_remap(rng: random.Random) -> Trace:
    """A weak row: errors for hours to days, the GPU remaps it (pending), a reset at the next
    job boundary applies the remap (the volatile counters start over), and it is quiet."""
    tr = Trace(both=True)
    start = rng.uniform(2, 22) * DAY
    remap = start + rng.uniform(2, 48) * HOUR
    tr.poisson(rng, start, remap, rng.uniform(4, 48))
    tr.add(remap, 1)
    tr.at(remap, "add: {remapped_rows_correctable: 1}")
    tr.at(remap, "set: {remapped_rows_pending: 1}")
    reset = remap + rng.uniform(2, 24) * HOUR
    tr.poisson(rng, remap, reset, rng.uniform(4, 48))  # the row logs until the reset
    tr.at(reset, "set: {remapped_rows_pending: 0}")
    tr.reset(reset)
    if rng.random() < 0.3:  # XID 63 in the kernel log too
        tr.xid_line(remap + 1, 63, rng.randrange(1000, 60000))
    return tr


def _xid92_one_job(rng: random.Random) -> Trace:
    """One job printing XID 92 (high single-bit rate) many times, with its corrected errors,
    once in the month."""
    tr = Trace()
    t = rng.uniform(1, 28) * DAY
    pid = rng.randrange(1000, 60000)
    lines = rng.randrange(5, 200)
    for k in range(lines):
        tr.xid_line(t + 30 * k, 92, pid)
    tr.events.append(
        (t, f"ramp: {{field: {CORRECTED}, rate: {rng.uniform(50, 2000):.1f}, per: 1h}}")
    )
    tr.events.append((t + 30 * lines, f"ramp: {{field: {CORRECTED}, rate: 0, per: 1h}}"))
    return tr


def _node_wide(rng: random.Random) -> list[Trace]:
    """A driver or fabric event 1-3 times a month: XID 92 (or 43) and corrected errors
    on every GPU of the node within seconds; otherwise quiet."""
    traces = [Trace() for _ in range(GPUS)]
    for _ in range(rng.choice((1, 2, 3))):
        t = rng.uniform(1, 28) * DAY
        code = rng.choice((92, 92, 92, 43))
        for gpu, tr in enumerate(traces):
            when = t + rng.uniform(0, 5)
            tr.xid_line(when, code, rng.randrange(1000, 60000), bus=BUS_IDS[gpu].lower())
            if code == 92:
                tr.add(when, rng.randrange(1, 500))
    return traces


def _regular_cadence(rng: random.Random) -> Trace:
    """Weekly, then daily, then hourly, at a regular cadence (each gap the period +- 10 %),
    not Poisson: the weekly phase gives 2-3 errors whatever the luck."""
    tr = Trace()
    start = rng.uniform(0, 3) * DAY
    daily_at = start + rng.uniform(14, 19) * DAY
    hourly_at = daily_at + rng.uniform(4, 8) * DAY
    end = hourly_at + DAY
    start, daily_at, hourly_at, end = _inside(tr, start, daily_at, hourly_at, end)
    for lo, hi, period in (
        (start, daily_at, 7 * DAY),
        (daily_at, hourly_at, DAY),
        (hourly_at, end, HOUR),
    ):
        t = lo + rng.uniform(0, period)
        while t < hi:
            tr.add(t, 1)
            t += period * rng.uniform(0.9, 1.1)
    tr.rise_at = daily_at
    tr.dbe(end)
    return tr


def _continuous_stream(rng: random.Random) -> Trace:
    """Weekly, then daily (both Poisson), then a continuous stream: exactly one error an
    hour for 2-4 days (as ``scenarios/ecc-leak.yaml``), then the error. Every bucket of the
    stream is within an hour of the last, so the stream is one episode: while it lasts it
    looks like a job session, and a test that vetoes sessions must still drain it."""
    tr = Trace()
    start = rng.uniform(0, 3) * DAY
    daily_at = start + rng.uniform(5, 9) * DAY
    stream_at = daily_at + rng.uniform(5, 8) * DAY
    end = stream_at + rng.uniform(2, 4) * DAY
    start, daily_at, stream_at, end = _inside(tr, start, daily_at, stream_at, end)
    tr.poisson(rng, start, daily_at, 1 / 7)
    tr.poisson(rng, daily_at, stream_at, 1.0)
    t = stream_at + rng.uniform(0, HOUR)
    while t < end:
        tr.add(t, 1)
        t += HOUR
    tr.rise_at = daily_at
    tr.dbe(end)
    return tr


def _prior_ue_streak(rng: random.Random) -> Trace:
    """The Summit streaks: a contained uncorrectable error (XID 94, the uncorrected counter, an
    uncorrectable remap), then more memory errors over 1-5 days (corrected ones and further
    contained ones), then the double-bit error."""
    tr = Trace()
    first = rng.uniform(3, 20) * DAY
    end = first + rng.uniform(1, 5) * DAY
    tr.at(first, UE_CONTAINED)
    tr.xid_line(first, 94, rng.randrange(1000, 60000))
    t = first + rng.expovariate(rng.uniform(2, 24) / DAY)
    while t < end:
        if rng.random() < 0.3:
            tr.at(t, UE_CONTAINED)
            tr.xid_line(t, 94, rng.randrange(1000, 60000))
        else:
            tr.add(t, rng.randrange(1, 50))
        t += rng.expovariate(rng.uniform(2, 24) / DAY)
    # the certificate is whole at the first memory error an hour or more after the first
    again = [x for x, _ in tr.events if x >= first + HOUR]
    tr.corroborated_at = min(again, default=end)
    tr.dbe(end)
    return tr


def _certified(rng: random.Random) -> Trace:
    """Errors at 2-24 a day for 3-6 days before the double-bit error, and the GPU certifying
    the fault on the way: errors after an applied remap, a second remap, a bank down to low
    spare rows, or XID 92 on two days. ``corroborated_at``: when the certificate is whole."""
    tr = Trace(both=True)
    start = rng.uniform(5, 20) * DAY
    end = start + rng.uniform(3, 6) * DAY
    rate = rng.uniform(2, 24)
    kind = rng.randrange(4)
    at = start + rng.uniform(0.3, 0.6) * (end - start)
    if kind == 0:  # a remap, applied by a reset hours later; the errors go on
        tr.poisson(rng, start, end, rate)
        tr.at(at, "add: {remapped_rows_correctable: 1}")
        tr.at(at, "set: {remapped_rows_pending: 1}")
        reset = at + rng.uniform(2, 12) * HOUR
        tr.at(reset, "set: {remapped_rows_pending: 0}")
        tr.reset(reset)
        after = sorted(t for t, x in tr.events if t >= reset + HOUR and CORRECTED in x)
        tr.corroborated_at = after[0] if after else end
    elif kind == 1:  # two remaps (each applied at once)
        tr.poisson(rng, start, end, rate)
        first = start + rng.uniform(0.05, 0.3) * (end - start)
        tr.at(first, "add: {remapped_rows_correctable: 1}")
        tr.at(at, "add: {remapped_rows_correctable: 1}")
        tr.corroborated_at = at
    elif kind == 2:  # a bank's spare rows fall to low (NVML reports the histogram always)
        tr.poisson(rng, start, end, rate)
        tr.at(0.0, "set: {row_remap_banks_low: 0}")
        tr.at(at, "set: {row_remap_banks_low: 1}")
        tr.corroborated_at = at
    else:  # XID 92 on two days
        tr.poisson(rng, start, end, rate)
        first = start + rng.uniform(0, 0.2) * (end - start)
        second = max(at, first + DAY + rng.uniform(0, 12) * HOUR)
        tr.xid_line(first, 92, rng.randrange(1000, 60000))
        tr.xid_line(second, 92, rng.randrange(1000, 60000))
        tr.corroborated_at = second
    tr.dbe(end)
    return tr


FAMILIES: tuple[Family, ...] = (
    Family(
        "leak-weekly-daily-hourly",
        "weekly, then daily (4-8 d), then hourly for 1 d",
        _leak_steps,
        True,
    ),
    Family(
        "leak-weekly-daily-hourly-long",
        "weekly for 4-6 weeks, then daily (4-8 d), then hourly for 1 d",
        _leak_steps_long,
        True,
        days=LONG_DAYS,
    ),
    Family("leak-doubling-24h", "rate doubles every 24 h for 7-10 d", _doubling(24), True),
    Family("leak-doubling-12h", "rate doubles every 12 h for 4-6 d", _doubling(12), True),
    Family("leak-doubling-48h", "rate doubles every 48 h for 10-16 d", _doubling(48), True),
    Family("late-storm", "silent, then hourly for 2 d", _late_storm, True),
    Family(
        "corroborated",
        "a step to 12-48 a day plus a correctable remap or XID 92",
        _corroborated,
        True,
        corroborated=True,
    ),
    Family(
        "trickle",
        "Poisson 1/week, 1/day, 1/hour or 100/hour, all month",
        _trickle,
        False,
        weight=0.012,
    ),
    Family(
        "heavy-episodes",
        "episodes 1/week, 1/day or 4/day of Pareto size",
        _heavy_episodes,
        False,
        weight=0.006,
    ),
    Family(
        "single-burst",
        "one burst of 10 min to 12 h, 10 to 10^6 errors",
        _burst,
        False,
        weight=0.003,
    ),
    Family(
        "job-modulated", "sessions of 2-48 h every 2-5 days", _job_modulated, False, weight=0.003
    ),
    Family("step", "from 0 to a steady 1/day .. 10/hour", _step, False, weight=0.003),
    Family(
        "counter-resets",
        "a trickle with a driver reload (both counters to 0) every 1-6 days",
        _resets,
        False,
        weight=0.002,
    ),
    Family(
        "sram-only",
        "SRAM errors (total counter only), with a sharp rise",
        _sram,
        False,
        weight=0.001,
    ),
    Family(
        "xid92-weekly-daily-hourly",
        "XID 92 weekly, then daily, then 8 a day",
        _xid92_steps,
        True,
        xid=True,
    ),
    Family(
        "xid-one-job",
        "one job printing one XID (13 or 92) hundreds of times",
        _xid_one_job,
        False,
        weight=0.002,
        xid=True,
    ),
    Family(
        "trickle-step",
        "a trickle (1/week or 1/day) that steps up 4-10x for good (a workload change)",
        _trickle_step,
        False,
        weight=0.004,
    ),
    Family(
        "overdispersed-trickle",
        "0.5, 1 or 4 a day on average, the daily rate gamma-distributed (shape 0.5)",
        _overdispersed,
        False,
        weight=0.005,
    ),
    Family(
        "sessions-on-trickle",
        "a trickle plus job sessions (2-48 h, 1-10/hour) and bursts every 2-5 days",
        _sessions_on_trickle,
        False,
        weight=0.003,
    ),
    Family(
        "benign-remap",
        "errors from one weak row, its remap (pending), a reset 2-24 h later, then quiet",
        _benign_remap,
        False,
        weight=0.002,
    ),
    Family(
        "xid92-one-job",
        "one job printing XID 92 5-200 times with its corrected errors, once",
        _xid92_one_job,
        False,
        weight=0.002,
        xid=True,
    ),
    Family(
        "node-wide",
        "XID 92 (or 43) and errors on all 8 GPUs within seconds, 1-3 times",
        _trickle,  # unused: make_node writes the node
        False,
        weight=0.002,
        xid=True,
        make_node=_node_wide,
    ),
    Family(
        "leak-regular-cadence",
        "weekly, daily (4-8 d), hourly (1 d) at a regular cadence (+-10 %), then the error",
        _regular_cadence,
        True,
    ),
    Family(
        "leak-continuous-stream",
        "weekly (5-9 d), daily (5-8 d), then exactly one an hour for 2-4 d, then the error",
        _continuous_stream,
        True,
    ),
    Family(
        "prior-ue-streak",
        "a contained uncorrectable error (XID 94), more errors for 1-5 d, then the DBE",
        _prior_ue_streak,
        True,
        corroborated=True,
        xid=True,
    ),
    Family(
        "certified",
        "errors 2-24/day and a certificate (errors after an applied remap, a second remap, "
        "a bank at low spare rows, or XID 92 on two days)",
        _certified,
        True,
        corroborated=True,
    ),
)
HEALTHY_WEIGHT = 1.0 - ERROR_ACTIVE  # no corrected error at all: no memory page is possible


def generate(family: Family, seed: int, files: int) -> list[tuple[str, list[Trace]]]:
    """``files`` scenario texts of ``GPUS`` traces each, and the traces."""
    out = []
    for n in range(files):
        rng = random.Random(f"{family.name}:{seed}:{n}")
        if family.make_node is not None:
            traces = family.make_node(rng)
        else:
            traces = [family.make(rng) for _ in range(GPUS)]
        lines = [
            f"name: backtest-{family.name}-{seed}-{n}",
            f"description: {family.description}",
            f"duration: {family.days}d",
            f"step: {STEP}",
            "gpus: {count: 8, model: NVIDIA H100 80GB HBM3}",
            "timeline:",
        ]
        events = sorted((t, gpu, text) for gpu, tr in enumerate(traces) for t, text in tr.events)
        for t, gpu, text in events:
            body = text.replace("{bus}", BUS_IDS[gpu].lower())
            if body.startswith("kernel_log:"):
                lines.append(f"  - at: {t:.0f}")
            else:
                lines.append(f"  - at: {t:.0f}\n    gpu: {gpu}")
            lines.append(f"    {body}")
        out.append(("\n".join(lines) + "\n", traces))
    return out


@dataclass
class Score:
    """Pages and drains of one family. A *page* is a firing of a page-severity rule (every one
    but ``GpuXidFatal``, which answers the uncorrectable error itself); a *drain* a firing of
    a rule that drains (same exception): the graceful tier. On a precursor trace the first
    of each before the error counts, with its lead time; on a benign trace every one is
    false."""

    family: Family
    traces: int = 0
    gpu_days: float = 0.0
    detected: int = 0  # paged before the error
    precursors: int = 0
    leads: list[float] = field(default_factory=list)  # hours from the first page to the error
    drain_leads: list[float] = field(default_factory=list)  # from the first drain (0: none)
    action_leads: list[float] = field(default_factory=list)  # from the first page or drain
    within_hour: int = 0  # corroborated: paged within 1 h of the corroborating event
    false_pages: int = 0
    false_drains: int = 0
    false_drains_by_rule: dict[str, int] = field(default_factory=dict)  # which rule drained
    tickets: int = 0  # ticket firings on every trace (issue 25: tickets people can act on)
    ticket_gpus: int = 0  # traces with at least one ticket
    node_tickets: int = 0  # node-level ticket firings (no GPU: a node-wide event's one)

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.false_pages / self.gpu_days if self.gpu_days else 0.0

    @property
    def false_drains_per_1000(self) -> float:
        return 1000.0 * self.false_drains / self.gpu_days if self.gpu_days else 0.0

    def false_drains_per_1000_by_rule(self) -> dict[str, float]:
        if not self.gpu_days:
            return {}
        days = self.gpu_days
        return {rule: 1000.0 * n / days for rule, n in sorted(self.false_drains_by_rule.items())}

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": self.family.name,
            "traces": self.traces,
            "gpu_days": round(self.gpu_days),
            "false_pages_per_1000_gpu_days": round(self.false_per_1000, 3),
            "false_drains_per_1000_gpu_days": round(self.false_drains_per_1000, 3),
            "false_drains_per_1000_gpu_days_by_rule": {
                rule: round(v, 3) for rule, v in self.false_drains_per_1000_by_rule().items()
            },
            # ticket firings per month on a GPU that had any (30 days a month)
            "tickets_per_ticketed_gpu_month": round(
                self.tickets / (self.ticket_gpus * self.family.days / 30.0), 2
            )
            if self.ticket_gpus
            else 0.0,
            # the share of GPUs with a ticket of their own, and node tickets per node-month
            # (one file is one node of GPUS traces)
            "ticketed_gpu_share": round(self.ticket_gpus / self.traces, 3) if self.traces else 0.0,
            "node_tickets_per_node_month": round(
                self.node_tickets / (self.traces / GPUS * self.family.days / 30.0), 2
            )
            if self.traces
            else 0.0,
        }
        if self.family.precursor:
            n = max(self.precursors, 1)

            def share(values: list[float], hours: float) -> float:
                return round(sum(1 for x in values if x >= hours) / n, 3)

            out["detected"] = round(self.detected / n, 3)
            out["lead_p10_h"] = _pct(self.leads, 10)
            out["lead_p50_h"] = _pct(self.leads, 50)
            out["share_lead_24h"] = share(self.leads, 24)
            out["share_lead_6h"] = share(self.leads, 6)
            out["share_lead_1h"] = share(self.leads, 1)
            out["drained"] = round(sum(1 for x in self.drain_leads if x > 0) / n, 3)
            out["share_drain_24h"] = share(self.drain_leads, 24)
            out["share_action_6h"] = share(self.action_leads, 6)
            out["share_action_24h"] = share(self.action_leads, 24)
            if self.family.corroborated:
                out["within_1h_of_corroboration"] = round(self.within_hour / n, 3)
        return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return round(s[k], 1)


class _Actions:
    """Collects ``(time since the start, gpu)`` of each page and each drain firing (and the
    drain's rule)."""

    def __init__(self, pages: set[str], drains: set[str]) -> None:
        self.pages = pages
        self.drains = drains
        self.paged: list[tuple[float, int]] = []
        self.drained: list[tuple[float, int, str]] = []
        self.tickets: list[tuple[float, int]] = []
        self.node_tickets = 0

    def record(self, record: dict[str, Any]) -> None:
        if record.get("record") != "alert" or record["state"] != "firing":
            return
        if record.get("gpu") is None:
            self.node_tickets += record.get("severity") == "ticket"
            return
        at = (float(record["timestamp"]) - SIM_EPOCH, int(record["gpu"]))
        if record["rule"] in self.pages:
            self.paged.append(at)
        if record["rule"] in self.drains:
            self.drained.append((*at, record["rule"]))
        if record.get("severity") == "ticket":
            self.tickets.append(at)


def page_rules(config: Config) -> set[str]:
    """Every page-severity rule except the one on the uncorrectable error itself (XID 48)."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules.loader import rules_from_settings

    return {
        r.name
        for r in rules_from_settings(for_rules(config)).rules
        if r.severity is AlertSeverity.PAGE and r.name != "GpuXidFatal"
    }


def drain_rules(config: Config) -> set[str]:
    """Every rule that drains, except the one on the uncorrectable error itself."""
    from gpuwatchd.configfile.stages import for_rules
    from gpuwatchd.rules.loader import rules_from_settings

    return {
        r.name
        for r in rules_from_settings(for_rules(config)).rules
        if r.drain and r.name != "GpuXidFatal"
    }


def run_family(
    family: Family,
    seed: int,
    files: int,
    config: Config | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Score:
    """Play the family's files through the pipeline and score them; ``progress(done,
    files)`` after each file."""
    config = config or default_config({})
    pages, drains = page_rules(config), drain_rules(config)
    score = Score(family)
    for done, (text, traces) in enumerate(generate(family, seed, files), 1):
        seen = _Actions(pages, drains)
        scenario = parse_scenario(text, f"backtest-{family.name}.yaml")
        Simulation(scenario, config, on_record=seen.record).run()
        score.traces += len(traces)
        score.gpu_days += len(traces) * family.days
        score.node_tickets += seen.node_tickets
        for gpu, tr in enumerate(traces):
            paged = sorted(t for t, g in seen.paged if g == gpu)
            mine = [(t, rule) for t, g, rule in seen.drained if g == gpu]
            drained = sorted(t for t, _ in mine)
            tickets = sum(1 for _, g in seen.tickets if g == gpu)
            score.tickets += tickets
            score.ticket_gpus += tickets > 0
            if tr.dbe_at is None:
                score.false_pages += len(paged)
                score.false_drains += len(drained)
                by_rule = score.false_drains_by_rule
                for _, rule in mine:
                    by_rule[rule] = by_rule.get(rule, 0) + 1
                continue
            dbe = tr.dbe_at
            score.precursors += 1
            # every page of a GPU heading for (or past) its uncorrectable error is true
            before = [t for t in paged if t < dbe]
            drained_before = [t for t in drained if t < dbe]
            if before:
                score.detected += 1
                score.leads.append((dbe - before[0]) / HOUR)
                if tr.corroborated_at is not None and before[0] - tr.corroborated_at <= HOUR:
                    score.within_hour += 1
            else:
                score.leads.append(0.0)
            score.drain_leads.append((dbe - drained_before[0]) / HOUR if drained_before else 0.0)
            first = min([*before[:1], *drained_before[:1]], default=None)
            score.action_leads.append((dbe - first) / HOUR if first is not None else 0.0)
        if progress is not None:
            progress(done, files)
    return score


def fleet_false_per_1000(scores: Iterable[Score], active: float = ERROR_ACTIVE) -> float:
    """Benign false pages per 1000 GPU-days, weighted by each history's share of a fleet
    whose ``active`` share of GPU-days logs corrected errors (the weights are set at 5 %;
    healthy GPUs, the rest, page never)."""
    scale = active / ERROR_ACTIVE
    return sum(s.family.weight * scale * s.false_per_1000 for s in scores if not s.family.precursor)


def fleet_false_drains_per_1000(scores: Iterable[Score], active: float = ERROR_ACTIVE) -> float:
    """The same for drains."""
    scale = active / ERROR_ACTIVE
    return sum(
        s.family.weight * scale * s.false_drains_per_1000 for s in scores if not s.family.precursor
    )


def fleet_false_drains_by_rule(
    scores: Iterable[Score], active: float = ERROR_ACTIVE
) -> dict[str, float]:
    """The fleet's false drains split by the rule that drained: the statistical evidence
    (the rate test, the stream) apart from a drain that applies a repair (a pending row
    remap needs a reset, so ``GpuRowRemapPending`` drains to apply it, once per remap)."""
    scale = active / ERROR_ACTIVE
    out: dict[str, float] = {}
    for s in scores:
        if s.family.precursor:
            continue
        for rule, v in s.false_drains_per_1000_by_rule().items():
            out[rule] = out.get(rule, 0.0) + s.family.weight * scale * v
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def family_named(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)
