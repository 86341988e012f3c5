"""turnkeep's packages import one way (README, Architecture): ``worker`` may use everything,
``activities`` and ``payloads`` the configuration and the workflow code, ``settings`` the
workflow code, ``workflows`` nothing of turnkeep's but itself, and any of them ``errors``.
Checked by parsing every module's imports, so a wrong turn fails here rather than as an import
cycle later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "turnkeep"

# What each part of turnkeep may import from turnkeep, besides itself.
MAY_IMPORT = {
    "errors": set(),
    "workflows": set(),
    "settings": {"errors", "workflows"},
    "payloads": {"errors", "settings", "workflows"},
    "activities": {"errors", "settings", "workflows"},
    "worker": {"activities", "errors", "payloads", "settings", "workflows"},
}


def part_of(module: str) -> str | None:
    """``turnkeep.activities.models`` -> ``activities``; None outside turnkeep's parts."""
    parts = module.split(".")
    return parts[1] if parts[0] == "turnkeep" and len(parts) > 1 else None


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.parent != ROOT or p.stem in MAY_IMPORT)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_go_one_way(path: Path) -> None:
    own = path.relative_to(ROOT).parts[0].removesuffix(".py")
    wrong = {
        name
        for name in imported(path)
        if (part := part_of(name)) is not None and part != own and part not in MAY_IMPORT[own]
    }
    assert not wrong, f"{own} must not import {sorted(wrong)}"
