"""A real Prometheus (Debian's ``prometheus``) for the tests that need one.

    with Prometheus(tmp_path, scrape_config(gpuwatchd=daemon_url)) as prom:
        wait_query(prom.url, 'up{job="gpuwatchd"} == 1')
    assert prom.returncode == 0, prom.output()

It listens on a free loopback port with its TSDB and log under the test's directory, is
ready when the context is entered (its log in the error when it never is), and is stopped
when the context is left.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from conftest import Proc, free_port, need_binary, wait_http


def query(base: str, promql: str) -> list[dict[str, Any]]:
    """The result vector of one instant query (the API must answer ``success``)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def wait_query(base: str, promql: str, timeout: float = 40.0) -> list[dict[str, Any]]:
    """The first non-empty result of ``promql`` within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = query(base, promql)
        if result:
            return result
        time.sleep(0.25)
    raise AssertionError(f"Prometheus returned nothing for {promql!r} within {timeout}s")


def scrape_config(**jobs: str) -> dict[str, Any]:
    """A configuration that scrapes each job's one target (``host:port`` or an
    ``http://`` URL) every second and evaluates rules every second."""
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target.removeprefix("http://")]}]}
            for job, target in jobs.items()
        ],
    }


class Prometheus:
    """One Prometheus server started with ``config`` (a prometheus.yml as a mapping)."""

    def __init__(self, work: Path, config: dict[str, Any]) -> None:
        binary = need_binary("prometheus")
        self.config_file = work / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._proc = Proc(
            [
                binary,
                f"--config.file={self.config_file}",
                f"--storage.tsdb.path={work / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            work / "prometheus.log",
        )
        self.returncode: int | None = None

    def __enter__(self) -> Prometheus:
        return self.wait_ready()

    def wait_ready(self) -> Prometheus:
        """Wait until it answers (its log in the error when it never does)."""
        try:
            wait_http(self.url + "/-/ready", timeout=20)
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"{exc}\nprometheus output:\n{self.output()}") from None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> int:
        """Stop it (SIGTERM, then SIGKILL after 10 s); its exit status."""
        if self.returncode is None:
            self.returncode = self._proc.stop()
        return self.returncode

    def output(self) -> str:
        """The end of its log, for an assertion message."""
        return self._proc.output()[-2000:]
