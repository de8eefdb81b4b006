"""`gpuwatchd silence add|list|expire` as an operator runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from conftest import GPUWATCHD, ROOT


def gw(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GPUWATCHD, *args], capture_output=True, text=True, cwd=ROOT)


def test_silence_add_list_expire(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"node_name: gpu-a17\nstate_dir: {tmp_path / 'state'}\n")
    c = ("-c", str(cfg))
    res = gw("silence", "add", *c, "--gpu", "0000:3b:00.0", "--for", "2h", "--reason", "RMA 1234")
    assert res.returncode == 0, res.stderr
    sid = res.stdout.split()[0]
    assert "silenced GPU 00000000:3B:00.0 on gpu-a17 until" in res.stdout
    res = gw("silence", "add", *c, "--for", "30m", "--reason", "firmware", "--rule", "GpuLost",
             "--author", "alice", "--json")  # fmt: skip
    node_wide = json.loads(res.stdout)
    assert node_wide["gpu"] is None and node_wide["rule"] == "GpuLost"
    assert node_wide["author"] == "alice" and node_wide["active"] is True
    assert node_wide["ends_at"] - node_wide["starts_at"] == 1800
    listed = json.loads(gw("silence", "list", *c, "--json").stdout)
    assert [s["id"] for s in listed] == [sid, node_wide["id"]]
    text = gw("silence", "list", *c).stdout
    assert "RMA 1234 (" in text and "firmware (alice)" in text
    res = gw("silence", "expire", *c, sid[:5])  # a unique prefix is enough
    assert res.returncode == 0 and res.stdout.startswith(f"{sid}  expired at")
    assert [s["id"] for s in json.loads(gw("silence", "list", *c, "--json").stdout)] == [
        node_wide["id"]
    ]
    everything = json.loads(gw("silence", "list", *c, "--all", "--json").stdout)
    assert {s["id"]: s["active"] for s in everything} == {sid: False, node_wide["id"]: True}
    stored = json.loads((tmp_path / "state" / "silences.json").read_text())
    assert stored["version"] == 1 and len(stored["silences"]) == 2
    res = gw("silence", "expire", *c, "nosuch")
    assert res.returncode == 1 and "no silence 'nosuch'" in res.stderr


def test_silence_add_refuses_bad_input(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuwatchd.yaml"
    cfg.write_text(f"node_name: n1\nstate_dir: {tmp_path / 'state'}\n")
    c = ("-c", str(cfg))
    res = gw("silence", "add", *c, "--for", "2 hours", "--reason", "x")
    assert res.returncode == 64 and "is not a positive duration" in res.stderr
    # numbers float() takes but no silence can last: a traceback (nan), or an endless
    # silence whose date crashed `add` and every later `silence list` (inf, 1e400)
    for endless in ("nan", "inf", "1e400", "-5", "0", "99999w"):
        res = gw("silence", "add", *c, "--for", endless, "--reason", "x")
        assert res.returncode == 64 and "is not a positive duration" in res.stderr, endless
    res = gw("silence", "add", *c, "--gpu", "GPU-nope", "--for", "1h", "--reason", "x")
    assert res.returncode == 64 and "is not a GPU index, UUID or PCI bus id" in res.stderr
    res = gw("silence", "add", *c, "--for", "1h", "--reason", "  ")
    assert res.returncode == 64 and "--reason must say why" in res.stderr
    assert not (tmp_path / "state" / "silences.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("state_dir: relative\n")
    res = gw("silence", "list", "-c", str(bad))
    assert res.returncode == 1 and "state_dir: 'relative' is not an absolute path" in res.stderr
