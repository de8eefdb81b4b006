"""A real Alertmanager (Debian ``prometheus-alertmanager``) for the tests that need one.

    am, url = start_alertmanager(tmp_path / "am", webhook_route(hook.url))

Its config (``am.yml``), storage (``data/``) and log sit in the folder given; it listens on a
free loopback port (or ``port``, to start the same one again), without clustering.
"""

from __future__ import annotations

import json
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Proc, free_port, need_binary, wait_http


def webhook_route(
    hook_url: str, group_by: tuple[str, ...] = ("alertname", "node")
) -> dict[str, Any]:
    """One route to one webhook at ``hook_url``: sent at once, resolves included."""
    return {
        "route": {
            "receiver": "hook",
            "group_by": ["alertname", "node"],
            "group_wait": "0s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [
            {"name": "hook", "webhook_configs": [{"url": hook_url, "send_resolved": True}]}
        ],
    }


def start_alertmanager(
    work: Path, config: dict[str, Any] | str, *, port: int | None = None, log: str = "am.log"
) -> tuple[Proc, str]:
    """Alertmanager on ``config`` (a mapping, or alertmanager.yml's text), ready to answer."""
    binary = need_binary("prometheus-alertmanager")
    (work / "data").mkdir(parents=True, exist_ok=True)
    text = config if isinstance(config, str) else yaml.safe_dump(config, sort_keys=False)
    (work / "am.yml").write_text(text)
    port = port or free_port()
    proc = Proc(
        [
            binary,
            f"--config.file={work / 'am.yml'}",
            f"--storage.path={work / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        work / log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/-/ready", timeout=20)
    except AssertionError as exc:
        proc.stop()
        pytest.fail(f"Alertmanager did not start: {exc}\n{proc.output()}")
    return proc, url


def am_alerts(url: str) -> list[dict[str, Any]]:
    """Every alert it holds: active, silenced and inhibited."""
    with urllib.request.urlopen(
        url + "/api/v2/alerts?active=true&silenced=true&inhibited=true", timeout=5
    ) as resp:
        alerts: list[dict[str, Any]] = json.load(resp)
    return alerts


def start_for_webhook(tmp_path: Path, name: str, hook_url: str) -> tuple[Proc, str]:
    """Alertmanager in ``tmp_path/name``, sending every alert at once to ``hook_url``."""
    return start_alertmanager(tmp_path / name, webhook_route(hook_url))


def parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
