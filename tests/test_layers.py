"""turnkeep's rooms import one way (the design notes' *Code layout*), and so do the modules of the
workflow code among themselves. Checked by parsing every module's imports, so a wrong turn
fails here rather than as an import cycle later."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "turnkeep"

# What each room of turnkeep may import from turnkeep, besides itself. Read from the bottom up:
# each room uses only rooms listed above it. A key ``room.module`` places that one module of a
# room apart from the rest of it: imports from and to it follow its own line.
MAY_IMPORT: dict[str, set[str]] = {
    # Errors retrying cannot fix; plumbing that knows nothing of turns (ASGI serving, entry
    # points, the SDK's private names).
    "errors": set(),
    "support": {"errors"},
    # fast-agent's translation: its config keys, MCP target strings, RequestParams and model
    # strings, the plain data config and providers build on.
    "fastagent": {"errors"},
    # The turn's data contract: the types that cross workflow, activity and client boundaries
    # (pydantic and stdlib only), and the pure checks on them. Runs in Temporal's sandbox.
    "contract": set(),
    # Deterministic workflow code: runs in Temporal's sandbox.
    "workflows": {"contract"},
    # A turn as a step of an application's workflow: workflow code only.
    "in_workflow": {"contract", "workflows"},
    # The worker's configuration: settings, Python agents, config files.
    "config": {"contract", "errors", "fastagent"},
    # Metrics, traces, logs and search attributes.
    "observability": {"contract", "config", "errors", "support", "workflows"},
    # How payloads cross Temporal: converter, encryption, storage, the codec server.
    "payloads": {"contract", "config", "errors", "observability", "support", "workflows"},
    # Model providers and tool servers: what the activities call.
    "providers": {"contract", "config", "errors", "fastagent", "support", "workflows"},
    "tools": {"contract", "config", "errors", "support", "workflows"},
    "activities": {
        "contract",
        "config",
        "errors",
        "fastagent",
        "observability",
        "providers",
        "support",
        "tools",
        "workflows",
    },
    # The plugin and everything a worker process runs.
    "worker": {
        "contract",
        "activities",
        "config",
        "errors",
        "observability",
        "payloads",
        "providers",
        "support",
        "tools",
        "workflows",
    },
    # What a client process imports: connect, turns, sessions, history (which replays a
    # history as a worker would: the worker's replay set-up), live text.
    "client": {
        "contract",
        "config",
        "errors",
        "observability",
        "payloads",
        "support",
        "worker",
        "workflows",
    },
    # Ways in for callers without a Temporal client (MCP, the HTTP gateway and its page, A2A):
    # thin layers over the client API.
    "doors": {"contract", "client", "config", "errors", "observability", "support", "workflows"},
    # The embedded Temporal dev server and the background processes beside it.
    "devserver": {
        "contract",
        "config",
        "errors",
        "observability",
        "payloads",
        "support",
        "workflows",
    },
    # fast-agent's decorator API (@fast.agent), the one module of its room that sits on top:
    # it serves the agents it collects through a worker's plugin.
    "fastagent.app": {"contract", "config", "errors", "fastagent", "worker", "workflows"},
    # What users test their own agents with: anything but the command line.
    "testing": {
        "contract",
        "activities",
        "client",
        "config",
        "devserver",
        "errors",
        "observability",
        "payloads",
        "providers",
        "support",
        "tools",
        "worker",
        "in_workflow",
        "workflows",
    },
    # The command line: no other room lists it, so nothing in turnkeep may import it.
    "cli": {
        "contract",
        "activities",
        "client",
        "config",
        "devserver",
        "doors",
        "errors",
        "fastagent",
        "fastagent.app",
        "observability",
        "payloads",
        "providers",
        "support",
        "tools",
        "worker",
        "workflows",
    },
}

# The contract's modules from the bottom up: each imports only modules listed before it.
CONTRACT_MODULES = [
    "compact",
    "messages",
    "conversation",
    "live_io",
    "approval",
    "server_requests",
    "turn_io",
    "limits_io",
    "activity_io",
    "rewind",
    "session_io",
    "model_io",
    "replay_io",
    "evaluation_io",
]

# The workflow code's modules from the bottom up, likewise (a team's modules are ``teams.*``, a
# kind of wait's ``waits.*``).
WORKFLOW_MODULES = [
    "metrics",
    "shared",
    "task_priority",
    "starting",
    "worker_cache",
    "turn_metrics",
    "repair",
    "session_fork",
    "session_turns",
    "conversation_cache",
    "tool_batch",
    "budget_math",
    "loop",
    "pending_calls",
    "visibility",
    "limits",
    "limits.limit_metrics",
    "limits.ledger",
    "limits.sending",
    "limits.capacity",
    "limits.limiter",
    "actions",
    "replays",
    "waits",
    "waits.base",
    "waits.approval",
    "waits.budget_raise",
    "waits.client_tool",
    "waits.server_ask",
    "waits.elicitation",
    "waits.sampling",
    "waits.kinds",
    "waits.server_answers",
    "waits.updates",
    "child_turn",
    "agent_tools",
    "inline_agent",
    "teams.steps",
    "teams.chain",
    "teams.parallel",
    "teams.router",
    "teams.evaluator",
    "teams.maker",
    "teams.planner",
    "teams",
    "child_approvals",
    "turn_workflow",
    "session_rewind",
    "session_workflow",
    "evaluation",
]


def part_of(module: str) -> str | None:
    """``turnkeep.activities.model`` -> ``activities``, ``turnkeep.fastagent.app`` ->
    ``fastagent.app`` (a module placed apart); None outside turnkeep's rooms."""
    parts = module.split(".")
    if parts[0] != "turnkeep" or len(parts) < 2:
        return None
    apart = ".".join(parts[1:3])
    return apart if apart in MAY_IMPORT else parts[1]


def room_of(path: Path) -> str:
    """The room of the module at ``path``, as ``part_of`` names it."""
    room = part_of(".".join(("turnkeep", *path.relative_to(ROOT).with_suffix("").parts)))
    assert room is not None
    return room


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            # `from turnkeep import cli` imports the room as surely as `import turnkeep.cli`;
            # `from turnkeep.workflows import loop` the module, and so does
            # `from turnkeep.workflows.waits import kinds`.
            names.update(name for a in node.names if is_module(name := f"{node.module}.{a.name}"))
    return names


def is_module(name: str) -> bool:
    """Whether ``name`` is one of turnkeep's modules or packages (not a name in one)."""
    path = ROOT.parent / name.replace(".", "/")
    return name.startswith("turnkeep.") and (path.is_dir() or path.with_suffix(".py").is_file())


MODULES = sorted(p for p in ROOT.rglob("*.py") if p.parent != ROOT or p.stem in MAY_IMPORT)


def wrong_imports(own: str, path: Path) -> set[str]:
    """What the module at ``path``, in room ``own``, imports from rooms it may not use."""
    return {
        name
        for name in imported(path)
        if (part := part_of(name)) is not None
        and part in MAY_IMPORT
        and part != own
        and part not in MAY_IMPORT[own]
    }


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_imports_go_one_way(path: Path) -> None:
    own = room_of(path)
    wrong = wrong_imports(own, path)
    assert not wrong, f"{own} must not import {sorted(wrong)}"


def test_every_room_is_placed() -> None:
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    rooms |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}
    assert rooms == {room.partition(".")[0] for room in MAY_IMPORT}
    apart = [room for room in MAY_IMPORT if "." in room]
    assert all((ROOT / room.replace(".", "/")).with_suffix(".py").is_file() for room in apart)


def module_path(room: str, module: str) -> Path:
    """``teams.chain`` -> ``workflows/teams/chain.py``; ``teams`` -> its ``__init__.py``."""
    path = ROOT / room / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def module_name(room: str, path: Path) -> str:
    parts = path.relative_to(ROOT / room).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@pytest.mark.parametrize(
    ("room", "module"),
    [("contract", m) for m in CONTRACT_MODULES] + [("workflows", m) for m in WORKFLOW_MODULES],
)
def test_modules_import_downwards(room: str, module: str) -> None:
    order = CONTRACT_MODULES if room == "contract" else WORKFLOW_MODULES
    below = set(order[: order.index(module)])
    prefix = f"turnkeep.{room}."
    used = {
        name.removeprefix(prefix)
        for name in imported(module_path(room, module))
        if name.startswith(prefix)
    }
    assert used <= below, f"{room}.{module} must not import {sorted(used - below)}"


@pytest.mark.parametrize(
    ("room", "order"), [("contract", CONTRACT_MODULES), ("workflows", WORKFLOW_MODULES)]
)
def test_every_module_is_placed(room: str, order: list[str]) -> None:
    found = {module_name(room, p) for p in (ROOT / room).rglob("*.py")} - {""}
    assert found == set(order)


def test_workflow_code_imports_nothing_else_of_turnkeep() -> None:
    for room in ("contract", "workflows"):
        for path in (ROOT / room).rglob("*.py"):
            others = {
                n
                for n in imported(path)
                if (part := part_of(n)) and part not in MAY_IMPORT[room] | {room}
            }
            assert not others, f"{path.name} imports {sorted(others)}"


def test_no_part_may_import_the_cli(tmp_path: Path) -> None:
    """However it is spelled: the command line sits on top of everything else."""
    module = tmp_path / "module.py"
    module.write_text(
        "import turnkeep.cli.main\n"
        "from turnkeep import cli\n"
        "from turnkeep.cli.errors import report\n",
        encoding="utf-8",
    )
    for own in MAY_IMPORT.keys() - {"cli"}:
        assert wrong_imports(own, module) == {
            "turnkeep.cli.main",
            "turnkeep.cli",
            "turnkeep.cli.errors",
        }, own


def test_a_module_placed_apart_is_told_from_its_room(tmp_path: Path) -> None:
    """fast-agent's decorator API sits on top however it is imported, while the rest of its
    room stays below config."""
    module = tmp_path / "module.py"
    module.write_text(
        "from turnkeep.fastagent import app\n"
        "from turnkeep.fastagent.targets import target_settings\n",
        encoding="utf-8",
    )
    for own in ("fastagent", "config", "providers"):
        assert wrong_imports(own, module) == {"turnkeep.fastagent.app"}, own
    assert wrong_imports("cli", module) == set()
