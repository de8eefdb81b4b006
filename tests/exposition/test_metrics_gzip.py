"""Issue 28 item 6: /metrics gzip-compressed when the scraper takes it (Prometheus sends
``Accept-Encoding: gzip``), on the text and the OpenMetrics paths, with the node's
families compressed once per snapshot; a real Prometheus scrapes it.

Before: every scrape was sent uncompressed (208-258 KB for an 8-GPU node, about 11 KB
gzip), so a 10,000-node fleet moved 2.1-2.6 GB per 15 s round."""

from __future__ import annotations

import gzip
import http.client
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, Proc
from prometheus_support import Prometheus, query, scrape_config, wait_query

from gpuwatchd.configfile.loader import load_config
from gpuwatchd.core.families import CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE, Families
from gpuwatchd.core.nodestate import NodeView
from gpuwatchd.core.statusdoc import StatusDocument
from gpuwatchd.exposition.httpd import HttpServer, accepts_gzip
from gpuwatchd.exposition.metrics import MetricsRenderer
from gpuwatchd.harness.simulate import Simulation
from gpuwatchd.scenario.model import load_scenario


def empty_status() -> StatusDocument:
    return StatusDocument.from_json({"gpus": []})


NODE = ROOT / "scenarios" / "healthy-8xh100.yaml"
OPENMETRICS_ACCEPT = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"


@pytest.mark.parametrize(
    ("header", "takes"),
    [
        ("gzip", True),  # what Prometheus sends
        ("gzip, deflate, br", True),
        ("deflate, GZIP;q=0.5", True),
        ("x-gzip", True),
        ("*", True),
        ("identity, *;q=0.1", True),
        ("", False),
        ("identity", False),
        ("deflate, br", False),
        ("gzip;q=0", False),
        ("gzip;q=0.000", False),
        ("*;q=1, gzip;q=0", False),  # refused by name, whatever * says
        ("gzip;q=nonsense", False),
        ("gzip;q=2", False),
        ("gzipped", False),
        (",,,;;;=", False),
    ],
)
def test_which_accept_encoding_takes_gzip(header: str, takes: bool) -> None:
    assert accepts_gzip(header) is takes


def node_sim(tmp_path: Path, text: str = "") -> Simulation:
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text("node_name: gz1\n" + text)
    sim = Simulation(load_scenario(str(NODE)), load_config(str(cfg), must_exist=True, environ={}))
    sim.step()
    return sim


def without_process(body: bytes) -> bytes:
    """The node's part: the process_* lines are read fresh at every scrape."""
    keep = [ln for ln in body.split(b"\n") if b"process_" not in ln and ln != b"# EOF"]
    return b"\n".join(keep)


def one_member(blob: bytes) -> bytes:
    """Decode exactly one gzip member, which must be the whole of ``blob``."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(blob) + d.flush()
    assert d.eof and not d.unused_data, "not one whole gzip member"
    return out


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_the_gzip_body_is_the_plain_body_compressed(tmp_path: Path, openmetrics: bool) -> None:
    sim = node_sim(tmp_path)
    r = sim.renderer
    render = r.render_openmetrics if openmetrics else r.render
    plain = render()
    packed = render(gzip=True)
    body = one_member(packed)
    assert without_process(body) == without_process(plain)
    assert body.count(b"\nprocess_cpu_seconds_total") == 1  # the fresh tail is in it
    assert body.endswith(b"# EOF\n") is openmetrics
    assert len(packed) * 10 < len(plain), (len(packed), len(plain))


class CountingRenderer(MetricsRenderer):
    """Counts how often the node's families are built (each build is a render)."""

    builds = 0

    def families(self, view: NodeView | None = None) -> Families:
        self.builds += 1
        return super().families(view)


def test_the_node_body_is_compressed_once_per_snapshot(tmp_path: Path) -> None:
    sim = node_sim(tmp_path)
    r = CountingRenderer(sim.state.view)
    first = [one_member(r.render(gzip=True)) for _ in range(5)]
    assert r.builds == 1
    assert len({without_process(b) for b in first}) == 1
    plain = r.render()  # the plain body of the same snapshot is cached too
    assert r.builds == 1 and without_process(plain) == without_process(first[0])
    sim.step()  # a new poll: a new snapshot
    again = one_member(r.render(gzip=True))
    assert r.builds == 2
    assert r.render_openmetrics(gzip=True) and r.builds == 3  # one per format
    assert r.render_openmetrics(gzip=True) and r.builds == 3
    assert without_process(again) == without_process(r.render())


@pytest.fixture
def server(tmp_path: Path) -> Iterator[HttpServer]:
    sim = node_sim(tmp_path)
    srv = HttpServer("127.0.0.1", 0, sim.renderer, lambda: (True, "ok"), empty_status)
    srv.start()
    yield srv
    srv.stop()


def get(srv: HttpServer, headers: dict[str, str], method: str = "GET") -> tuple[Any, bytes]:
    conn = http.client.HTTPConnection(*srv.address, timeout=10)
    try:
        conn.request(method, "/metrics", headers=headers)
        resp = conn.getresponse()
        return resp, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_the_daemon_answers_gzip_only_to_who_takes_it(
    server: HttpServer, openmetrics: bool
) -> None:
    accept = {"Accept": OPENMETRICS_ACCEPT} if openmetrics else {}
    ctype = OPENMETRICS_CONTENT_TYPE if openmetrics else CONTENT_TYPE
    resp, packed = get(server, {**accept, "Accept-Encoding": "gzip"})
    assert resp.status == 200
    assert resp.getheader("Content-Encoding") == "gzip"
    assert resp.getheader("Content-Type") == ctype
    assert "Accept-Encoding" in resp.getheader("Vary")
    assert int(resp.getheader("Content-Length")) == len(packed)
    resp, plain = get(server, {**accept, "Accept-Encoding": "gzip;q=0, identity"})
    assert resp.getheader("Content-Encoding") is None
    assert "Accept-Encoding" in resp.getheader("Vary")
    assert without_process(gzip.decompress(packed)) == without_process(plain)
    resp, head = get(server, {**accept, "Accept-Encoding": "gzip"}, "HEAD")
    assert resp.getheader("Content-Encoding") == "gzip" and head == b""
    fams = Families()
    server.families(fams)
    text = fams.render().decode()
    fmt = "openmetrics" if openmetrics else "text"
    assert f'gpuwatchd_http_metrics_responses_total{{format="{fmt}",encoding="gzip"}} 2.0' in text
    assert (
        f'gpuwatchd_http_metrics_responses_total{{format="{fmt}",encoding="identity"}} 1.0' in text
    )


@pytest.mark.slow
def test_a_real_prometheus_scrapes_gzip(
    tmp_path: Path, daemon_factory: Callable[..., tuple[Proc, str]]
) -> None:
    """Prometheus (which asks for OpenMetrics and gzip) gets the compressed OpenMetrics body,
    decodes it and ingests every series: the daemon counts what it answered."""
    _, daemon_url = daemon_factory("--backend", f"scenario:{NODE}")
    with Prometheus(tmp_path, scrape_config(gpuwatchd=daemon_url)) as prom:
        base = prom.url
        wait_query(base, 'gpuwatchd_http_metrics_responses_total{encoding="gzip"} >= 2')
        answered = {
            (r["metric"]["format"], r["metric"]["encoding"]): float(r["value"][1])
            for r in query(base, "gpuwatchd_http_metrics_responses_total")
        }
        # every answer so far went to Prometheus: all OpenMetrics, all gzip
        assert answered[("openmetrics", "gzip")] >= 2
        assert answered[("openmetrics", "identity")] == 0
        assert answered[("text", "gzip")] == answered[("text", "identity")] == 0
        scraped = query(base, 'scrape_samples_scraped{job="gpuwatchd"}')
        assert float(scraped[0]["value"][1]) > 1000  # 8 GPUs x 18 links: the whole body
        links = query(base, "count(gpuwatchd_nvlink_up)")
        assert float(links[0]["value"][1]) == 144.0
    assert prom.returncode == 0, prom.output()
