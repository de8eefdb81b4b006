"""Property tests: hostile or random input never crashes a parser outside its documented
error type."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuwatchd.core.errors import ConfigError
from gpuwatchd.core.records import XidEvent
from gpuwatchd.sources.kernel.linehandler import GpuResolver, KernelLineHandler
from gpuwatchd.testing.fake_backend import make_infos
from gpuwatchd.xid.parser import XidStream, parse_kmsg_record, parse_line

HEADERS = st.sampled_from(
    [
        "NVRM: Xid (PCI:0000:3b:00): ",
        "NVRM: Xid (0000:01:00): ",
        "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): ",
        "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
        "NVRM: GPU at PCI:0000:3b:00: GPU-",
        "4,12,3456,-;",
        "[  12.5] ",
        "kernel: ",
        "pid=",
        ", name=",
    ]
)
# Text that looks like kernel-log lines often enough to reach the deep parser paths.
LINES = st.lists(st.one_of(HEADERS, st.text(max_size=40)), max_size=8).map("".join)


@settings(max_examples=400, deadline=None)
@given(LINES)
def test_parse_line_never_raises(line: str) -> None:
    found = parse_line(line)
    if found is not None:
        assert found.pci.count(":") == 2 and found.xid >= 0


@settings(max_examples=300, deadline=None)
@given(LINES)
def test_kmsg_record_never_raises(raw: str) -> None:
    record = parse_kmsg_record(raw)
    if record is not None:
        assert record.facility >= 0 and 0 <= record.level <= 7


@settings(max_examples=200, deadline=None)
@given(st.lists(LINES, max_size=10), st.booleans())
def test_line_handler_never_raises_and_never_trusts_forgery(
    lines: list[str], trusted: bool
) -> None:
    events: list[XidEvent] = []
    handler = KernelLineHandler("kmsg", GpuResolver(make_infos(8)), events)
    for line in lines:
        handler.handle(line, 1.0, trusted)
    if not trusted:
        assert events == []


@settings(max_examples=200, deadline=None)
@given(st.lists(LINES, max_size=20))
def test_stream_never_raises(lines: list[str]) -> None:
    stream = XidStream()
    for line in lines:
        stream.feed(line)


YAMLISH = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "poll:",
                "  interval: ",
                "listen: ",
                "- ",
                "{",
                "}",
                "[",
                "]",
                ": ",
                "&a ",
                "*a",
                "!!python/object ",
                "\n",
                "  ",
                "5s",
                "'",
                '"',
                "#",
            ]
        ),
        st.text(max_size=12),
    ),
    max_size=20,
).map("".join)


@settings(max_examples=300, deadline=None)
@given(YAMLISH)
def test_config_loader_raises_only_config_error(text: str) -> None:
    from gpuwatchd.config.yamlsrc import parse
    from gpuwatchd.configfile.loader import ReadContext, _build

    try:
        root = parse(text, "fuzz.yaml")
        _build(root, ReadContext({}, None), "fuzz.yaml")
    except ConfigError as exc:
        assert all(line.startswith("fuzz.yaml:") for line in exc.lines())


@settings(max_examples=200, deadline=None)
@given(YAMLISH)
def test_scenario_loader_raises_only_config_error(text: str) -> None:
    from gpuwatchd.scenario.model import parse_scenario

    try:
        parse_scenario(text, "fuzz.yaml")
    except ConfigError as exc:
        assert all(line.startswith("fuzz.yaml:") for line in exc.lines())
