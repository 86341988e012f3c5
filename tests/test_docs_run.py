"""The documentation's code, run as a new user would run it.

A fenced block the pages mark with an HTML comment on the line before it is run by this test
(the comment renders as nothing, on a code host and on the site):

- ``<!-- docs-test: run -->`` before a ``python`` block: the block is a whole module, written to
  a file and run against a dev server with ``turnkeep worker -c examples/turnkeep.yaml`` (the
  offline ``passthrough`` model) polling it; it must exit 0. ``localhost:7233`` in it is the
  test server's address.
- ``<!-- docs-test: run -->`` before a ``sh`` block: each line is run by ``bash`` from the
  repository's root, against the same server, and must exit 0; ``TURN_ID`` (and ``SESSION_ID``)
  stand for a turn (a session) this test started, and ``[...]`` options are left out. A line
  with any other placeholder, or one that starts something that runs until stopped (a worker,
  a server), is not run: its options are checked as every command line's are. ``chat`` reads
  one line, then the end of its input.
- ``<!-- docs-test: not-config -->`` before a ``yaml`` block: not a ``turnkeep.yaml`` (a
  Kubernetes probe, say). Every other ``yaml`` block is one, and must load as a worker loads it.

Whatever is not marked is still checked without running: every ``python`` block of every page
compiles (a top-level ``await`` allowed, as in a fragment), and every ``turnkeep`` command line
in a ``sh`` or ``console`` block names a command and options that the CLI has, and every call
on a ``handle``, ``turn`` or ``session`` names a method of ``TurnHandle`` (``SessionHandle``)
with arguments it takes.
"""

from __future__ import annotations

import ast
import base64
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from turnkeep.devserver.embedded import ServerInfo

ROOT = Path(__file__).resolve().parent.parent
# The references are signatures generated from the code, not code to run.
PAGES = sorted(
    {ROOT / "README.md", *(ROOT / "docs").rglob("*.md")}
    - {*(ROOT / "docs" / "reference").glob("*")}
)
# The pages a new user reads first: each must have at least one block this test runs.
FIRST_HOUR = ["README.md", "docs/getting-started.md", "docs/sessions.md"]

_BLOCK = re.compile(
    r"^(?:<!--\s*docs-test:\s*(?P<mark>[\w-]+)\s*-->\n)?"
    r"(?P<fence>`{3,})(?P<lang>\w*)[^\n]*\n(?P<code>.*?)^(?P=fence)\s*$",
    re.M | re.S,
)
# What a person types in place of a value: TURN_ID, CALL_ID, N, '{...}', "...".
_PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]*\b|\.\.\.|…")
# Commands that run until stopped, or act on what only a person could have set up.
_NOT_RUN = {"worker", "server", "serve", "gateway", "codec-server", "watch", "gc", "cancel"}
# What a run line or a block asks the model, which the offline model echoes.
_PROMPT = re.compile(r'turnkeep run "([^"]+)"|messages=\["([^"]+)"|send\("([^"]+)"\)')
_DEMO = "--agent demo -c examples/turnkeep.yaml"
# Provider keys never reach a docs run: the offline model answers, whatever the machine has.
_PROVIDER_KEYS = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "TURNKEEP_MODEL")


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    mark: str | None
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    name = str(page.relative_to(ROOT))
    return [
        Block(name, text.count("\n", 0, m.start("fence")) + 1, m["lang"], m["mark"], m["code"])
        for m in _BLOCK.finditer(text)
    ]


ALL_BLOCKS = [block for page in PAGES for block in blocks(page)]
MARKED = [block for block in ALL_BLOCKS if block.mark]


def command_lines(block: Block) -> Iterator[str]:
    """The ``turnkeep`` commands of a shell block, without a prompt or a comment."""
    for raw in block.code.replace("\\\n", " ").splitlines():
        line = raw.strip().removeprefix("$ ")
        if line.startswith("turnkeep "):
            yield line


def _words(line: str) -> list[str]:
    return shlex.split(line.replace("|", " "), comments=True)


def _command(words: list[str]) -> tuple[Any, list[str]]:
    """The CLI command a line names (a group's subcommand too), and its words after it."""
    import typer.main

    from turnkeep.cli.main import app

    # Typer's own click may not be the `click` package: a group is what lists commands.
    command: Any = typer.main.get_command(app)
    rest = words[1:]
    while rest and rest[0].startswith("-"):  # the global options, before the command
        option = next(p for p in command.params if rest[0].split("=")[0] in p.opts)
        rest = rest[1 if option.is_flag or "=" in rest[0] else 2 :]
    while hasattr(command, "list_commands") and rest and not rest[0].startswith("-"):
        found = command.get_command(command.context_class(command, info_name="turnkeep"), rest[0])
        if found is None:
            if command.name == "sessions":  # `sessions` lists; `sessions close ID` ends one
                break
            raise AssertionError(f"no command {rest[0]!r}")
        command, rest = found, rest[1:]
    return command, rest


def option_problems(line: str) -> list[str]:
    try:
        command, rest = _command(_words(line))
    except AssertionError as err:
        return [f"{line}: {err}"]
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    known.add("--help")
    named = {w.strip("[]").split("=")[0] for w in rest if w.strip("[]").startswith("-")}
    named.discard("-")  # stdin, not an option
    return [f"{line}: no option {opt} (has {sorted(known)})" for opt in sorted(named - known)]


@pytest.mark.parametrize(
    "block",
    [b for b in ALL_BLOCKS if b.lang in ("sh", "console", "bash") and any(command_lines(b))],
    ids=str,
)
def test_every_command_line_names_options_the_cli_has(block: Block) -> None:
    problems = [p for line in command_lines(block) for p in option_problems(line)]
    assert problems == []


def test_the_option_check_catches_a_wrong_option() -> None:
    assert option_problems("turnkeep show TURN_ID [--json] [--full]") == []
    assert option_problems("turnkeep sessions close SESSION_ID") == []
    assert option_problems("turnkeep show TURN_ID --jsn") != []
    assert option_problems("turnkeep shoe TURN_ID") != []


def test_only_lines_without_placeholders_run() -> None:
    ids = {"TURN_ID": "turn-1"}
    assert (
        _runnable("turnkeep show TURN_ID [--json] [--full]  # a turn", ids)
        == "turnkeep show turn-1"
    )
    assert _runnable("turnkeep approve TURN_ID CALL_ID [--deny]", ids) is None
    assert _runnable("turnkeep budget TURN_ID --raise N | --stop", ids) is None
    assert _runnable("turnkeep worker -c examples/turnkeep.yaml", ids) is None
    assert (
        _runnable('turnkeep run "What is 2?" --agent demo', ids)
        == 'turnkeep run "What is 2?" --agent demo'
    )


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "python"], ids=str)
def test_every_python_block_compiles(block: Block) -> None:
    # A fragment may await at the top level; a block marked to run may not (it is run as a file).
    flags = 0 if block.mark == "run" else ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    compile(block.code, str(block), "exec", flags=flags)


# What the pages' fragments call their handles: a turn's (`start_turn`, `get_turn`) and a
# session's (`open_session`, `get_session`).
_HANDLES = {"handle": "TurnHandle", "turn": "TurnHandle", "session": "SessionHandle"}


def handle_call_problems(code: str) -> list[str]:
    """The calls on a handle that name no method of it, or arguments it does not take."""
    import turnkeep

    tree = compile(code, "<block>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    found = []
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in _HANDLES
        ):
            continue
        kind = _HANDLES[node.func.value.id]
        method = getattr(getattr(turnkeep, kind), node.func.attr, None)
        if method is None:
            found.append(f"{kind} has no {node.func.attr}")
            continue
        arguments = {k.arg: None for k in node.keywords if k.arg}
        try:
            inspect.signature(method).bind(None, *node.args, **arguments)
        except TypeError as err:
            found.append(f"{kind}.{node.func.attr}: {err}")
    return found


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.lang == "python"], ids=str)
def test_every_handle_call_names_a_method_and_arguments_it_takes(block: Block) -> None:
    assert handle_call_problems(block.code) == []


def test_the_handle_check_catches_a_wrong_call() -> None:
    assert handle_call_problems('await handle.decide("w1", True, by="alice")') == []
    assert handle_call_problems('await handle.desicde("w1", True)') != []
    assert handle_call_problems('await session.send("hi", urgency=3)') != []


def test_the_first_hour_pages_have_blocks_that_run() -> None:
    marked = {block.page for block in MARKED if block.mark == "run"}
    assert [page for page in FIRST_HOUR if page not in marked] == []
    assert {block.mark for block in MARKED} <= {"run", "not-config"}


@pytest.mark.parametrize(
    "block", [b for b in ALL_BLOCKS if b.lang == "yaml" and b.mark != "not-config"], ids=str
)
def test_every_yaml_block_is_a_config_that_loads(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from turnkeep.config.files import load_settings

    # A key the example reads from the environment, as its reader would have set it.
    for name in re.findall(r"\$\{(\w+)\}", block.code):
        monkeypatch.setenv(name, base64.b64encode(b"k" * 32).decode())  # a key's length
    config = tmp_path / "turnkeep.yaml"
    config.write_text(block.code, encoding="utf-8")
    settings = load_settings(config)
    assert settings.agents


def _env(temporal: ServerInfo) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _PROVIDER_KEYS}
    env["TEMPORAL_ADDRESS"] = temporal.address
    env["TEMPORAL_NAMESPACE"] = temporal.namespace
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["COLUMNS"] = "200"
    return env


def _runnable(line: str, ids: dict[str, str]) -> str | None:
    """The line as this test runs it, or None when it is not one to run."""
    line = re.sub(r"\s\[[^\]]*\]", "", line.split("  #")[0]).strip()
    for placeholder, value in ids.items():
        line = re.sub(rf"\b{placeholder}\b", value, line)
    words = _words(line)
    if len(words) < 2 or words[1] in _NOT_RUN or _PLACEHOLDER.search(line.replace("-c ", "")):
        return None
    return line


def _bash(line: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", line],
        cwd=ROOT,
        env=env,
        input="Hi\n",  # a line for `chat` to send; it leaves at the end of input
        capture_output=True,
        text=True,
        timeout=120,
    )


# Runs a page's script as `python script.py` would, then leaves with os._exit: a short-lived
# Temporal client process can abort while the interpreter finalizes under the SDK's threads
# (sdk-python#300), after the script has done all it does; its own exit code still counts.
_RUN_THEN_EXIT = """
import os, runpy, sys, traceback
sys.argv = sys.argv[1:]
code = 0
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as stop:
    code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
except BaseException:
    traceback.print_exc()
    code = 1
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
"""


def _python(script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _RUN_THEN_EXIT, str(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.server
def test_the_marked_blocks_run(temporal: ServerInfo, tmp_path: Path) -> None:
    env = _env(temporal)
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [sys.executable, "-m", "turnkeep.cli", "worker", "-c", "examples/turnkeep.yaml"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # A turn and a session of this test's own, for the lines that name one.
        with ThreadPoolExecutor(max_workers=2) as pool:
            first = pool.submit(_bash, f"turnkeep run 'Hello!' {_DEMO} --json", env)
            chat = pool.submit(_bash, f"echo 'Hi' | turnkeep chat {_DEMO}", env)
            started, session = first.result(), chat.result()
        assert started.returncode == 0, started.stderr
        turn = json.loads(started.stdout)
        assert turn["final"]["content"] == [{"type": "text", "text": "Hello!"}]  # echoed
        assert session.returncode == 0, session.stderr
        session_id = re.search(r"--session ([\w.-]+)", session.stdout + session.stderr)
        assert session_id, session.stdout + session.stderr
        ids = {"TURN_ID": turn["turn_id"], "SESSION_ID": session_id[1]}

        # What to run: each marked block's commands once (pages repeat some), side by side.
        jobs: dict[str, Callable[[], subprocess.CompletedProcess[str]]] = {}
        for block in (b for b in MARKED if b.mark == "run"):
            if block.lang == "python":
                script = tmp_path / f"{block.page.replace('/', '_')}_{block.line}.py"
                script.write_text(block.code.replace("localhost:7233", temporal.address))
                jobs[str(block)] = partial(_python, script, env)
                continue
            for line in command_lines(block):
                runnable = _runnable(line, ids)
                if runnable is not None:
                    jobs.setdefault(runnable, partial(_bash, runnable, env))
        with ThreadPoolExecutor(max_workers=3) as pool:
            results = dict(zip(jobs, pool.map(lambda job: job(), jobs.values()), strict=True))
        failures = [
            f"{what}: exit {result.returncode}\n{result.stderr}"
            for what, result in results.items()
            if result.returncode != 0
        ]
        assert failures == [], (tmp_path / "worker.log").read_text()
        # The offline model echoes: what a block asks is what it prints (as the README says).
        for what, job in jobs.items():
            assert isinstance(job, partial)
            code = job.args[0].read_text() if job.func is _python else what
            prompts = ["".join(groups) for groups in _PROMPT.findall(code)]
            assert [p for p in prompts if p not in results[what].stdout] == [], what
        assert len(results) >= 10, list(results)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        log.close()
