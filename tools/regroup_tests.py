"""Move every tests/test_*.py into a folder named after the stage it tests (issue 24 item 7).

    python tools/regroup_tests.py            # print the plan, change nothing
    python tools/regroup_tests.py --apply    # git mv the files and fix what moving breaks

Deterministic: the same tree gives the same moves. Each file's folder comes from TABLE
(today's files, placed by hand); a file not in it is placed by RULES: first its name
(``test_rules_*`` -> rules/, ``test_fault_*`` -> faults/, ...), then the gpuwatchd stage it
imports most (``core`` and ``testing`` count only when nothing else is imported; a tie goes
to the higher stage). A file neither places stays in tests/ and is listed loudly at the end
(exit status 1), so that a person decides and adds it to TABLE.

What moving would break, and what the script does about it:

- helpers (conftest.py, rulekit.py, promseries.py, actions_support.py, ...) and data/,
  golden/, vm/ stay in tests/; the tests import helpers by bare name (``from conftest
  import ROOT``), which pytest makes work from every sub-folder through the ``pythonpath``
  setting this script adds to pyproject.toml (no ``__init__.py``: module names stay the
  file's name, and the script refuses two files of one name); a test that imports from
  another test file (``from test_systemd import NotifySocket``) still finds it: that file's
  folder goes on the same ``pythonpath``, with a note;
- ``Path(__file__)...parent`` and ``os.path.dirname(...(__file__))`` in a moved file get one
  more level; any other use of ``__file__`` is reported;
- every mention of ``tests/test_NAME.py`` in a tracked text file (docs, scripts, packaging,
  comments, pytest commands) is rewritten to the new path.

Run it from the repository root on a clean tree; it uses ``git mv`` so history follows.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

# The stages of gpuwatchd/ (docs/ARCHITECTURE.md), bottom to top, then the folders for
# tests that cross stages: several nodes (fleet), injected faults end to end (faults), the
# shipped artifacts (packaging).
STAGE_ORDER = (
    "core",
    "xid",
    "config",
    "sources",
    "scenario",
    "rules",
    "actions",
    "exposition",
    "service",
    "harness",
    "cli",
)
FOLDERS = (*STAGE_ORDER, "fleet", "faults", "packaging")

# Today's files, placed by hand (what the test is about, not only what it imports).
TABLE: dict[str, str] = {
    # core: the shared vocabulary, the resilient SQLite layer, state files
    "test_memtrim.py": "core",
    "test_threadnames.py": "core",
    "test_store_failures.py": "core",
    "test_state_files.py": "core",
    # xid: the parser, the catalog, SXids, what a line says
    "test_xid_catalog.py": "xid",
    "test_xid_parser.py": "xid",
    "test_xid_process_name.py": "xid",
    "test_xid_mig.py": "xid",
    "test_xid_verdict.py": "xid",
    "test_xid_label_bucket.py": "xid",
    "test_sxid.py": "xid",
    "test_sxid_fabric.py": "xid",
    "test_properties.py": "xid",
    # config
    "test_config.py": "config",
    "test_fields_config.py": "config",
    "test_reload_every_key.py": "config",
    "test_abuse_input.py": "config",
    # sources: NVML, kernel logs, the merger, the poller
    "test_sources_journald.py": "sources",
    "test_sources_kmsg.py": "sources",
    "test_kernel_log_kinds.py": "sources",
    "test_reader_restarts.py": "sources",
    "test_nvml_backend.py": "sources",
    "test_nvml_fields.py": "sources",
    "test_nvml_hbm_fallback.py": "sources",
    "test_nvml_worker.py": "sources",
    "test_worker_wire.py": "sources",
    "test_gpu_fields.py": "sources",
    "test_fields_unanswered.py": "sources",
    "test_pci.py": "sources",
    "test_poller.py": "sources",
    "test_xid_merge.py": "sources",
    "test_xid_intake.py": "sources",
    "test_first_page_merged.py": "sources",
    # scenario
    "test_scenario.py": "scenario",
    "test_scenario_cache.py": "scenario",
    # rules
    "test_rules_conditions.py": "rules",
    "test_rules_engine.py": "rules",
    "test_rules_history.py": "rules",
    "test_rules_loader.py": "rules",
    "test_rules_memory_trend.py": "rules",
    "test_rules_peer_deviation.py": "rules",
    "test_rules_scenarios.py": "rules",
    "test_rules_store.py": "rules",
    "test_rules_xid_overrides.py": "rules",
    "test_rules_xid_recurrence.py": "rules",
    "test_xid_episodes.py": "rules",
    "test_xid_recovery.py": "rules",
    "test_runbooks.py": "rules",
    "test_evaluation_period.py": "rules",
    "test_drain_drivers_registry.py": "actions",
    "test_rules_drain_outcome.py": "rules",
    "test_drain_outcome_pages.py": "actions",
    "test_prometheus_rules.py": "rules",
    "test_live_annotations.py": "rules",
    # actions: receivers, routing, silences, the drain
    "test_actions_alertmanager.py": "actions",
    "test_actions_busy_group.py": "actions",
    "test_actions_cli.py": "actions",
    "test_actions_clock.py": "actions",
    "test_actions_config.py": "actions",
    "test_actions_drain.py": "actions",
    "test_actions_e2e.py": "actions",
    "test_actions_first_page.py": "actions",
    "test_actions_hostile_receiver.py": "actions",
    "test_actions_kubernetes.py": "actions",
    "test_actions_lifecycle.py": "actions",
    "test_actions_outbox.py": "actions",
    "test_actions_receivers.py": "actions",
    "test_actions_reload.py": "actions",
    "test_actions_slurm.py": "actions",
    "test_alertmanager_conventions.py": "actions",
    "test_receiver_kinds.py": "actions",
    "test_drain_hold.py": "actions",
    "test_drainhelper.py": "actions",
    "test_ticket_repeats.py": "actions",
    "test_pagerduty_cascade.py": "actions",
    "test_one_page_per_fault.py": "actions",
    # exposition: metrics, HTTP, status page, what Prometheus and Grafana read
    "test_prometheus.py": "exposition",
    "test_openmetrics.py": "exposition",
    "test_metrics_gzip.py": "exposition",
    "test_grafana_dashboard.py": "exposition",
    "test_golden_metrics.py": "exposition",
    "test_process_metrics.py": "exposition",
    "test_http_parser.py": "exposition",
    "test_status_page.py": "exposition",
    "test_status_socket.py": "exposition",
    "test_abuse_http.py": "exposition",
    # service: the composition root, the daemon, systemd, logging, the layout
    "test_architecture.py": "service",
    "test_composition.py": "service",
    "test_daemon_imports.py": "service",
    "test_daemon_stop.py": "service",
    "test_systemd.py": "service",
    "test_logsetup.py": "service",
    "test_log_events.py": "service",
    # harness: simulate, demo, backtest
    "test_demo.py": "harness",
    "test_backtest.py": "harness",
    # cli
    "test_cli_check.py": "cli",
    "test_cli_output.py": "cli",
    "test_cli_xid.py": "cli",
    "test_xid_scan.py": "cli",
    "test_http_cli.py": "cli",
    "test_health_verdict.py": "cli",
    # fleet: many nodes, one budget
    "test_fleet_breaker.py": "fleet",
    "test_fleet_budget.py": "fleet",
    "test_fleet_config.py": "fleet",
    "test_fleet_kubernetes.py": "fleet",
    "test_fleet_model.py": "fleet",
    "test_fleet_storm.py": "fleet",
    "test_alertmanager_fleet.py": "fleet",
    # faults: injected faults against the real daemon
    "test_fault_drain.py": "faults",
    "test_fault_forged.py": "faults",
    "test_fault_gpu.py": "faults",
    "test_fault_journal.py": "faults",
    "test_fault_outage.py": "faults",
    "test_fault_state.py": "faults",
    "test_fault_storm.py": "faults",
    # packaging: the .deb, the wheel, the VM, the shipped manifests and checks
    "test_package.py": "packaging",
    "test_wheel.py": "packaging",
    "test_vm_systemd.py": "packaging",
    "test_first_run.py": "packaging",
    "test_kubernetes.py": "packaging",
    "test_nhc_check.py": "packaging",
}

# Name prefixes for files TABLE does not know, checked in this order.
NAME_RULES: tuple[tuple[str, str], ...] = (
    ("test_fault_", "faults"),
    ("test_fleet_", "fleet"),
    ("test_nvml_", "sources"),
    ("test_sxid", "xid"),
    *((f"test_{stage}_", stage) for stage in FOLDERS),
    *((f"test_{stage}.py", stage) for stage in FOLDERS),
)
_WEAK_STAGES = ("core", "testing")


def place_by_name(name: str) -> str | None:
    for prefix, folder in NAME_RULES:
        if name.startswith(prefix):
            return folder
    return None


def place_by_imports(path: Path) -> str | None:
    """The gpuwatchd stage this file imports most; None when it imports none."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == "gpuwatchd":
                counts[parts[1]] = counts.get(parts[1], 0) + 1
    strong = {s: n for s, n in counts.items() if s in STAGE_ORDER and s not in _WEAK_STAGES}
    if not strong:
        return "core" if "core" in counts else None
    # most imports first, then the higher stage
    return max(strong, key=lambda s: (strong[s], STAGE_ORDER.index(s)))


def plan(tests: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(name -> folder) for every top-level test file, how each was placed, the unplaced."""
    moves: dict[str, str] = {}
    how: dict[str, str] = {}
    unplaced: list[str] = []
    for path in sorted(tests.glob("test_*.py")):
        name = path.name
        folder = TABLE.get(name)
        reason = "table"
        if folder is None:
            folder, reason = place_by_name(name), "name"
        if folder is None:
            folder, reason = place_by_imports(path), "imports"
        if folder is None:
            unplaced.append(name)
            continue
        moves[name] = folder
        how[name] = reason
    return moves, how, unplaced


def collisions(tests: Path, moves: dict[str, str]) -> list[str]:
    """Test file names that would exist twice (pytest needs unique names without __init__)."""
    seen: dict[str, Path] = {}
    bad: list[str] = []
    for path in sorted(tests.rglob("test_*.py")):
        if path.parent == tests and path.name in moves:
            continue
        seen[path.name] = path
    for name in moves:
        if name in seen:
            bad.append(f"{name}: already at {seen[name].relative_to(tests.parent)}")
    return bad


# One more level up for a file moved one folder deeper.
_PATH_PARENTS = re.compile(r"Path\(__file__\)(\.resolve\(\))?((?:\.parent\b)+)(?!s)")
_PATH_PARENTS_INDEX = re.compile(r"Path\(__file__\)(\.resolve\(\))?\.parents\[(\d+)\]")
_OS_DIRNAME = re.compile(r"os\.path\.dirname\(os\.path\.(abspath|realpath)\(__file__\)\)")
_FILE = re.compile(r"(?<![\w.])__file__\b")


def deepen_paths(text: str) -> tuple[str, int]:
    """Rewrite the file-relative paths of a moved test; returns (text, uses left unhandled)."""
    handled = 0

    def more_parents(m: re.Match[str]) -> str:
        nonlocal handled
        handled += 1
        return f"Path(__file__){m.group(1) or ''}{m.group(2)}.parent"

    def index_up(m: re.Match[str]) -> str:
        nonlocal handled
        handled += 1
        return f"Path(__file__){m.group(1) or ''}.parents[{int(m.group(2)) + 1}]"

    def one_dirname(m: re.Match[str]) -> str:
        nonlocal handled
        handled += 1
        return f"os.path.dirname({m.group(0)})"

    text = _PATH_PARENTS_INDEX.sub(index_up, text)
    text = _PATH_PARENTS.sub(more_parents, text)
    text = _OS_DIRNAME.sub(one_dirname, text)
    return text, len(_FILE.findall(text)) - handled


def rewrite_mentions(text: str, moves: dict[str, str]) -> str:
    """``tests/test_NAME.py`` -> ``tests/FOLDER/test_NAME.py`` wherever it is written."""

    def new_path(m: re.Match[str]) -> str:
        name = m.group(1)
        return f"tests/{moves[name]}/{name}" if name in moves else m.group(0)

    return re.sub(r"(?<![\w/.-])tests/(test_\w+\.py)\b", new_path, text)


def test_imports(tests: Path) -> dict[Path, set[str]]:
    """Test modules that other tests import helpers from (``from test_systemd import ...``)."""
    names = {p.stem for p in tests.rglob("test_*.py")}
    found: dict[Path, set[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module in names and node.level == 0:
                found.setdefault(path, set()).add(node.module)
            elif isinstance(node, ast.Import):
                found.setdefault(path, set()).update(a.name for a in node.names if a.name in names)
    return {path: mods for path, mods in found.items() if mods}


def fix_pyproject(text: str, paths: list[str]) -> str:
    """Helpers import by bare name from every folder: these folders on pytest's sys.path."""
    line = re.search(r"^pythonpath\s*=\s*\[(.*)\]\s*$", text, re.M)
    have = re.findall(r'"([^"]+)"', line.group(1)) if line else []
    want = have + [p for p in paths if p not in have]
    new = "pythonpath = [" + ", ".join(f'"{p}"' for p in want) + "]"
    if line:
        return text[: line.start()] + new + text[line.end() :]
    head = "[tool.pytest.ini_options]\n"
    if head not in text:
        raise SystemExit("pyproject.toml has no [tool.pytest.ini_options]: add pythonpath by hand")
    return text.replace(head, head + new + "\n", 1)


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


def tracked_text_files() -> list[Path]:
    files = []
    for rel in git("ls-files", "-z").split("\0"):
        path = ROOT / rel
        if not rel or not path.is_file() or path.is_symlink():
            continue
        if path.resolve() == Path(__file__).resolve():
            continue
        try:
            path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        files.append(path)
    return files


def apply(moves: dict[str, str]) -> list[str]:
    """Move and fix; returns the problems left for a person."""
    problems: list[str] = []
    for folder in sorted(set(moves.values())):
        (TESTS / folder).mkdir(exist_ok=True)
    for name, folder in sorted(moves.items()):
        git("mv", f"tests/{name}", f"tests/{folder}/{name}")
        moved = TESTS / folder / name
        text, unhandled = deepen_paths(moved.read_text())
        if unhandled:
            problems.append(f"tests/{folder}/{name}: {unhandled} use(s) of __file__ left as is")
        moved.write_text(text)
    # A test that imports helpers from another test file finds it wherever it now lives.
    paths = ["tests"]
    for path, modules in test_imports(TESTS).items():
        for module in sorted(modules):
            (home,) = TESTS.rglob(f"{module}.py")
            folder = home.parent.relative_to(ROOT).as_posix()
            if home.parent == path.parent:
                continue
            if folder not in paths:
                paths.append(folder)
            print(
                f"note: {path.relative_to(ROOT)} imports from {module}, so {folder} goes on"
                " pytest's pythonpath (better: move what it shares to a helper in tests/)"
            )
    changed: list[str] = []
    for path in tracked_text_files():
        text = path.read_text()
        new = rewrite_mentions(text, moves)
        if path == ROOT / "pyproject.toml":
            new = fix_pyproject(new, paths)
        if new != text:
            path.write_text(new)
            changed.append(path.relative_to(ROOT).as_posix())
    git("add", "-A", "tests", *changed)
    print(f"rewrote the test paths written in {len(changed)} file(s); all staged, not committed")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apply", action="store_true", help="move the files (default: plan)")
    args = parser.parse_args(argv)
    moves, how, unplaced = plan(TESTS)
    bad = collisions(TESTS, moves)
    if bad:
        print("refusing: two test files would share a name:", *bad, sep="\n  ", file=sys.stderr)
        return 2
    for name, folder in sorted(moves.items(), key=lambda kv: (kv[1], kv[0])):
        mark = "" if how[name] == "table" else f"   (by {how[name]}: add it to TABLE)"
        print(f"tests/{name} -> tests/{folder}/{name}{mark}")
    problems: list[str] = []
    if args.apply:
        problems = apply(moves)
    else:
        print(f"plan only: {len(moves)} file(s); run again with --apply to move them")
    for name in unplaced:
        problems.append(f"tests/{name}: no folder (not in TABLE, no name rule, no stage import)")
    if problems:
        print(f"\nCOULD NOT PLACE OR FIX {len(problems)}:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
