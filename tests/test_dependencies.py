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

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "turnkeep"

# Modules that only an extra's users load: they may import that extra's dependencies too.
EXTRA_MODULES = {
    "turnkeep.doors.a2a": "a2a",  # `turnkeep serve --a2a`; its package imports a2a-sdk
    "turnkeep.testing.pytest_plugin": "testing",  # loaded by pytest (its `pytest11` entry)
}
# Extras for working on turnkeep, which no user's code path needs.
OWN_EXTRAS = {"test", "docs"}
# Imports under `try: ... except ImportError` whose error says what to install, and whose
# package no extra declares: (module, import name) -> why.
UNDECLARED_GUARDED = {
    ("turnkeep.payloads.storage.s3", "aioboto3"): (
        "payload_storage.driver: s3 only; the error asks for temporalio[aioboto3], the SDK's "
        "extra for its S3 driver"
    ),
}


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


def _requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return _normalized(match.group())


@cache
def declared() -> dict[str | None, frozenset[str]]:
    """Distribution names by extra (None: the main dependencies)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups: dict[str | None, list[str]] = {None: project["dependencies"]}
    groups.update(project["optional-dependencies"])
    return {extra: frozenset(map(_requirement_name, reqs)) for extra, reqs in groups.items()}


@cache
def _modules_of() -> dict[str, frozenset[str]]:
    """Distribution -> the top-level import names it ships."""
    shipped: dict[str, set[str]] = {}
    for name, dists in packages_distributions().items():
        for dist in dists:
            shipped.setdefault(_normalized(dist), set()).add(name)
    return {dist: frozenset(names) for dist, names in shipped.items()}


@cache
def provides(dist: str) -> frozenset[str]:
    """The import names that declaring ``dist`` makes available: its own, or, for a
    distribution that ships none (``fastmcp``, which installs ``fastmcp-slim``), its
    requirements'."""
    own = _modules_of().get(dist)
    if own:
        return own
    try:
        requirements = distribution(dist).requires or []
    except PackageNotFoundError:
        return frozenset()
    unconditional = [_requirement_name(r) for r in requirements if ";" not in r]
    return frozenset().union(*(_modules_of().get(r, frozenset()) for r in unconditional))


def available(dists: frozenset[str]) -> frozenset[str]:
    return frozenset().union(*map(provides, dists))


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
        if imp.guarded and (
            imp.name in shipped_extras or (imp.module, imp.name) in UNDECLARED_GUARDED
        ):
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
    guarded = {(imp.module, imp.name) for imp in imports if imp.guarded}
    for allowed in UNDECLARED_GUARDED:
        assert allowed in guarded, f"{allowed} is no longer a guarded import"


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
    assert "jsonschema" not in available(main - {"jsonschema"})
    # A distribution with no modules of its own provides its requirements'.
    assert "fastmcp" in provides("fastmcp")
