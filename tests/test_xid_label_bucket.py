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
