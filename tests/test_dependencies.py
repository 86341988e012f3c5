"""Every third-party import in ``turnkeep/`` is a declared dependency of what ships it: the main
dependencies, or the extra whose users alone load the module. A package that arrives only
through another one (``jsonschema`` through ``mcp``) would go missing, with an ImportError on
a user's machine, the day that one stops bringing it.

Imports are read from the source (``ast``), so nothing is imported to check them; an import
name is mapped to the distributions that ship it with ``importlib.metadata``."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, distribution, packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "turnkeep"

# Modules that only an extra's users load: they may import that extra's dependencies too.
EXTRA_MODULES = {
    "turnkeep.doors.a2a": "a2a",  # `turnkeep serve --a2a`; its package imports a2a-sdk
    # Loaded by pytest when a project's conftest names it in `pytest_plugins` (or `-p`): it has
    # no `pytest11` entry, so installing turnkeep loads nothing into anyone's pytest.
    "turnkeep.testing.pytest_plugin": "testing",
    "turnkeep.payloads.storage.s3": "s3",  # payload_storage.driver: s3, on aioboto3
}
# Extras for working on turnkeep, which no user's code path needs.
OWN_EXTRAS = {"test", "docs"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    name: str  # the imported top-level name
    line: int
    guarded: bool  # inside `try:` with an `except ImportError` (or ModuleNotFoundError)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        isinstance(kind, ast.Name) and kind.id in ("ImportError", "ModuleNotFoundError")
        for kind in kinds
    )


def _imports(node: ast.AST, module: str, guarded: bool = False) -> Iterator[Import]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield Import(module, alias.name.partition(".")[0], node.lineno, guarded)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        yield Import(module, node.module.partition(".")[0], node.lineno, guarded)
    elif isinstance(node, ast.Try):
        inner = guarded or any(_catches_import_error(h) for h in node.handlers)
        for child in node.body:
            yield from _imports(child, module, inner)
        for child in (*node.handlers, *node.orelse, *node.finalbody):
            yield from _imports(child, module, guarded)
    else:
        for child in ast.iter_child_nodes(node):
            yield from _imports(child, module, guarded)


def third_party_imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for found_import in _imports(ast.parse(path.read_text(encoding="utf-8")), dotted):
            if found_import.name not in sys.stdlib_module_names and found_import.name != "turnkeep":
                found.append(found_import)
    return found


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@cache
def declared() -> dict[str | None, frozenset[str]]:
    """Requirements by extra (None: the main dependencies), as pyproject writes them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups: dict[str | None, list[str]] = {None: project["dependencies"]}
    groups.update(project["optional-dependencies"])
    return {extra: frozenset(reqs) for extra, reqs in groups.items()}


@cache
def _modules_of() -> dict[str, frozenset[str]]:
    """Distribution -> the top-level import names it ships."""
    shipped: dict[str, set[str]] = {}
    for name, dists in packages_distributions().items():
        for dist in dists:
            shipped.setdefault(_normalized(dist), set()).add(name)
    return {dist: frozenset(names) for dist, names in shipped.items()}


def _requires(dist: str) -> list[Requirement]:
    try:
        return [Requirement(r) for r in distribution(dist).requires or []]
    except PackageNotFoundError:
        return []


@cache
def provides(requirement: str) -> frozenset[str]:
    """The import names that declaring ``requirement`` makes available: its distribution's
    own, or, for one that ships none (``fastmcp``, which installs ``fastmcp-slim``), its
    requirements'; and those of the requirements of the extras it names
    (``temporalio[aioboto3]``: ``aioboto3``). A distribution an extra brings that is not
    installed here is taken to ship the import name of its own name."""
    wanted = Requirement(requirement)
    dist = _normalized(wanted.name)
    names = _modules_of().get(dist)
    if not names:
        unconditional = [_normalized(r.name) for r in _requires(dist) if r.marker is None]
        names = frozenset().union(*(_modules_of().get(r, frozenset()) for r in unconditional))
    for extra in wanted.extras:
        for req in _requires(dist):
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                name = _normalized(req.name)
                names |= _modules_of().get(name) or {name.replace("-", "_")}
    return names


def available(requirements: frozenset[str]) -> frozenset[str]:
    return frozenset().union(*map(provides, requirements))


def extra_of(module: str) -> str | None:
    for prefix, extra in EXTRA_MODULES.items():
        if module == prefix or module.startswith(prefix + "."):
            return extra
    return None


def problems() -> list[str]:
    groups = declared()
    main = available(groups[None])
    shipped_extras = available(
        frozenset().union(*(d for e, d in groups.items() if e is not None and e not in OWN_EXTRAS))
    )
    found = []
    for imp in third_party_imports():
        extra = extra_of(imp.module)
        allowed = main | (available(groups[extra]) if extra else frozenset())
        if imp.name in allowed:
            continue
        if imp.guarded and imp.name in shipped_extras:
            continue
        where = f"the `{extra}` extra" if extra else "the main dependencies"
        found.append(f"{imp.module}:{imp.line} imports {imp.name!r}, not in {where}")
    return found


def test_every_third_party_import_is_a_declared_dependency() -> None:
    assert problems() == []


def test_the_exceptions_are_still_there() -> None:
    imports = third_party_imports()
    modules = {imp.module for imp in imports}
    for prefix, extra in EXTRA_MODULES.items():
        assert prefix in modules, f"{prefix} is gone: drop it from EXTRA_MODULES"
        assert extra in declared(), f"pyproject has no extra {extra!r}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import jsonschema", [("jsonschema", False)]),
        ("from a2a.types import Task", [("a2a", False)]),
        ("from . import sibling\nimport os", []),
        ("try:\n    import aioboto3\nexcept ImportError:\n    pass", [("aioboto3", True)]),
        (
            "try:\n    import x\nexcept (ValueError, ModuleNotFoundError):\n    import y",
            [("x", True), ("y", False)],
        ),
        ("try:\n    import x\nexcept ValueError:\n    pass", [("x", False)]),
        ("def f():\n    from yaml import safe_load", [("yaml", False)]),
    ],
)
def test_imports_are_read_with_their_guard(source: str, expected: list[tuple[str, bool]]) -> None:
    found = [
        (imp.name, imp.guarded)
        for imp in _imports(ast.parse(source), "m")
        if imp.name not in sys.stdlib_module_names
    ]
    assert found == expected


def test_a_package_arriving_through_another_is_not_declared() -> None:
    # The rule has teeth: without its own line, jsonschema (which mcp brings) is missing.
    main = declared()[None]
    assert "jsonschema" in available(main)
    assert "jsonschema" not in available(
        frozenset(r for r in main if Requirement(r).name != "jsonschema")
    )
    # A distribution with no modules of its own provides its requirements'.
    assert "fastmcp" in provides("fastmcp")
    # An extra of a dependency provides what that extra brings, installed here or not.
    assert "aioboto3" in provides("temporalio[aioboto3]")
    assert "aioboto3" not in provides("temporalio")
