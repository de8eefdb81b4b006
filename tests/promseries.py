"""Turn `gpuwatchd simulate --metrics-out` snapshots into promtool unit-test input series.

A scenario is simulated several times, each run cut at a later time, and each run's final
exposition is one snapshot of what Prometheus would have scraped then. On promtool's
one-minute grid a series holds the value of the latest snapshot at or before the minute
(the first snapshot's value before it); a series missing from a snapshot is missing
(``_``) there, the way an XID counter does not exist before its first XID.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from conftest import GPUWATCHD, ROOT

from gpuwatchd.core.units import parse_duration

INSTANCE = {"instance": "sim-node:9835", "job": "gpuwatchd"}


def parse_exposition(text: str) -> dict[str, float]:
    """``name{labels}`` -> value for every sample line (help and type lines skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        out[key] = float(value)
    return out


def with_instance(key: str) -> str:
    extra = ",".join(f'{k}="{v}"' for k, v in INSTANCE.items())
    if key.endswith("}"):
        return key[:-1] + ("," if not key.endswith("{}") else "") + extra + "}"
    return key + "{" + extra + "}"


def cut_scenario(source: Path, seconds: int, out_dir: Path) -> Path:
    data = yaml.safe_load(source.read_text())
    data["duration"] = f"{seconds}s"
    # what happens later is not part of the cut; a stall must end before the end
    data["timeline"] = [
        e
        for e in data.get("timeline") or []
        if _seconds(str(e["at"])) <= seconds
        and ("stall" not in e or _seconds(str(e["at"])) + _seconds(str(e["stall"])) <= seconds)
    ]
    path = out_dir / f"{source.stem}-{seconds}s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def simulate_snapshots(
    scenario: Path, minutes: Sequence[int], tmp: Path, config: Path
) -> tuple[dict[int, dict[str, float]], list[dict[str, Any]]]:
    """Snapshots at ``minutes`` (runs in parallel) and the alert records of the full run."""
    procs: list[tuple[int, Path, subprocess.Popen[bytes]]] = []
    for minute in minutes:
        cut = cut_scenario(scenario, minute * 60, tmp)
        metrics = tmp / f"metrics-{scenario.stem}-{minute}.txt"
        args = [*GPUWATCHD, "simulate", str(cut), "-c", str(config), "--metrics-out", str(metrics)]
        procs.append((minute, metrics, subprocess.Popen(args, stdout=subprocess.DEVNULL, cwd=ROOT)))
    full = subprocess.run(
        [*GPUWATCHD, "simulate", str(scenario), "-c", str(config)],
        capture_output=True,
        check=True,
        cwd=ROOT,
    )
    snapshots: dict[int, dict[str, float]] = {}
    for minute, metrics, proc in procs:
        assert proc.wait(60) == 0, f"simulate {scenario.name} cut at {minute}m failed"
        snapshots[minute] = parse_exposition(metrics.read_text())
    records = [json.loads(line) for line in full.stdout.decode().splitlines() if line.strip()]
    return snapshots, [r for r in records if r.get("record") == "alert"]


def _fmt(value: float) -> str:
    return repr(int(value)) if value == int(value) else repr(value)


def input_series(
    snapshots: Mapping[int, Mapping[str, float]], end: int, prefixes: Iterable[str]
) -> list[dict[str, str]]:
    """promtool ``input_series`` over minutes 0..end for series whose name has a prefix."""
    keep = tuple(prefixes)
    times = sorted(snapshots)
    keys = sorted({k for snap in snapshots.values() for k in snap if k.startswith(keep)})
    out = []
    for key in keys:
        runs: list[tuple[str, int]] = []  # (value text, repeat count)
        for minute in range(end + 1):
            at = [t for t in times if t <= minute] or [times[0]]
            snap = snapshots[at[-1]]
            text = _fmt(snap[key]) if key in snap else "_"
            if runs and runs[-1][0] == text:
                runs[-1] = (text, runs[-1][1] + 1)
            else:
                runs.append((text, 1))
        values = " ".join(
            (f"_x{n}" if text == "_" else f"{text}+0x{n - 1}") if n > 1 else text
            for text, n in runs
        )
        out.append({"series": with_instance(key), "values": values})
    return out


def node_firing(records: Sequence[Mapping[str, Any]], at_seconds: float) -> set[tuple[str, str]]:
    """(rule, gpu) of the node's alerts firing at ``at_seconds`` of the full run."""
    firing: dict[tuple[str, str], set[str]] = {}
    for r in records:
        if _seconds(r["t"]) > at_seconds:
            break
        key = (str(r["rule"]), str(r.get("gpu") or ""))
        ident = json.dumps(r["labels"], sort_keys=True)
        if r["state"] == "firing":
            firing.setdefault(key, set()).add(ident)
        elif r["state"] == "resolved":
            firing.get(key, set()).discard(ident)
    return {k for k, v in firing.items() if v}


def _seconds(text: str) -> float:
    seconds = parse_duration(text)
    assert seconds is not None, text
    return seconds
