"""Extension points (#22 item 5): model providers registered by name and kinds of tool source
registered by kind (built in, by the plugin, by an installed package's entry point), and tools
whose calls run on a task queue of their own, on other workers than the turn's model calls."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import mcp.types
import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

from tests.conftest import make_settings
from tests.mcp_servers.launch import STDIO_SCRIPT
from turnkeep.activities.tools import IDEMPOTENCY_KEY_META, ToolActivities
from turnkeep.client.turns import start_turn
from turnkeep.config.agents import Agent, McpServer
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.settings import McpServerSettings, Settings
from turnkeep.contract.activity_io import ToolCallRequest, ToolsRequest
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import TurnInput
from turnkeep.providers.base import ModelProvider
from turnkeep.providers.registry import ProviderRegistry, installed_providers
from turnkeep.tools.mcp import StdioSource
from turnkeep.tools.registry import ToolServers, ToolSourceRegistry, installed_tool_sources
from turnkeep.tools.source import ToolSource
from turnkeep.worker.build import build_worker
from turnkeep.worker.plugin import TurnkeepPlugin


class Shout(ModelProvider):
    """A third party's provider: `shout.<model>`, or the alias `loud`."""

    name = "shout"
    aliases: ClassVar[dict[str, str]] = {"loud": "v2"}
    context_window = 1_000

    @classmethod
    def from_settings(cls, settings: Settings) -> Shout:
        return cls()

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        return Message.assistant(f"{model_name}: {request.messages[-1].text.upper()}")


class ToolNames(ModelProvider):
    """Answers with the names of the tools it is offered, in order."""

    name = "toolnames"
    bare = True

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        return Message.assistant(", ".join(tool.name for tool in request.tools))


def queue(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


# --- model providers -------------------------------------------------------------------------


async def test_a_plugins_provider_answers_its_model_strings(client: Client, tmp_path: Path) -> None:
    settings = make_settings(
        tmp_path, agents={"test": {"model": "shout.v1", "models": ["loud", "passthrough"]}}
    )
    task_queue = queue("providers")
    plugin = TurnkeepPlugin(settings, providers=[Shout])
    async with Worker(client, task_queue=task_queue, plugins=[plugin]):
        finals = []
        for model in (None, "loud", "passthrough"):
            turn = TurnInput(agent="test", messages=["hi there"], model=model)
            result = await (await start_turn(client, turn, task_queue=task_queue)).result()
            finals.append(result.final.text if result.final else None)
    assert finals == ["v1: HI THERE", "v2: HI THERE", "hi there"]


async def test_a_model_string_resolves_only_to_registered_providers(
    client: Client, tmp_path: Path
) -> None:
    # The same agent on a worker that has not registered `shout`: the turn fails before any
    # model call, whatever the model string asks for.
    settings = make_settings(tmp_path, agents={"test": {"model": "shout.v1"}})
    task_queue = queue("unregistered")
    async with build_worker(client, settings, task_queue=task_queue):
        handle = await start_turn(
            client, TurnInput(agent="test", messages=["hi"]), task_queue=task_queue
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
    cause: BaseException | None = caught.value
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__
    assert isinstance(cause, ApplicationError) and cause.type == "UnknownModel"
    assert "'shout.v1'" in cause.message


def test_registry_resolves_built_ins_and_refuses_clashes() -> None:
    registry = installed_providers().extended([Shout])
    assert registry.resolve("loud").provider == "shout"
    assert registry.resolve("sonnet").name == "claude-sonnet-5"  # fast-agent's alias table
    assert registry.context_window("shout.x") == 1_000
    assert registry.context_window("openai.gpt-5") == 272_000  # fast-agent's model database
    assert registry.max_tokens("anthropic.claude-x") == 4096
    for model in ("shout", "shout.", "passthrough.x", "playback.y", "nothing.z"):
        with pytest.raises(ApplicationError, match="Unknown model"):
            registry.resolve(model)
    # Adding to a registry leaves the installed one as it was.
    with pytest.raises(ApplicationError):
        installed_providers().resolve("loud")

    class Impostor(Shout):
        name = "anthropic"

    class Alias(Shout):
        name = "other"
        aliases: ClassVar[dict[str, str]] = {"sonnet": "x"}

    for clash in (Impostor, Alias):
        with pytest.raises(ValueError, match=r"anthropic|sonnet"):
            ProviderRegistry([*installed_providers(), clash])
    with pytest.raises(TypeError):
        ProviderRegistry([object])  # type: ignore[list-item]


@pytest.fixture
def installed_package(tmp_path: Path) -> Iterator[Path]:
    """A distribution on sys.path whose metadata declares a `turnkeep.providers` entry point,
    as `pip install` would leave it."""
    site = tmp_path / "site"
    (site / "shoutpkg-1.0.dist-info").mkdir(parents=True)
    (site / "shoutpkg-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: shoutpkg\nVersion: 1.0\n"
    )
    (site / "shoutpkg.py").write_text(
        "from tests.test_extensions import Shout\n\nclass Whisper(Shout):\n    name = 'whisper'\n"
        "    aliases = {}\n"
    )
    sys.path.insert(0, str(site))
    installed_providers.cache_clear()
    installed_tool_sources.cache_clear()
    try:
        yield site / "shoutpkg-1.0.dist-info" / "entry_points.txt"
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("shoutpkg", None)
        installed_providers.cache_clear()
        installed_tool_sources.cache_clear()


def test_installed_packages_register_through_the_entry_point_group(
    installed_package: Path,
) -> None:
    installed_package.write_text("[turnkeep.providers]\nwhisper = shoutpkg:Whisper\n")
    assert installed_providers().resolve("whisper.v3").provider == "whisper"
    installed_providers.cache_clear()
    installed_package.write_text("[turnkeep.providers]\nbroken = shoutpkg:Missing\n")
    with pytest.raises(ValueError, match="entry point 'broken'"):
        installed_providers()


@pytest.mark.slow
def test_registering_the_built_ins_loads_no_sdk() -> None:
    # Importing an SDK takes seconds: a worker or a turn's setup that never calls a provider
    # must not pay for it.
    probe = (
        "import sys\n"
        "from turnkeep.activities.turn_setup import TurnSetupActivities\n"
        "from turnkeep.providers.registry import installed_providers\n"
        "installed_providers().context_window('sonnet')\n"
        "print(sorted(m for m in ('anthropic', 'openai') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


# --- tool sources ------------------------------------------------------------------------------


class Dice(ToolSource):
    """A third party's kind of tool server: a die whose faces its entry's `args` name, with
    one tool, `roll`, that tells the face and the request's idempotency key."""

    kind = "dice"

    def __init__(self, faces: list[str]) -> None:
        self.faces = faces
        self.closed = False

    @classmethod
    def from_config(cls, name: str, config: McpServerSettings, settings: Settings) -> Dice:
        if not config.args:
            raise ValueError(f"die {name!r} has no faces")
        return cls(config.args)

    async def list_tools(self) -> list[mcp.types.Tool]:
        schema = {"type": "object", "properties": {"face": {"type": "integer"}}}
        return [mcp.types.Tool(name="roll", description="Roll the die.", input_schema=schema)]

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], meta: dict[str, Any] | None = None
    ) -> mcp.types.CallToolResult:
        key = (meta or {}).get(IDEMPOTENCY_KEY_META)
        text = f"{self.faces[arguments['face']]} ({key})"
        return mcp.types.CallToolResult(content=[mcp.types.TextContent(type="text", text=text)])

    async def aclose(self) -> None:
        self.closed = True


async def test_a_plugins_tool_source_serves_a_real_turn(client: Client, tmp_path: Path) -> None:
    task_queue = queue("dice")
    plugin = TurnkeepPlugin(
        servers=[McpServer(name="die", transport="dice", args=["one", "two", "three"])],
        agents=[Agent(name="test", model="passthrough", tools=["die"])],
        tool_sources=[Dice],
    )
    async with Worker(client, task_queue=task_queue, plugins=[plugin]):
        turn = TurnInput(agent="test", messages=['***CALL_TOOL die__roll {"face": 1}'])
        handle = await start_turn(client, turn, task_queue=task_queue)
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert result.final is not None
    # The tool's answer, told the key that is the same for every attempt of this call.
    assert result.final.text.startswith(f"two ({handle.handle.id}/")
    assert [name for name, _ in scheduled_queues(list(history.events))] == [
        "prepare_turn",
        "list_tools",
        "llm_step",
        "call_tool",
        "llm_step",
    ]


async def test_build_worker_passes_providers_and_tool_sources_on(
    client: Client, tmp_path: Path
) -> None:
    settings = make_settings(
        tmp_path,
        mcp={"servers": {"die": {"transport": "dice", "args": ["six"]}}},
        agents={"test": {"model": "toolnames", "servers": ["die"]}},
    )
    task_queue = queue("built")
    worker = build_worker(
        client, settings, task_queue=task_queue, providers=[ToolNames], tool_sources=[Dice]
    )
    async with worker:
        handle = await start_turn(
            client, TurnInput(agent="test", messages=["?"]), task_queue=task_queue
        )
        result = await handle.result()
    assert result.final is not None and result.final.text == "die__roll"


async def test_a_server_of_an_unregistered_kind_stops_the_worker(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, mcp={"servers": {"die": {"transport": "dice"}}})
    with pytest.raises(ValueError, match=r"'die' has transport 'dice'.*known: http, sse, stdio"):
        TurnkeepPlugin(settings)
    # A kind's own check of its entry stops it too.
    with pytest.raises(ValueError, match="no faces"):
        TurnkeepPlugin(settings, tool_sources=[Dice])
    # The pool closes every source it holds.
    pool = ToolServers(
        make_settings(tmp_path, mcp={"servers": {"die": {"transport": "dice", "args": ["1"]}}}),
        sources=installed_tool_sources().extended([Dice]),
    )
    die = pool.source("die")
    assert isinstance(die, Dice) and not die.closed
    await pool.aclose()
    assert die.closed


def test_tool_source_kinds_are_registered_once() -> None:
    registry = installed_tool_sources().extended([Dice])
    assert [source.kind for source in registry] == ["stdio", "http", "sse", "dice"]
    # Adding to a registry leaves the installed one as it was.
    assert Dice not in list(installed_tool_sources())

    class Impostor(Dice):
        kind = "stdio"

    with pytest.raises(ValueError, match="two tool sources are of kind 'stdio'"):
        registry.register(Impostor)
    with pytest.raises(TypeError):
        ToolSourceRegistry([StdioSource, object])  # type: ignore[list-item]


def test_installed_packages_register_tool_sources_through_the_entry_point_group(
    installed_package: Path,
) -> None:
    installed_package.write_text("[turnkeep.tool_sources]\ndice = tests.test_extensions:Dice\n")
    assert Dice in list(installed_tool_sources())
    installed_tool_sources.cache_clear()
    installed_package.write_text("[turnkeep.tool_sources]\nbroken = shoutpkg:Missing\n")
    with pytest.raises(ValueError, match="entry point 'broken'"):
        installed_tool_sources()


# --- tools on a task queue of their own ---------------------------------------------------------


async def here() -> str:
    """Where this call ran (the main worker's version)."""
    return f"main worker, {activity.info().task_queue}"


async def here_on_tool_worker() -> str:
    """Where this call ran (the tool worker's version)."""
    return f"tool worker, {activity.info().task_queue}"


here_on_tool_worker.__name__ = "here"


def scheduled_queues(events: list[Any]) -> list[tuple[str, str]]:
    """(activity type, task queue) of every activity the turn scheduled, in order."""
    return [
        (
            e.activity_task_scheduled_event_attributes.activity_type.name,
            e.activity_task_scheduled_event_attributes.task_queue.name,
        )
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def test_an_agents_tools_run_on_their_own_task_queue(client: Client, tmp_path: Path) -> None:
    main, tools = queue("main"), queue("tools")
    config = {
        "agents": {"test": {"model": "passthrough", "servers": ["where"], "task_queue": tools}}
    }
    settings = make_settings(tmp_path, **config)
    # Both workers have the agent; only the tool worker's `here` may run.
    async with (
        build_worker(client, settings, task_queue=main, function_tools={"where": [here]}),
        build_worker(
            client, settings, task_queue=tools, function_tools={"where": [here_on_tool_worker]}
        ),
    ):
        turn = TurnInput(agent="test", messages=["***CALL_TOOL where__here {}"])
        handle = await start_turn(client, turn, task_queue=main)
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert result.final is not None and result.final.text == f"tool worker, {tools}"
    assert scheduled_queues(list(history.events)) == [
        ("prepare_turn", main),
        ("list_tools", tools),
        ("llm_step", main),
        ("call_tool", tools),
        ("llm_step", main),
    ]


async def test_a_servers_task_queue_splits_the_listing_and_keeps_the_agents_order(
    client: Client, tmp_path: Path
) -> None:
    main, remote = queue("main"), queue("remote")
    config = {
        "mcp": {
            "servers": {
                "remote": {
                    "command": sys.executable,
                    "args": [str(STDIO_SCRIPT)],
                    "task_queue": remote,
                }
            }
        },
        "agents": {
            "test": {
                "model": "toolnames",
                "models": ["passthrough"],
                "servers": ["remote", "where"],
                "tools": {"remote": ["echo"]},
            }
        },
    }
    settings = make_settings(tmp_path, **config)
    functions = {"where": [here]}
    plugin = TurnkeepPlugin(settings, function_tools=functions, providers=[ToolNames])
    async with (
        Worker(client, task_queue=main, plugins=[plugin]),
        build_worker(client, settings, task_queue=remote, function_tools=functions),
    ):
        listed = await (
            await start_turn(client, TurnInput(agent="test", messages=["?"]), task_queue=main)
        ).result()
        prompt = '***CALL_TOOL remote__echo {"text": "far"}\n***CALL_TOOL where__here {}'
        turn = TurnInput(agent="test", messages=[prompt], model="passthrough")
        handle = await start_turn(client, turn, task_queue=main)
        result = await handle.result()
        history = await handle.handle.fetch_history()
    assert listed.final is not None and listed.final.text == "remote__echo, where__here"
    assert result.final is not None and result.final.text == f"far\nmain worker, {main}"
    scheduled = scheduled_queues(list(history.events))
    assert sorted(scheduled[1:3]) == [("list_tools", main), ("list_tools", remote)]
    assert sorted(scheduled[4:6]) == [("call_tool", main), ("call_tool", remote)]


async def test_tool_activities_refuse_a_server_meant_for_another_queue(tmp_path: Path) -> None:
    # A crafted (or outdated) workflow scheduling a tool on a worker not meant to host it is
    # refused there, before the server is started.
    settings = make_settings(
        tmp_path,
        mcp={"servers": {"gpu": {"command": "no-such-command", "task_queue": "gpu-hosts"}}},
        agents={"test": {"servers": ["gpu"]}},
    )
    activities = ToolActivities(
        AgentCatalog.of(settings), ToolServers(settings), max_result_bytes=None
    )
    env = ActivityEnvironment()
    call = ToolCallRequest(agent="test", call_id="c1", name="gpu__render", arguments={})
    for run in (
        lambda: env.run(activities.call_tool, call),
        lambda: env.run(activities.list_tools, ToolsRequest(agent="test")),
    ):
        with pytest.raises(ApplicationError) as caught:
            await run()
        assert caught.value.type == "ToolWrongTaskQueue" and caught.value.non_retryable
    with pytest.raises(ApplicationError) as caught:
        await env.run(activities.list_tools, ToolsRequest(agent="test", servers=["other"]))
    assert caught.value.type == "ToolNotAllowed"
