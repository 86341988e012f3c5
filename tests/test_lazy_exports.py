"""``turnkeep.support.lazy``: a package's names listed once in its stub, each imported from its
module on first use, ``__all__`` and ``dir()`` from the same list."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    root = tmp_path / "lazypkg"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from turnkeep.support.lazy import lazy_exports\n\n"
        "__getattr__, __dir__ = lazy_exports(globals())\n"
    )
    (root / "__init__.pyi").write_text(
        "from lazypkg.heavy import Heavy as Heavy\nfrom lazypkg.light import light as light\n"
    )
    (root / "heavy.py").write_text("class Heavy:\n    pass\n")
    (root / "light.py").write_text("def light() -> str:\n    return 'light'\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield "lazypkg"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.split(".")[0] == "lazypkg"]:
            del sys.modules[name]


def test_names_come_from_the_stub_and_load_only_their_module(package: str) -> None:
    lazypkg = __import__(package)
    assert "lazypkg.heavy" not in sys.modules and "lazypkg.light" not in sys.modules
    assert lazypkg.light() == "light"
    assert "lazypkg.light" in sys.modules and "lazypkg.heavy" not in sys.modules
    assert lazypkg.__all__ == ["Heavy", "light"]
    assert {"Heavy", "light"} <= set(dir(lazypkg))
    assert "lazypkg.heavy" not in sys.modules
    with pytest.raises(AttributeError, match="module 'lazypkg' has no attribute 'nope'"):
        _ = lazypkg.nope
    namespace: dict[str, object] = {}
    exec(f"from {package} import *", namespace)
    assert namespace["Heavy"] is sys.modules["lazypkg.heavy"].Heavy
