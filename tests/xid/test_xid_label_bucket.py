"""The ``xid`` label of gpuwatchd_xid_errors_total is bounded (issue 15 item 12)."""

from __future__ import annotations

import time

from gpuwatchd.core.nodestate import NodeState
from gpuwatchd.exposition.metrics import XID_OTHER_LABEL, MetricsRenderer
from gpuwatchd.xid import Catalog


def _xid_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("gpuwatchd_xid_errors_total{")]


def test_codes_outside_the_catalog_share_one_label() -> None:
    """Failed on main: 100,000 distinct codes made 100,000 series (15.8 MB of /metrics)."""
    state = NodeState("n1", time.time())
    renderer = MetricsRenderer(state.view)
    empty = len(renderer.render())
    known = Catalog.default().codes()
    for code in range(1000, 101_000):
        state.count_xid(None, code)
    state.count_xid(None, 79, 3)
    state.count_xid(None, known[0])
    text = renderer.render().decode()
    lines = _xid_lines(text)
    assert len(lines) == 3, lines
    assert f'xid="{XID_OTHER_LABEL}"}} 100000.0' in text
    assert 'xid="79"} 3.0' in text
    assert f'xid="{known[0]}"}} 1.0' in text
    assert len(text) < empty + 1024


def test_every_catalog_code_keeps_its_own_label() -> None:
    state = NodeState("n1", time.time())
    codes = Catalog.default().codes()
    for code in codes:
        state.count_xid(None, code)
    lines = _xid_lines(MetricsRenderer(state.view).render().decode())
    assert len(lines) == len(codes)
    assert not any(f'xid="{XID_OTHER_LABEL}"' in line for line in lines)


def test_distinct_codes_cannot_grow_the_counts_without_bound() -> None:
    """Issue 26: /metrics was bounded, but the counts behind it (and /api/v1/status, which
    lists them) kept one entry per distinct (GPU, code): 100,000 codes, 100,000 entries.
    Failed on main. Now at most ``MAX_XID_KEYS`` pairs are kept apart and the rest are
    counted under ``XID_OVERFLOW`` of their GPU; no XID goes uncounted."""
    from gpuwatchd.core.nodestate import MAX_XID_KEYS, XID_OVERFLOW

    state = NodeState("n1", time.time())
    for code in range(1000, 101_000):
        state.count_xid(code % 8, code)  # a code from 1000 up: the driver's are under 200
    state.count_xid(3, 79, 2)
    counts = state.view().xid_counts
    assert len(counts) <= MAX_XID_KEYS + 8 + 1
    assert sum(counts.values()) == 100_002
    assert sum(n for (_, code), n in counts.items() if code == XID_OVERFLOW) > 90_000
    assert counts[(3, 79)] == 2
    text = MetricsRenderer(state.view).render().decode()
    assert f'xid="{XID_OTHER_LABEL}"' in text
