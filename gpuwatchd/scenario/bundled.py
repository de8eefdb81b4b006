"""The scenarios shipped inside the package (``gpuwatchd/data/scenarios``, the repository's
``scenarios/``), found by name: ``gpuwatchd simulate fallen-off-bus``.
"""

from __future__ import annotations

from importlib import resources


def bundled_scenarios() -> list[str]:
    """Names of the scenarios shipped inside the package (``demo``, ...)."""
    folder = resources.files("gpuwatchd").joinpath("data", "scenarios")
    return sorted(
        p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml")
    )


def bundled_scenario_path(name: str) -> str:
    """The file path of a scenario shipped inside the package, e.g. ``demo``."""
    entry = resources.files("gpuwatchd").joinpath("data", "scenarios", f"{name}.yaml")
    if not entry.is_file():
        raise FileNotFoundError(
            f"no bundled scenario {name!r}; bundled: {', '.join(bundled_scenarios())}"
        )
    return str(entry)
