"""``turnkeep.support.lazy``: a package's names listed once in its stub, each imported from its
module on first use, ``__all__`` and ``dir()`` from the same list."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import turnkeep
import turnkeep.testing
from turnkeep.support.lazy import stub_exports


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


def test_a_missing_stub_is_an_attribute_error_that_names_it(package: str) -> None:
    """A bundle or vendored copy without the ``.pyi``: ``hasattr`` stays False, not OSError."""
    lazypkg = __import__(package)
    Path(lazypkg.__file__).with_suffix(".pyi").unlink()
    with pytest.raises(AttributeError, match=r"cannot offer 'Heavy'.*__init__\.pyi") as raised:
        _ = lazypkg.Heavy
    assert isinstance(raised.value.__cause__, ImportError)
    assert not hasattr(lazypkg, "Heavy") and not hasattr(lazypkg, "nope")
    with pytest.raises(ImportError, match=r"__init__\.pyi"):
        dir(lazypkg)


@pytest.mark.parametrize(
    "line",
    [
        "import lazypkg.heavy\n",
        "from lazypkg.heavy import Heavy\n",
        "from lazypkg.heavy import Heavy as Weighty\n",
        "from .heavy import Heavy as Heavy\n",
        "X: int\n",
    ],
)
def test_a_stub_holds_only_reexports(package: str, line: str) -> None:
    """A line the lazy loader would not understand is an error, not a name quietly missing."""
    lazypkg = __import__(package)
    stub = Path(lazypkg.__file__).with_suffix(".pyi")
    stub.write_text(stub.read_text() + line)
    with pytest.raises(ImportError, match="line 3: a package stub holds only"):
        stub_exports(lazypkg.__spec__)


@pytest.mark.parametrize("package", [turnkeep, turnkeep.testing], ids=lambda p: p.__name__)
def test_no_public_name_is_also_a_submodule(package: ModuleType) -> None:
    """Importing a submodule binds it as the package's attribute, over the lazy name."""
    submodules = {m.name for m in pkgutil.iter_modules(package.__path__)}
    assert not submodules & set(stub_exports(package.__spec__))


def test_the_pytest_plugin_leaves_the_harness_function_in_place() -> None:
    """conftest loads the plugin (``pytest_plugins``), which imports turnkeep.testing's
    modules; the documented ``turnkeep.testing.harness`` is still the function after it."""
    importlib.import_module("turnkeep.testing.pytest_plugin")
    for module in pkgutil.iter_modules(turnkeep.testing.__path__, "turnkeep.testing."):
        importlib.import_module(module.name)
    assert callable(turnkeep.testing.harness)
    assert callable(turnkeep.testing.eventually)
