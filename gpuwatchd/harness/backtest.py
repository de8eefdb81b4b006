"""``gpuwatchd backtest``: score the memory rules on labelled, seeded scenario families.

Each family describes one kind of GPU history (a leak that ends in an uncorrectable error,
a steady trickle, one bad job's burst, ...). ``generate`` expands a family into scenario
files in the ordinary scenario format: 8 GPUs per file, each GPU its own seeded trace, 30
days at a 5-minute step. ``run_family`` plays every file through the real pipeline on the
virtual clock (``harness.simulate.Simulation``, the shipped rules or a config's) and
scores the pages of the memory rules (severity ``page``, condition ``memory_trend`` or
``trend``):

- precursor families: the share of traces paged before the uncorrectable error, and the
  lead time (p10, p50) from the first page to that error; for corroborated traces, the
  share paged within an hour of the corroborating event;
- every family: pages that are not a detection (on a benign GPU, or after the error) per
  1000 GPU-days;
- the fleet: benign rates weighted by how common each history is in a fleet (``weight``:
  the share of GPU-days; about 95 % of GPUs never log a corrected error).

The same seed always gives the same traces and the same scores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuwatchd.config.loader import Config, default_config
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
MEMORY_KINDS = frozenset({"memory_trend", "trend"})


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

    def add(self, t: float, count: int) -> None:
        if count > 0 and 0 <= t < self.days * DAY:
            self.events.append((t, f"add: {{{CORRECTED}: {count}}}"))

    def poisson(self, rng: random.Random, start: float, end: float, per_day: float) -> None:
        """Errors one at a time at random (a Poisson process of ``per_day``)."""
        if per_day <= 0:
            return
        t = start + rng.expovariate(per_day / DAY)
        while t < end:
            self.add(t, 1)
            t += rng.expovariate(per_day / DAY)

    def xid_line(self, t: float, code: int, pid: int) -> None:
        if 0 <= t < self.days * DAY:
            self.events.append(
                (
                    t,
                    f'kernel_log: "NVRM: Xid (PCI:0000:{{bus}}:00): {code}, pid={pid}, '
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


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    make: Maker
    precursor: bool
    weight: float = 0.0  # share of a fleet's GPU-days with this history (benign only)
    corroborated: bool = False
    xid: bool = False  # scored on every page (the XID rules), not only the memory rules
    days: int = DAYS  # the length of each trace (every trace of the family alike)


# -- precursors ------------------------------------------------------------------------------
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
    tr = Trace()
    tr.poisson(rng, 0.0, DAYS * DAY, rng.choice((1.0, 4.0)))
    t = rng.uniform(1, 4) * DAY
    while t < DAYS * DAY:
        tr.events.append((t, f"set: {{{CORRECTED}: 0}}"))
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
        weight=0.02,
    ),
    Family(
        "heavy-episodes",
        "episodes 1/week, 1/day or 4/day of Pareto size",
        _heavy_episodes,
        False,
        weight=0.01,
    ),
    Family(
        "single-burst",
        "one burst of 10 min to 12 h, 10 to 10^6 errors",
        _burst,
        False,
        weight=0.005,
    ),
    Family(
        "job-modulated", "sessions of 2-48 h every 2-5 days", _job_modulated, False, weight=0.005
    ),
    Family("step", "from 0 to a steady 1/day .. 10/hour", _step, False, weight=0.005),
    Family(
        "counter-resets",
        "a trickle with a driver reload every 1-6 days",
        _resets,
        False,
        weight=0.004,
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
        xid=True,
    ),
)
HEALTHY_WEIGHT = 0.95  # no corrected error at all: no memory page is possible


def generate(family: Family, seed: int, files: int) -> list[tuple[str, list[Trace]]]:
    """``files`` scenario texts of ``GPUS`` traces each, and the traces."""
    out = []
    for n in range(files):
        rng = random.Random(f"{family.name}:{seed}:{n}")
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
    family: Family
    traces: int = 0
    gpu_days: float = 0.0
    detected: int = 0
    precursors: int = 0
    leads: list[float] = field(default_factory=list)  # hours before the error
    within_hour: int = 0  # corroborated: paged within 1 h of the corroborating event
    false_pages: int = 0

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.false_pages / self.gpu_days if self.gpu_days else 0.0

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "family": self.family.name,
            "traces": self.traces,
            "gpu_days": round(self.gpu_days),
            "false_pages_per_1000_gpu_days": round(self.false_per_1000, 3),
        }
        if self.family.precursor:
            out["detected"] = round(self.detected / max(self.precursors, 1), 3)
            out["lead_p10_h"] = _pct(self.leads, 10)
            out["lead_p50_h"] = _pct(self.leads, 50)
            out["share_lead_24h"] = round(
                sum(1 for x in self.leads if x >= 24) / max(self.precursors, 1), 3
            )
            out["share_lead_6h"] = round(
                sum(1 for x in self.leads if x >= 6) / max(self.precursors, 1), 3
            )
            if self.family.corroborated:
                out["within_1h_of_corroboration"] = round(
                    self.within_hour / max(self.precursors, 1), 3
                )
        return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return round(s[k], 1)


class _Pages:
    """Collects ``(time since the start, gpu)`` of each memory page firing."""

    def __init__(self, rules: set[str]) -> None:
        self.rules = rules
        self.fired: list[tuple[float, int]] = []

    def record(self, record: dict[str, Any]) -> None:
        if (
            record.get("record") == "alert"
            and record["state"] == "firing"
            and record["rule"] in self.rules
            and record.get("gpu") is not None
        ):
            self.fired.append((float(record["timestamp"]) - SIM_EPOCH, int(record["gpu"])))


def page_rules(config: Config) -> set[str]:
    """Every page-severity rule except those on the uncorrectable error itself (XID 48 and
    the counters it moves), for the XID families."""
    from gpuwatchd.rules.loader import rules_from_config

    return {
        r.name
        for r in rules_from_config(config).rules
        if r.severity is AlertSeverity.PAGE and r.name != "GpuXidFatal"
    }


def memory_page_rules(config: Config) -> set[str]:
    from gpuwatchd.rules.loader import rules_from_config

    return {
        r.name
        for r in rules_from_config(config).rules
        if r.severity is AlertSeverity.PAGE and r.kind in MEMORY_KINDS
    }


def run_family(family: Family, seed: int, files: int, config: Config | None = None) -> Score:
    config = config or default_config({})
    pages = page_rules(config) if family.xid else memory_page_rules(config)
    score = Score(family)
    for text, traces in generate(family, seed, files):
        pager = _Pages(pages)
        scenario = parse_scenario(text, f"backtest-{family.name}.yaml")
        Simulation(scenario, config, on_record=pager.record).run()
        fired = pager.fired
        score.traces += len(traces)
        score.gpu_days += len(traces) * family.days
        for gpu, tr in enumerate(traces):
            mine = sorted(t for t, g in fired if g == gpu)
            if tr.dbe_at is None:
                score.false_pages += len(mine)
                continue
            score.precursors += 1
            # every page of a GPU heading for (or past) its uncorrectable error is true
            before = [t for t in mine if t < tr.dbe_at]
            if before:
                score.detected += 1
                score.leads.append((tr.dbe_at - before[0]) / HOUR)
                if tr.corroborated_at is not None and before[0] - tr.corroborated_at <= HOUR:
                    score.within_hour += 1
            else:
                score.leads.append(0.0)
    return score


def fleet_false_per_1000(scores: Iterable[Score]) -> float:
    """Benign false pages per 1000 GPU-days, weighted by each history's share of a fleet
    (healthy GPUs, the rest of the weight, page never)."""
    return sum(
        s.family.weight * s.false_per_1000
        for s in scores
        if not s.family.precursor and not s.family.xid
    )


def family_named(name: str) -> Family:
    for f in FAMILIES:
        if f.name == name:
            return f
    raise KeyError(name)
