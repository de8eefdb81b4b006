"""The ECC-leak simulation stepped until it pages, and an HTML element collector, for the
status page's tests (tests/exposition/test_status_page.py, test_status_document.py)."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

from actions_support import make_config
from conftest import ROOT

from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario

RULE = "GpuMemoryErrorsAccelerating"


class Dom(HTMLParser):
    """Elements with their attributes and the id of the section they sit in."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str], str]] = []
        self.scripts = 0
        self._section = ""
        self.text: dict[str, list[str]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "section":
            self._section = a.get("id", "")
        external = "://" in a.get("href", a.get("src", ""))
        if tag == "script" or (tag in ("link", "img") and external):
            self.scripts += 1
        self.elements.append((tag, a, self._section))

    def handle_endtag(self, tag: str) -> None:
        if tag == "section":
            self._section = ""

    def handle_data(self, data: str) -> None:
        self.text.setdefault(self._section, []).append(data)


def firing_sim(tmp_path: Path) -> Simulation:
    """The ECC-leak scenario, stepped until the memory-trend rule pages (on GPU 4)."""
    sim = Simulation(
        load_scenario(str(ROOT / "scenarios" / "ecc-leak.yaml")), make_config(tmp_path, "")
    )
    step, n = sim.scenario.step, 0
    while not any(a["rule"] == RULE for a in sim.node.firing()):
        sim.step()
        n += 1
        assert n * step <= sim.scenario.duration, "the rule never fired"
        sim.advance_to(sim.t0 + n * step)
    for _ in range(int(3600 / step)):  # an hour more: the chart shows the firing moment
        sim.step()
        n += 1
        sim.advance_to(sim.t0 + n * step)
    return sim
