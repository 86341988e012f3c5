"""MkDocs hooks (``hooks:`` in mkdocs.yml): the reference pages, generated from the code at build
time, so ``mkdocs build --strict`` is self-contained and a reference can never be stale.

- ``reference/configuration.md`` from the settings models (``turnkeep.config.settings``): every
  key with its type, default and description. A field's description is its ``Field(description=)``
  if it has one, else the comments written above or beside it in the model's source, which is
  where settings.py documents its keys.
- ``reference/cli.md`` from the ``turnkeep`` command (the Typer app in ``turnkeep/cli/main.py``):
  every command with its usage, arguments and options.
- ``reference/python.md`` from the public facade: each name in ``turnkeep.__all__`` with its
  signature and docstring.
- ``changelog.md``: the repository's CHANGELOG.md, so the site shows it too; a page links
  ``../CHANGELOG.md`` (which a code host resolves) and the site gets ``changelog.md``.

The three references are also committed under ``docs/reference/``, so their links work when
the docs are read on a code host; the site renders them afresh, and ``tests/test_docs.py``
fails when a committed copy differs from what the code gives (``python -m docs.hooks`` writes
them anew).
"""

from __future__ import annotations

import ast
import enum
import inspect
import re
import textwrap
import tokenize
import types
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parent.parent

# -- configuration reference ------------------------------------------------------------------


def _field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comments above it and beside it in ``model``'s own class body."""
    try:
        source = textwrap.dedent(inspect.getsource(model))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}  # 1-based line -> comment text
    for token in tokenize.generate_tokens(StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    found: dict[str, str] = {}
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    for node in body.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        line = node.lineno - 1
        while line >= 1 and lines[line - 1].strip().startswith("#"):
            above.insert(0, comments.get(line, ""))
            line -= 1
        end = node.end_lineno or node.lineno
        beside = [
            comments[n]
            for n in range(node.lineno, end + 1)
            if n in comments and not lines[n - 1].strip().startswith("#")
        ]
        text = " ".join(part for part in [*above, *beside] if part)
        if text:
            found[node.target.id] = text
    return found


# Keys settings.py leaves undocumented because their name says it to a reader of the code; the
# reference says it to a reader of the site. The source's own comments win when it has them.
_PLAIN: dict[str, str] = {
    "Settings.default_model": "The model of agents that name none: a model string "
    "(`sonnet`, `openai.gpt-4.1`, `generic.llama3.2`, `passthrough`...). Unset: Anthropic's "
    "default with `ANTHROPIC_API_KEY`, else OpenAI's with `OPENAI_API_KEY`, else `passthrough`.",
    "Settings.task_queue": "The task queue the worker polls and clients start turns on.",
    "Settings.mcp": "fast-agent's `mcp:` block.",
    "Settings.agents": "agent name -> its settings; a turn names one of them.",
    "Settings.visibility": "What a turn publishes for operators: search attributes and their "
    "update interval.",
    "Settings.anthropic": "The Anthropic provider (`anthropic.<model>`, `sonnet`, `haiku`, "
    "`opus`).",
    "Settings.openai": "The OpenAI provider (`openai.<model>`, `gpt-4.1`, `o3`...).",
    "Settings.generic": "Any OpenAI-compatible server (`generic.<model>`); needs `base_url`.",
    "McpSettings.servers": "server name -> how to reach it; agents list servers by name.",
    "McpServerSettings.command": "stdio: the program to start.",
    "McpServerSettings.args": "stdio: its arguments.",
    "McpServerSettings.env": "stdio: environment variables for the process (values are redacted "
    "in logs).",
    "McpServerSettings.cwd": "stdio: its working directory (relative: from the config file).",
    "McpServerSettings.url": "http or sse: the server's URL.",
    "McpServerSettings.headers": "http or sse: headers sent with every request (values are "
    "redacted in logs).",
    "McpServerSettings.description": "A note for people reading the file.",
    "AgentOptions.instruction": "The system prompt.",
    "AgentOptions.max_iterations": "Tool-loop cap: how many rounds of tool calls a turn may run "
    "before it stops with `maxIterations`.",
    "AgentOptions.use_history": "Send the conversation so far with each model call (false: only "
    "this turn's messages).",
    "AgentOptions.parallel_tool_calls": "Run the tool calls of one model answer concurrently.",
    "AgentOptions.temperature": "Sampling temperature sent to the model (unset: the provider's).",
    "AgentOptions.max_tokens": "Output token limit per model call (unset: the provider's default).",
    "AgentOptions.compaction": "Mid-turn compaction of older exchanges.",
    "AgentOptions.llm_timeouts": "Timeouts and attempts of the model-call activity (`llm_step`).",
    "AgentOptions.tool_timeouts": "Timeouts and attempts of the tool-call activity (`call_tool`).",
    "AgentSettings.servers": "The MCP servers and function-tool servers whose tools it sees, in "
    "this order.",
    "CompactionSettings.enabled": "Compact when the context reaches `threshold`.",
    "CompactionSettings.threshold": "Share of the model's context window (estimated at 4 "
    "characters a token) that triggers compaction.",
    "CompactionSettings.keep_exchanges": "How many of the latest exchanges stay verbatim.",
    "TimeoutSettings.start_to_close": "Seconds one attempt may take.",
    "TimeoutSettings.max_attempts": "Attempts before the call fails for good.",
    "PayloadStorageSettings.bucket": "s3: the bucket (credentials from the environment).",
    "ContinueAsNewSettings.history_bytes": "Continue as new once a run's history reaches this "
    "many bytes (`null`: not by size).",
    "ContinueAsNewSettings.history_events": "Continue as new once a run's history reaches this "
    "many events (`null`: not by count).",
    "EncryptionSettings.current_key": "The id in `keys` that new payloads are encrypted with.",
    "EncryptionSettings.codec_server": "`turnkeep codec-server`, for the Web UI and the "
    "`temporal` CLI.",
    "CodecServerSettings.host": "The address it listens on (it warns on a non-loopback one: "
    "plain HTTP).",
    "ProviderSettings.api_key": "The API key (unset: `ANTHROPIC_API_KEY` / `OPENAI_API_KEY` from "
    "the environment). Give it as `${VAR}` or in turnkeep.secrets.yaml.",
    "ProviderSettings.base_url": "The API's base URL (required for `generic`).",
    "ProviderSettings.default_headers": "Headers sent with every request.",
}


def _descriptions(model: type[BaseModel]) -> dict[str, str]:
    """Comments of ``model`` and the models it inherits fields from (the most derived win),
    with ``_PLAIN`` for the fields that have none."""
    merged: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if isinstance(cls, type) and issubclass(cls, BaseModel) and cls is not BaseModel:
            for name in inspect.get_annotations(cls):
                if f"{cls.__name__}.{name}" in _PLAIN:
                    merged[name] = _PLAIN[f"{cls.__name__}.{name}"]
            merged.update(_field_comments(cls))
    return merged


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The settings model a field holds: itself, optional, or as the values of a dict."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        models = [m for a in args if (m := _model_in(a)) is not None]
        return models[0] if len(models) == 1 else None
    if origin is dict and len(args) == 2:
        return _model_in(args[1])
    return None


def _is_dict_of_models(annotation: Any) -> bool:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_dict_of_models(a) for a in typing.get_args(annotation))
    return typing.get_origin(annotation) is dict and _model_in(annotation) is not None


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is SecretStr:
        return "secret string"
    if annotation is Path:
        return "path"
    if annotation is timedelta:
        return "duration"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f'"{member.value}"' for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict and len(args) == 2:
        return f"map of {_type_name(args[0])} to {_type_name(args[1])}"
    return str(annotation).replace("typing.", "")


def _value(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds and seconds % size == 0:
                return f"`{seconds // size}{unit}`"
        return f"`{seconds}s`"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, (dict, list)) and not value:
        return "`{}`" if isinstance(value, dict) else "`[]`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    return f"`{value!r}`"


def _default(field: FieldInfo, instance_default: Any) -> str:
    if instance_default is not PydanticUndefined:
        value = instance_default
    elif field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    else:
        value = field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "see below"
    return _value(value)


def _prose(text: str) -> str:
    """Docstring or comment text as Markdown: reST's double backticks made single, a ``<`` that
    would open an HTML tag escaped."""
    text = " ".join(text.split()).replace("``", "`")
    text = re.sub(r"\s*\(SPEC §[\d.]+\)", "", text)
    parts = text.split("`")  # odd parts are code spans, where Markdown shows `<` as it is
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _sections(
    model: type[BaseModel], path: str, defaults: BaseModel | None
) -> Iterator[tuple[str, type[BaseModel], list[str]]]:
    """(key path, model, table rows) for ``model`` and, after it, every section inside it."""
    descriptions = _descriptions(model)
    rows: list[str] = []
    nested: list[tuple[str, type[BaseModel], BaseModel | None]] = []
    for name, field in model.model_fields.items():
        if field.exclude:
            continue  # not a key of the file (set by the loader)
        key = f"{path}.{name}" if path else name
        instance_default = getattr(defaults, name) if defaults is not None else PydanticUndefined
        description = _prose(field.description or descriptions.get(name, ""))
        rows.append(
            f"| `{key}` | {_cell(_type_name(field.annotation))} | "
            f"{_default(field, instance_default)} | {_cell(description)} |"
        )
        inner = _model_in(field.annotation)
        if inner is not None:
            if _is_dict_of_models(field.annotation):
                nested.append((f"{key}.<name>", inner, None))
            else:
                default = instance_default
                if default is PydanticUndefined and field.default_factory is not None:
                    default = field.default_factory()  # type: ignore[call-arg]
                nested.append((key, inner, default if isinstance(default, BaseModel) else None))
    yield path, model, rows
    for key, inner, default in nested:
        yield from _sections(inner, key, default)


def configuration_reference() -> str:
    from turnkeep.config.settings import Settings

    out = [
        "# Configuration reference",
        "",
        "Every key of `turnkeep.yaml`, generated from the settings models in "
        "`turnkeep/config/settings.py` when the site is built. "
        "[Configuration](../configuration.md) "
        "explains how a worker finds and loads the file. A `<name>` in a key is a name you "
        "choose (an agent's, a server's). Durations take seconds or `30m`, `12h`, `7d`; "
        "unknown keys are refused.",
        "",
    ]
    for path, model, rows in _sections(Settings, "", Settings()):
        out.append(f"## `{path}`" if path else "## Top level")
        out.append("")
        doc = inspect.getdoc(model) if model.__doc__ else None
        if doc:
            out += [_prose(doc), ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |", *rows, ""]
    return "\n".join(out)


# -- CLI reference ----------------------------------------------------------------------------


def cli_reference() -> str:
    import typer.core
    import typer.main

    from turnkeep.cli.main import app

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)  # an app of several commands
    ctx = group.context_class(group, info_name="turnkeep")
    out = [
        "# CLI reference",
        "",
        "Every `turnkeep` command and option, generated from the command itself "
        "(`turnkeep/cli/`) when the site is built. `turnkeep COMMAND --help` prints the same.",
        "",
        f"{group.help or ''}",
        "",
        "## Global options",
        "",
        "Given before the command: `turnkeep --debug run ...`.",
        "",
        *_parameter_table(group, ctx),
    ]
    out += _commands(group, ctx, ["turnkeep"])
    return "\n".join(out)


def _commands(group: Any, ctx: Any, path: list[str]) -> list[str]:
    """A section per command of ``group``, and after a group's own, one per subcommand
    (``turnkeep sessions close``)."""
    out: list[str] = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = command.context_class(command, info_name=name, parent=ctx)
        pieces = [
            re.sub(r"\{(\w+)\}", lambda m: m[1].upper(), piece)
            for piece in command.collect_usage_pieces(sub)
        ]
        usage = " ".join([*path, name, *pieces])
        out += [f"## `{' '.join([*path, name])}`", "", "```text", usage, "```", ""]
        if command.help:
            out += [inspect.cleandoc(command.help), ""]
        out += _parameter_table(command, sub)
        if hasattr(command, "list_commands"):  # a group: `sessions`, then `sessions close`
            out += _commands(command, sub, [*path, name])
    return out


def _parameter_table(command: Any, ctx: Any) -> list[str]:
    """A command's arguments and options as a table (pipes inside code spans stay as they are:
    Python-Markdown does not split cells there)."""
    rows = []
    for param in command.params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, help_text = record
        if param.param_type_name == "argument":
            kind, opts = "argument", (param.metavar or param.name or opts).upper()
        else:
            kind = "option"
        rows.append(f"| `{opts}` | {kind} | {_cell(' '.join(help_text.split()))} |")
    if not rows:
        return []
    return ["| name | kind | description |", "| --- | --- | --- |", *rows, ""]


# -- Python API reference ---------------------------------------------------------------------


class _Written:
    """An annotation shown as written: ``from __future__ import annotations`` leaves them as
    strings, which a signature would otherwise print quoted."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(obj: Any) -> str:
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return ""

    def written(annotation: Any) -> Any:
        return _Written(annotation) if isinstance(annotation, str) else annotation

    return str(
        signature.replace(
            parameters=[
                p.replace(annotation=written(p.annotation)) for p in signature.parameters.values()
            ],
            return_annotation=written(signature.return_annotation),
        )
    )


def _doc(obj: Any) -> str:
    """A docstring as Markdown: reST's double backticks made single."""
    return (inspect.getdoc(obj) or "").replace("``", "`")


def _public_methods(cls: type) -> Iterator[tuple[str, Any]]:
    for name, member in cls.__dict__.items():
        if name.startswith("_"):
            continue
        func = member.__func__ if isinstance(member, (classmethod, staticmethod)) else member
        if inspect.isfunction(func) and func.__doc__:
            yield name, func


def python_reference() -> str:
    import turnkeep

    out = [
        "# Python API reference",
        "",
        "The public `turnkeep` facade: every name in `turnkeep.__all__`, importable from "
        "`turnkeep` itself, with its docstring, generated when the site is built. "
        "[Using turnkeep as a library](../library.md) shows them at work; workflow code "
        "uses `turnkeep.in_workflow` (`run_turn`, `start_child_turn`, `child_turn_result`).",
        "",
    ]
    for name in turnkeep.__all__:
        obj = getattr(turnkeep, name)
        module = getattr(obj, "__module__", "")
        kind = "class" if inspect.isclass(obj) else "function" if callable(obj) else "value"
        out += [f"## `{name}`", "", f"*{kind}* in `{module}`", ""]
        if kind == "function" or (
            kind == "class" and not (issubclass(obj, BaseModel) or issubclass(obj, enum.Enum))
        ):
            out += ["```python", f"{name}{_signature(obj)}", "```", ""]
        doc = _doc(obj)
        if doc and not (kind == "class" and doc == _doc(obj.__mro__[1])):
            out += [doc, ""]
        if inspect.isclass(obj) and issubclass(obj, enum.Enum):
            out += ["Values: " + ", ".join(f"`{m.value}`" for m in obj) + ".", ""]
        elif inspect.isclass(obj) and issubclass(obj, BaseModel):
            fields = ", ".join(f"`{f}`" for f, info in obj.model_fields.items() if not info.exclude)
            out += [f"Fields: {fields}.", ""]
        if inspect.isclass(obj):
            for method, func in _public_methods(obj):
                summary = _doc(func).split("\n\n")[0]
                out += [f"- `{method}{_signature(func)}`: {' '.join(summary.split())}"]
            out.append("")
    return "\n".join(out)


# -- MkDocs ------------------------------------------------------------------------------------


def changelog() -> str:
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


# Committed under docs/ and rendered afresh into the site.
REFERENCES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": configuration_reference,
    "reference/cli.md": cli_reference,
    "reference/python.md": python_reference,
}
# Only in the site.
GENERATED: dict[str, Callable[[], str]] = {**REFERENCES, "changelog.md": changelog}

_CHANGELOG_LINK = re.compile(r"\]\((?:\.\./)+CHANGELOG\.md(#[^)]*)?\)")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, render in GENERATED.items():
        committed = files.get_file_from_path(uri)
        if committed is not None:
            files.remove(committed)
        files.append(File.generated(config, uri, content=render()))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The repository's ``CHANGELOG.md``, which a page links for code hosts, is the site's
    ``changelog.md``."""
    depth = page.file.src_uri.count("/")
    return _CHANGELOG_LINK.sub(lambda m: f"]({'../' * depth}changelog.md{m[1] or ''})", markdown)


def write_references() -> None:
    """Write the committed copies of the references anew."""
    for uri, render in REFERENCES.items():
        (ROOT / "docs" / uri).write_text(render() + "\n", encoding="utf-8")


if __name__ == "__main__":
    write_references()
