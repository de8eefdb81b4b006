"""The package layout holds: every module sits in a stage package, imports only point down
the stack (or within its own package), and no two modules import each other, even through
imports hidden inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent.parent / "gpuwatchd"

# Lower numbers are lower in the stack. A module may import its own package and any package
# with a lower rank; packages of equal rank are independent stages and never import each other.
RANKS = {
    "core": 0,
    "xid": 1,
    "config": 2,
    "sources": 3,
    "scenario": 4,
    "rules": 4,
    "actions": 4,
    "exposition": 4,
    "testing": 5,
    "configfile": 5,
    "service": 6,
    "harness": 7,
    "cli": 8,
}
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "py.typed"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Every gpuwatchd module ``path`` imports, at any depth of the file."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpuwatchd."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("gpuwatchd"):
                continue
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{target}.{alias.name}"
                found.add(
                    sub
                    if (PACKAGE.parent / sub.replace(".", "/")).exists()
                    or (PACKAGE.parent / (sub.replace(".", "/") + ".py")).exists()
                    else target
                )
    found.discard(me)
    return found


def stage_of(module: str) -> str | None:
    """The stage package of ``module``; None for the top-level package and its entry points."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in RANKS else None


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def test_every_module_sits_in_a_stage_package() -> None:
    loose = sorted(
        p.name for p in PACKAGE.iterdir() if p.is_file() and p.name not in TOP_LEVEL_FILES
    )
    assert loose == [], f"modules outside a stage package: {loose}"
    packages = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "data")
    assert sorted(n for n in packages if n != "__pycache__") == sorted(RANKS)


def test_imports_point_down_the_stack() -> None:
    upward = []
    for module, path in all_modules().items():
        here = stage_of(module)
        if here is None:
            continue
        for target in imports_of(path):
            there = stage_of(target)
            if there is None or there == here:
                continue
            if RANKS[there] >= RANKS[here]:
                upward.append(f"{module} -> {target}")
    assert upward == [], "imports that do not point down the stack:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph = {m: {t for t in imports_of(p) if t in all_modules()} for m, p in all_modules().items()}
    # A package's __init__ may re-export its own modules: ignore edges into one's own parent.
    for module in graph:
        graph[module] = {t for t in graph[module] if not module.startswith(t + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("stage", sorted(RANKS))
def test_stage_package_has_a_docstring(stage: str) -> None:
    init = PACKAGE / stage / "__init__.py"
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init}: say in one paragraph what this stage does"


# The stages the composition root builds: each from its own sections, never the whole config.
BUILT_STAGES = ("sources", "scenario", "rules", "actions", "exposition")
WHOLE_CONFIG = {"Config", "load_config", "default_config", "for_rules", "for_actions"}


def whole_config_imports(path: Path) -> list[str]:
    """Where ``path`` imports the whole config (``Config`` or a loader of it)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "gpuwatchd.configfile"
        ):
            found += [f"line {node.lineno}: {a.name}" for a in node.names if a.name in WHOLE_CONFIG]
    return found


def test_no_stage_is_built_from_the_whole_config() -> None:
    """Issue 24 item 2: a stage gets its own sections (``config.stages``), so what it
    depends on is one type and a reload asks it about its own sections only."""
    offenders = [
        f"{module} ({where})"
        for module, path in sorted(all_modules().items())
        if stage_of(module) in BUILT_STAGES
        for where in whole_config_imports(path)
    ]
    assert offenders == [], "stages that read the whole Config:\n" + "\n".join(offenders)


def test_the_whole_config_check_sees_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from gpuwatchd.configfile.loader import Config, XidConfig\n")
    assert whole_config_imports(bad) == ["line 2: Config"]


def whole_config_parameters(path: Path) -> list[str]:
    """Functions in ``path`` with a parameter typed as the whole ``Config`` (also when
    named in a string or under another module's name)."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        args = node.args
        for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs]:
            if arg.annotation is None:
                continue
            text = ast.unparse(arg.annotation).strip("'\"")
            if any(part.strip("'\" ").split(".")[-1] == "Config" for part in text.split("|")):
                found.append(f"line {node.lineno}: {node.name}({arg.arg})")
    return found


def test_no_stage_constructor_takes_the_whole_config() -> None:
    """A stage's constructor (or any of its functions) takes its own settings, never the
    whole ``Config``: the config is assembled above the stages (``configfile``)."""
    offenders = [
        f"{module} ({where})"
        for module, path in sorted(all_modules().items())
        if stage_of(module) in (*BUILT_STAGES, "config")
        for where in whole_config_parameters(path)
    ]
    assert offenders == [], "stage functions that take the whole Config:\n" + "\n".join(offenders)


def test_the_constructor_check_sees_an_offender(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "class Stage:\n"
        "    def __init__(self, config: 'loader.Config', other: XidConfig) -> None: ...\n"
        "def build(c: Config | None) -> None: ...\n"
    )
    assert sorted(whole_config_parameters(bad)) == ["line 2: __init__(config)", "line 3: build(c)"]


def test_the_config_loader_sits_above_the_stages_it_asks() -> None:
    """The loader asks the stages' registries for their readers: it imports them, and
    no module below it imports the loader."""
    loader = all_modules()["gpuwatchd.configfile.loader"]
    assert "gpuwatchd.actions.receivers.registry" in imports_of(loader)
    assert RANKS["configfile"] > max(RANKS[s] for s in BUILT_STAGES)


def test_no_test_module_imports_another() -> None:
    """Helpers shared by tests live in ``tests/*_support.py`` (issue 24 item 5): no test
    imports from a ``test_*`` module, and pytest's pythonpath is ``tests`` alone."""
    tests = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [
                f"{path.relative_to(tests)}:{node.lineno}: {n}"
                for n in names
                if n.split(".")[0].startswith("test_")
            ]
    assert offenders == [], "\n".join(offenders)
    pyproject = (tests.parent / "pyproject.toml").read_text()
    assert 'pythonpath = ["tests"]\n' in pyproject
