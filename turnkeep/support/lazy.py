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
    the package's stub. The stub is the package's only list of its names, so a stub that is
    missing, or holds any other statement, is an ``ImportError`` that says so, not a package
    that quietly offers fewer names."""
    import ast

    get_data = getattr(spec.loader, "get_data", None)
    if spec.origin is None or get_data is None:
        raise ImportError(f"{spec.name} has no stub to read its names from", name=spec.name)
    stub = os.path.splitext(spec.origin)[0] + ".pyi"
    try:
        source = get_data(stub)
    except OSError as exc:
        raise ImportError(
            f"{spec.name} lists its names in its stub {stub}, which cannot be read ({exc}): "
            "a bundle or copy of turnkeep must ship its __init__.pyi files",
            name=spec.name,
            path=stub,
        ) from exc
    exports: dict[str, str] = {}
    for node in ast.parse(source, stub).body:
        if (
            not isinstance(node, ast.ImportFrom)
            or not node.module
            or node.level
            or any(alias.asname != alias.name for alias in node.names)
        ):
            raise ImportError(
                f"{stub}, line {node.lineno}: a package stub holds only "
                "`from module import name as name` lines",
                name=spec.name,
                path=stub,
            )
        exports.update({alias.name: node.module for alias in node.names})
    return exports


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
        # `hasattr` and `getattr(..., default)` swallow only AttributeError: a stub that
        # cannot be read must not raise anything else out of here.
        try:
            known = names()
        except ImportError as exc:
            raise AttributeError(
                f"module {spec.name!r} cannot offer {name!r}: {exc}", name=name
            ) from exc
        if name == "__all__":
            value: Any = sorted(known)
        elif name in known:
            value = getattr(importlib.import_module(known[name]), name)
        else:
            raise AttributeError(f"module {spec.name!r} has no attribute {name!r}")
        namespace[name] = value  # once: later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *names()})

    return __getattr__, __dir__
