"""Issue 23 item 7: docs/config.md says what a reload (SIGHUP) applies, and that is what
the daemon does: every top-level key is in the table, the keys marked restart are exactly
the daemon's RESTART_ONLY, and the others have a reload hook (rules, xid, receivers,
routing, drain, log_level).

Before: the page said receiver, routing and drain changes need a restart (a reload has
applied them since the actions' reload hook), and `sources` and `log_format` changed
silently without taking effect."""

from __future__ import annotations

import re

from conftest import ROOT

from gpuwatchd.config.loader import Config
from gpuwatchd.service.daemon import RESTART_ONLY

HOOKED = {"rules", "xid", "receivers", "routing", "drain", "log_level"}


def reload_table() -> dict[str, str]:
    text = (ROOT / "docs" / "config.md").read_text()
    section = text.split("## Reload (SIGHUP)", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| (applied|restart)\b", section, re.M)
    return dict(rows)


def test_every_top_level_key_is_in_the_reload_table() -> None:
    keys = set(Config.__dataclass_fields__) - {"source"}
    assert set(reload_table()) == keys


def test_the_table_says_what_the_daemon_does() -> None:
    table = reload_table()
    assert {k for k, v in table.items() if v == "restart"} == set(RESTART_ONLY)
    assert {k for k, v in table.items() if v == "applied"} == HOOKED


def test_no_page_says_receivers_need_a_restart() -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    assert "`drain` take effect at the next restart" not in text
