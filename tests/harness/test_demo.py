"""The demo tells the headline (issue 12 item 7): a leak that accelerates over days, played
in seconds, pages on the memory trend with its lead time well before the double-bit error,
and the summary lists what is still firing.

- played in 4 s (over 150,000x), the bundled demo still plays its whole week: the
  memory-trend page comes before the XID 48, the narrator prints a lead time of more than
  a day, and the end (GPU 3 lost on day 7) is in the summary;
- the narrator's lead time: from the first memory-trend *page* on the GPU to its first
  double-bit error (XID 48 or a rising uncorrected counter), once per GPU; a ticket, a
  page after the error, or no page at all is told as "no lead time";
- the scenario's notes come before what gpuwatchd noticed later;
- the demo clock never spins: a wait sleeps at least ``MIN_REAL_WAIT`` of wall time;
- the XID merge window and the stale poll timeout keep their wall-time meaning at any
  speed: a busy machine does not make GPUs stale or split one XID in two.
"""

from __future__ import annotations

import dataclasses
import io
import re
import threading
import time
from types import MappingProxyType

from gpuwatchd.configfile.loader import ListenAddress
from gpuwatchd.core.alerts import AlertSeverity, AlertState, AlertTransition
from gpuwatchd.core.records import GpuSample, XidEvent
from gpuwatchd.harness.demo import (
    MIN_REAL_WAIT,
    DemoClock,
    Narrator,
    Style,
    default_demo_config,
    demo_config,
    run_demo,
)
from gpuwatchd.scenario.model import bundled_scenario_path, load_scenario, parse_scenario

T0 = 1_767_225_600.0
HOUR = 3600.0
STAMP = re.compile(r"^\[\+(\d+):(\d\d):(\d\d)\]")


def hours_at(line: str) -> float:
    m = STAMP.match(line)
    assert m is not None, line
    return int(m.group(1)) + int(m.group(2)) / 60 + int(m.group(3)) / 3600


def test_demo_in_seconds_pages_the_trend_a_day_before_the_double_bit_error() -> None:
    demo = load_scenario(bundled_scenario_path("demo"))
    assert demo.duration >= 6 * 86400  # days of node time...
    base = dataclasses.replace(default_demo_config(), listen=ListenAddress("127.0.0.1", 0))
    out = io.StringIO()
    began = time.monotonic()
    assert run_demo(demo, base, seconds=4.0, out=out, color=False) == 0
    assert time.monotonic() - began < 30  # ...in seconds (the end waits for the daemon)
    text = out.getvalue()
    try:
        tells_the_headline(demo.notes[-1].text, text)
    except (AssertionError, StopIteration) as exc:  # show what the demo printed
        raise AssertionError(f"{exc!r}\n--- the demo printed ---\n{text[-8000:]}") from None


def tells_the_headline(last_note: str, text: str) -> None:
    story, _, summary = text.partition("\nSummary")
    lines = story.splitlines()
    # the rate drains the node and opens a ticket; the GPU's own certificate (errors that
    # continue after the row remap took effect) pages
    drain = next(
        i for i, x in enumerate(lines) if "ALERT [ticket] GpuMemoryErrorsAccelerating: GPU 5" in x
    )
    page = next(
        i for i, x in enumerate(lines) if "ALERT [page]   GpuMemoryErrorsCorroborated: GPU 5" in x
    )
    assert not any("ALERT [page]   GpuMemoryErrorsAccelerating" in x for x in lines)
    assert any("DRAIN node demo-node" in x and "GpuMemoryErrorsAccelerating" in x for x in lines)
    # the double-bit error shows as XID 48 or as the uncorrected counter's rise, whichever
    # the daemon noticed first (on a busy machine the poll can beat the XID readers)
    dbe = next(
        i
        for i, x in enumerate(lines)
        if re.search(r"GPU 5 \(\S+\): XID 48 from|GPU 5: UNCORRECTED ECC errors 0 -> 1", x)
    )
    assert drain < page < dbe
    assert hours_at(lines[dbe]) - hours_at(lines[page]) >= 24
    told = re.search(
        r"lead time: GpuMemoryErrorsCorroborated paged (\d+) h of node time before "
        r"GPU 5's double-bit error",
        story,
    )
    assert told is not None, story[-3000:]
    assert int(told.group(1)) >= 24
    drained = re.search(
        r"lead time: GpuMemoryErrorsAccelerating drained the node \(a ticket\) (\d+) h of node "
        r"time before GPU 5's double-bit error",
        story,
    )
    assert drained is not None and int(drained.group(1)) >= int(told.group(1))
    assert dbe < next(i for i, x in enumerate(lines) if "lead time:" in x)
    # the kernel-log and NVML reports of the XID are one incident, even this fast
    assert len([x for x in lines if re.search(r"GPU 5 \(\S+\): XID 48 from", x)]) == 1
    assert any("GPU 5: XID 48 confirmed by scenario+nvml" in x for x in lines)
    assert "STALE" not in story  # no GPU stalls in this story, however busy the machine
    assert any("-> DRAIN node demo-node" in x for x in lines[dbe:])  # XID 48 drains
    # the end was played, not cut off: the last note, GPU 3 lost, and nothing after it
    assert last_note in story
    assert "GPU 3 00000000:5D:00.0 lost (GpuLost" in summary
    # one verdict: GPU 5, with a page, a double-bit error and a pending remap, is not "ok"
    gpu5 = next(x for x in summary.splitlines() if x.startswith("  GPU 5 "))
    assert " failing (" in gpu5 and "GpuMemoryErrorsCorroborated" in gpu5, gpu5
    assert "GpuRowRemapPending" in gpu5, gpu5
    assert f"Lead time: GpuMemoryErrorsCorroborated paged {told.group(1)} h" in summary
    assert "alert(s) still firing:" in summary
    for firing in (
        "[ticket] GpuMemoryErrorsAccelerating on GPU 5",
        "[page] GpuMemoryErrorsCorroborated on GPU 5",
        "[page] GpuLost on GPU 3",
        "[ticket] GpuRowRemapPending on GPU 5",
    ):
        assert firing in summary, summary
    assert not [x for x in summary.splitlines() if STAMP.match(x)]  # nothing after it


SCENARIO = parse_scenario(
    """
name: lead
duration: 3d
gpus: {count: 8}
timeline:
  - {at: 1h, note: "first note"}
  - {at: 2d, note: "second note"}
""",
    "lead.yaml",
)


def narrator(trend: frozenset[str] = frozenset({"Trend"})) -> tuple[Narrator, io.StringIO]:
    out = io.StringIO()
    n = Narrator(SCENARIO, out, Style(color=False), DemoClock(1.0, start=T0), trend)
    n.t0 = T0
    return n, out


def fired(
    rule: str, gpu: int, at: float, severity: AlertSeverity, drain: bool = False
) -> AlertTransition:
    return AlertTransition(
        rule=rule,
        state=AlertState.FIRING,
        severity=severity,
        labels=MappingProxyType({"gpu": str(gpu)}),
        timestamp=T0 + at,
        drain=drain,
    )


def xid48(gpu: int, at: float) -> XidEvent:
    return XidEvent(timestamp=T0 + at, source="scenario", xid=48, gpu=gpu, pci_bus_id="x")


def test_lead_time_runs_from_the_first_trend_page_to_the_first_double_bit_error() -> None:
    n, out = narrator()
    n.alert(fired("Trend", 5, 10 * HOUR, AlertSeverity.PAGE))
    n.alert(fired("Trend", 5, 20 * HOUR, AlertSeverity.PAGE))  # a later page: not the lead
    n.alert(fired("Trend", 2, 30 * HOUR, AlertSeverity.PAGE))  # another GPU's
    n.record(xid48(5, 51 * HOUR))
    n.record(xid48(5, 52 * HOUR))  # told once
    text = out.getvalue()
    assert text.count("lead time") == 1
    assert "lead time: Trend paged 41 h of node time before GPU 5's double-bit error" in text
    assert n.leads == ["Trend paged 41 h of node time before GPU 5's double-bit error"]


def test_a_drain_on_the_rate_and_a_page_on_a_certificate_each_tell_their_lead() -> None:
    n, out = narrator()
    n.alert(fired("Trend", 5, 10 * HOUR, AlertSeverity.TICKET, drain=True))
    n.alert(fired("Trend", 5, 12 * HOUR, AlertSeverity.TICKET, drain=True))  # not the first
    n.alert(fired("Trend", 5, 20 * HOUR, AlertSeverity.PAGE))
    n.record(xid48(5, 51 * HOUR))
    assert n.leads == [
        "Trend drained the node (a ticket) 41 h of node time before GPU 5's double-bit error",
        "Trend paged 31 h of node time before GPU 5's double-bit error",
    ]
    assert out.getvalue().count("lead time: ") == 2


def test_a_rising_uncorrected_counter_is_a_double_bit_error_too() -> None:
    n, out = narrator()
    n.alert(fired("Trend", 1, 0.0, AlertSeverity.PAGE))
    for at, value in ((HOUR, 0.0), (2.5 * HOUR, 1.0)):
        n.record(GpuSample(1, "u", T0 + at, fields={"ecc_uncorrected_volatile": value}))
    assert n.leads == ["Trend paged 2h30m of node time before GPU 1's double-bit error"]
    assert "UNCORRECTED ECC errors 0 -> 1" in out.getvalue()


def test_no_lead_time_without_a_trend_page_before_the_error() -> None:
    n, _ = narrator()
    n.alert(fired("Trend", 3, HOUR, AlertSeverity.TICKET))  # a ticket without a drain: none
    n.alert(fired("Other", 4, HOUR, AlertSeverity.PAGE))  # not a memory-trend rule
    n.record(xid48(3, 5 * HOUR))
    n.record(xid48(4, 5 * HOUR))
    n.alert(fired("Trend", 6, 9 * HOUR, AlertSeverity.PAGE))
    n.record(xid48(6, 8 * HOUR))  # came in late: the page was after the error
    assert n.leads == [
        f"GPU {g}'s double-bit error came with no memory drain or page before it" for g in (3, 4, 6)
    ]


def test_notes_come_before_what_was_noticed_later_and_nothing_after_mute() -> None:
    n, out = narrator()
    n.finding(T0 + 3 * HOUR, "something")
    n.notes_until(2 * 86400.0)
    n.muted = True
    n.finding(T0 + 2.5 * 86400, "after the summary")
    assert [x.split("] ", 1)[1] for x in out.getvalue().splitlines()] == [
        "scenario: first note",
        "!  something",
        "scenario: second note",
    ]


def test_the_demo_clock_sleeps_a_little_instead_of_spinning() -> None:
    clock = DemoClock(1e6)
    event = threading.Event()
    began = time.monotonic()
    for _ in range(5):
        assert not clock.wait(event, 1.0)  # one clock second: a microsecond of wall time
    assert time.monotonic() - began >= 5 * MIN_REAL_WAIT * 0.9
    assert not clock.wait(event, 0.0)  # a zero wait only looks
    event.set()
    began = time.monotonic()
    assert clock.wait(event, 1e9)  # a set event returns at once
    assert time.monotonic() - began < 5.0  # not 1e9 s: a bound that holds under load


def test_merge_window_and_stale_timeout_keep_their_wall_time_meaning() -> None:
    base = default_demo_config()
    listen = ListenAddress("127.0.0.1", 0)
    assert demo_config(base, SCENARIO, listen).sources.merge_window == 3.0  # the config's
    assert demo_config(base, SCENARIO, listen, 240.0).sources.merge_window == 60.0  # 0.25 s
    assert demo_config(base, SCENARIO, listen, 1e6).sources.merge_window == 250_000.0
    fast = demo_config(base, SCENARIO, listen, 1e6).poll
    assert fast.interval == SCENARIO.step
    assert fast.call_timeout == 250_000.0  # stale after 0.25 s of wall time, not 1 ms
    assert demo_config(base, SCENARIO, listen, 2.0).poll.call_timeout == SCENARIO.step
