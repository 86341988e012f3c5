"""A package's public names, listed once, in its stub (``__init__.pyi``), and imported on first
use (PEP 562), as Scientific Python's SPEC 1 does (``lazy_loader.attach_stub``).

Type checkers read the stub's imports as they are. At run time the package's ``__getattr__``
reads the same imports the first time a name is asked for, then imports only the module that
defines it: importing the package runs no other module of turnkeep, which matters inside the
workflow sandbox (it imports ``turnkeep`` afresh for every run). The stub is read through the
package's loader, not ``open`` (which the sandbox refuses), so it is read from a zip too.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from typing import Any


def stub_exports(spec: ModuleSpec) -> dict[str, str]:
    """Name -> the module that defines it, by the ``from module import name as name`` lines of
    the package's stub."""
    import ast

    get_data = getattr(spec.loader, "get_data", None)
    if spec.origin is None or get_data is None:
        raise ImportError(f"{spec.name} has no stub to read its names from")
    stub = os.path.splitext(spec.origin)[0] + ".pyi"
    tree = ast.parse(get_data(stub), stub)
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.module and not node.level
        for alias in node.names
    }


def lazy_exports(
    namespace: dict[str, Any],
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are ``namespace``:
    ``__getattr__`` also answers ``__all__``, the stub's names in order."""
    spec: ModuleSpec = namespace["__spec__"]
    exports: dict[str, str] = {}

    def names() -> dict[str, str]:
        if not exports:
            exports.update(stub_exports(spec))
        return exports

    def __getattr__(name: str) -> Any:
        if name == "__all__":
            value: Any = sorted(names())
        elif name in names():
            value = getattr(importlib.import_module(names()[name]), name)
        else:
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")
        namespace[name] = value  # once: later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names()})

    return __getattr__, __dir__
