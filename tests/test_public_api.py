"""What is public, by one rule (docs/library.md): the names that the modules in the table of
*Using turnkeep from your own Temporal app* export; every other module is internal. Checked
here: the table names modules and names that exist, and the examples and the documentation's
code import nothing else, so a reader copying them depends on the public API only."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ROOT / "docs" / "library.md"
MARKER = "<!-- public-modules:"
# A module whose row names no single names (the pytest plugin's fixtures): any of its names.
ANY = frozenset({"*"})


def public_table() -> dict[str, frozenset[str]]:
    """Module -> its public names, from the table under the marker in docs/library.md."""
    text = LIBRARY.read_text(encoding="utf-8")
    rows = text[text.index(MARKER) :].split("\n\n", 1)[0].splitlines()[3:]
    table = {}
    for row in rows:
        module_cell, names_cell = row.strip("|").split("|", 1)
        module = module_cell.strip().strip("`")
        names = set(re.findall(r"`([A-Za-z_][\w.]*)`", names_cell.split(":", 1)[0]))
        if f"{module}.__all__" in names or (module == "turnkeep" and "turnkeep.__all__" in names):
            names = set(importlib.import_module(module).__all__)
        table[module] = frozenset(names) or ANY
    return table


def test_the_table_names_modules_and_names_that_exist() -> None:
    table = public_table()
    assert {"turnkeep", "turnkeep.in_workflow", "turnkeep.testing"} <= set(table)
    for module_name, names in table.items():
        module = importlib.import_module(module_name)
        if names is ANY:
            continue
        missing = {name for name in names if not hasattr(module, name)}
        assert not missing, f"{module_name} has no {sorted(missing)}"
        if hasattr(module, "__all__"):
            assert names == set(module.__all__), f"the table and {module_name}.__all__ differ"


def _code() -> list[tuple[str, str]]:
    """(where, Python source) of the examples and of the documentation's Python blocks."""
    sources = [
        (str(p.relative_to(ROOT)), p.read_text("utf-8")) for p in ROOT.glob("examples/**/*.py")
    ]
    # Not the generated references: their blocks are signatures, not code to copy.
    pages = [
        ROOT / "README.md",
        *(p for p in ROOT.glob("docs/**/*.md") if "reference" not in p.parts),
    ]
    for page in pages:
        blocks = re.findall(r"^```python[^\n]*\n(.*?)^```", page.read_text("utf-8"), re.M | re.S)
        sources += [(str(page.relative_to(ROOT)), block) for block in blocks]
    return sources


def turnkeep_imports(source: str) -> list[tuple[str, str | None]]:
    """(module, name) of each import from turnkeep; name None for ``import turnkeep.x``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] == "turnkeep":
                found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, None) for a in node.names if a.name.split(".")[0] == "turnkeep"]
    return found


CODE = _code()


@pytest.mark.parametrize(("where", "source"), CODE, ids=[where for where, _ in CODE])
def test_examples_and_docs_import_only_the_public_api(where: str, source: str) -> None:
    table = public_table()
    for module, name in turnkeep_imports(source):
        assert module in table, f"{where} imports internal module {module}"
        names = table[module]
        assert name is None or names is ANY or name in names, f"{where}: {module}.{name}"


def test_an_internal_import_is_caught() -> None:
    imports = turnkeep_imports("from turnkeep.contract.messages import Message\nimport turnkeep")
    assert imports == [("turnkeep.contract.messages", "Message"), ("turnkeep", None)]
    assert "turnkeep.contract.messages" not in public_table()
