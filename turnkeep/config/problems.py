"""What is wrong with a config file, said as a person reads it: one line per problem, each
naming the file, where in it (a YAML position, or the key path ``agents.helper.model``) and
the cause. pydantic's own report spans lines, names its internal types and links to its
documentation; YAML's names ``"<unicode string>"`` for a file it was handed as text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

# What pydantic puts before a validator's own message, which is the whole cause.
_PREFIXES = ("Value error, ", "Assertion failed, ")


def yaml_problem(source: Path, err: yaml.YAMLError) -> str:
    """``file, line L, column C: cause`` for a YAML syntax error."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    context = getattr(err, "context", None)
    cause = f"{problem} ({context})" if context else problem
    return f"{source}{where}: not valid YAML: {cause}"


def validation_problems(source: str, err: ValidationError, data: Any) -> list[str]:
    """``file: key.path: cause``, one for each thing pydantic found wrong with ``data`` (the
    mapping it validated); the same place and cause only once. The value
    itself is never repeated: it may be a key."""
    problems: list[str] = []
    for error in err.errors(include_input=False, include_url=False):
        path = key_path(error["loc"], data, missing=error["type"] == "missing")
        line = f"{source}: {path + ': ' if path else ''}{_cause(error['msg'], error['type'])}"
        if line not in problems:
            problems.append(line)
    return problems


def key_path(loc: tuple[int | str, ...], data: Any, *, missing: bool = False) -> str:
    """The key path in the file for pydantic's location of an error: its steps that are keys
    or indexes of the data, as ``agents.helper.servers[0]``. pydantic also names the member of
    a union or the validator it tried (``str``, ``function-after[...]``) as a step: those are
    not in the file and are left out. A missing key is named though the data lacks it."""
    path = ""
    value = data
    for index, step in enumerate(loc):
        if isinstance(step, int) and isinstance(value, list) and 0 <= step < len(value):
            path += f"[{step}]"
            value = value[step]
        elif isinstance(value, dict) and step in value:
            path += f".{step}" if path else str(step)
            value = value[step]
        elif missing and index == len(loc) - 1:
            path += f".{step}" if path else str(step)
    return path


def validator_message(message: str) -> str:
    """A pydantic error's message without what pydantic puts before a validator's own."""
    for prefix in _PREFIXES:
        message = message.replace(prefix, "")
    return message


def _cause(message: str, kind: str) -> str:
    message = validator_message(message)
    if kind == "missing":
        return "required, and missing"
    if kind == "extra_forbidden":
        return "not a setting turnkeep knows (a misspelling?)"
    # One line, lowercase like every other error line (an acronym kept as it is).
    message = " ".join(message.split())
    if message[1:2].islower():
        message = message[:1].lower() + message[1:]
    return message
