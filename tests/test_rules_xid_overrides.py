"""XID overrides from the config reach the page: its action text follows the new action."""

from __future__ import annotations

from rulekit import Node, rules

from gpuwatchd.rules.engine import Engine
from gpuwatchd.xid.catalog import Catalog

RULE = """
rules:
- name: Fatal
  severity: page
  condition:
    xid: {codes: [79]}
  annotations: {action: '{action}'}
"""


def _page_action(catalog: Catalog) -> str:
    n = Node(RULE, gpus=2)
    n.engine = Engine(rules(RULE), n.store, n.clock, catalog=catalog)
    n.poll()
    n.xid(1, 79)
    n.step(10)
    tr = next(tr for _, tr in n.transitions if tr.rule == "Fatal")
    return tr.annotations["action"]


def test_an_overridden_action_changes_the_action_text_on_the_page() -> None:
    assert _page_action(Catalog.default()) == "Reboot the node."
    moved = Catalog.default().with_overrides({79: {"action": "investigate"}})
    text = _page_action(moved)
    assert text != "Reboot the node." and text.startswith("Investigate")
