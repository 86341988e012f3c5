"""CALLABLES"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def import_callable(path: str, base_dir: Path | None = None) -> Callable[..., Any]:
    """Resolve ``"package.module:function"`` (the attribute may be dotted). Modules are found on
    ``sys.path`` and, as with fast-agent's config, beside the config file (``base_dir``)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{path!r} is not of the form 'package.module:function'")
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{path!r} is not callable")
    return obj
