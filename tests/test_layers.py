"""turnkeep's packages import one way (docs/design.md, Code layout): ``cli`` may use everything and
nothing uses it, ``worker`` everything else, ``activities`` and ``payloads`` the configuration,
the workflow code and ``observability`` (metrics and traces), which itself uses only the
configuration and the workflow code; ``settings`` uses the workflow code, ``workflows`` nothing
of turnkeep's but itself, and any of them ``errors``. Checked by parsing every module's imports,
so a wrong turn fails here rather than as an import cycle later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "turnkeep"

# What each part of turnkeep may import from turnkeep, besides itself.
MAY_IMPORT = {
    "errors": set(),
    "workflows": set(),
    # A turn as a step of any workflow: runs in the sandbox, so workflow code only.
    "workflow": {"workflows"},
    # fast-agent's config keys, targets and RequestParams: plain data the configuration uses.
    "fastagent": set(),
    "settings": {"errors", "fastagent", "workflows"},
    "payloads": {"errors", "observability", "settings", "workflows"},
    "activities": {"errors", "observability", "settings", "workflows"},
    # Metrics and traces recorded on the worker side; the metric catalogue and the turn's own
    # (replay-safe) metrics are workflow code.
    "observability": {"errors", "settings", "workflows"},
    # Python agents and servers: the configuration, with functions in it.
    "agents": {"errors", "fastagent", "settings", "workflows"},
    # Agents declared another framework's way (@fast.agent), served by a worker's plugin.
    "compat": {"agents", "errors", "fastagent", "settings", "worker", "workflows"},
    "worker": {
        "activities",
        "agents",
        "errors",
        "observability",
        "payloads",
        "settings",
        "workflows",
    },
    # The command line: no other part lists it, so nothing in turnkeep may import it.
    "cli": {
        "activities",
        "agents",
        "errors",
        "observability",
        "payloads",
        "settings",
        "worker",
        "workflows",
    },
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
            # `from turnkeep import cli` imports the part as surely as `import turnkeep.cli`.
            if node.module == "turnkeep":
                names.update(f"turnkeep.{a.name}" for a in node.names if a.name in MAY_IMPORT)
    return names


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.parent != ROOT or p.stem in MAY_IMPORT)


def wrong_imports(own: str, path: Path) -> set[str]:
    """What the module at ``path``, part of ``own``, imports from parts it may not use."""
    return {
        name
        for name in imported(path)
        if (part := part_of(name)) is not None and part != own and part not in MAY_IMPORT[own]
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_go_one_way(path: Path) -> None:
    own = path.relative_to(ROOT).parts[0].removesuffix(".py")
    wrong = wrong_imports(own, path)
    assert not wrong, f"{own} must not import {sorted(wrong)}"


def test_no_part_may_import_the_cli(tmp_path: Path) -> None:
    """However it is spelled: the command line sits on top of everything else."""
    module = tmp_path / "module.py"
    module.write_text(
        "import turnkeep.cli.main\n"
        "from turnkeep import cli\n"
        "from turnkeep.cli.errors import report\n",
        encoding="utf-8",
    )
    for own in MAY_IMPORT.keys() - {"cli"}:
        assert wrong_imports(own, module) == {
            "turnkeep.cli.main",
            "turnkeep.cli",
            "turnkeep.cli.errors",
        }, own
