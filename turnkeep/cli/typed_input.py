"""What a person types in answer to a wait, as the value the wait takes: a form field of an
MCP server's requested schema as its type, a JSON object, arguments edited in ``$EDITOR``."""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from pathlib import Path
from typing import Any


def field_hint(spec: dict[str, Any], *, optional: bool) -> str:
    """What a form field takes, as its prompt says it: its choices, or its type."""
    options = spec.get("enum") or [
        o.get("const") for o in spec.get("oneOf") or spec.get("anyOf") or [] if isinstance(o, dict)
    ]
    kind = " | ".join(str(o) for o in options) if options else str(spec.get("type", "string"))
    if spec.get("type") == "boolean":
        kind = "y/n"
    return f"{kind}{', optional' if optional else ''}"


def field_value(spec: dict[str, Any], text: str) -> Any:
    """What was typed for a field, as the field's type (the turn checks it against the schema
    too)."""
    kind = spec.get("type")
    if kind == "boolean":
        if text.lower() in ("y", "yes", "true"):
            return True
        if text.lower() in ("n", "no", "false"):
            return False
        raise ValueError("answer y or n")
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{text!r} is not an integer") from None
    if kind == "number":
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{text!r} is not a number") from None
    if kind == "array":
        return [part.strip() for part in text.split(",") if part.strip()]
    return text


def json_object(text: str, what: str = "the arguments") -> dict[str, Any]:
    """The JSON object ``text`` holds; a ``ValueError`` saying what is wrong otherwise."""
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"not JSON: {err}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object")
    return value


def in_editor(editor: str, text: str) -> str | None:
    """``text`` as edited in ``editor`` (a command line, as ``$EDITOR`` holds); None when the
    editor fails."""
    with tempfile.TemporaryDirectory(prefix="turnkeep-") as folder:
        path = Path(folder) / "arguments.json"
        path.write_text(text + "\n", encoding="utf-8")
        try:
            done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        except OSError:
            return None
        if done.returncode != 0:
            return None
        return path.read_text(encoding="utf-8")
