"""turnkeep as a library in someone else's Temporal application (#22): ``TurnkeepPlugin`` on the
application's own worker and task queue, beside its workflows and activities, adding to its
client's payload codec, its runner and its interceptors rather than replacing them; agents,
tools and hooks declared in Python; the lazy ``turnkeep`` facade."""

from __future__ import annotations

import base64
import subprocess
import sys
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.worker import Interceptor, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from tests.app_workflow import AppWorkflow, app_activity
from tests.conftest import make_settings
from turnkeep import Agent, McpServer, StopReason, TurnInput, TurnkeepPlugin, connect
from turnkeep import start_turn as start
from turnkeep.activities.model_input import ModelInputHandoffInterceptor
from turnkeep.config.agents import declare
from turnkeep.config.settings import Settings
from turnkeep.contract.activity_io import HookContext
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.payloads.composition import inner_codec
from turnkeep.payloads.converter import TurnkeepDataConverter

APP_ENCODING = b"binary/app-base64"


class AppCodec(PayloadCodec):
    """An application's own codec: base64 under an encoding of its own, so a payload it encoded
    is recognisable in a history and its contents are not readable there."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(
                metadata={"encoding": APP_ENCODING}, data=base64.b64encode(p.SerializeToString())
            )
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        decoded = []
        for payload in payloads:
            assert payload.metadata["encoding"] == APP_ENCODING, payload.metadata
            decoded.append(Payload.FromString(base64.b64decode(payload.data)))
        return decoded


def shout(text: str) -> str:
    """Say it louder."""
    return f"{text.upper()}, LOUDLY"


HOOK_CALLS: list[str] = []


def count_turns(context: HookContext) -> None:
    HOOK_CALLS.append(f"{context.agent}:{context.hook_point}")


def helper() -> Agent:
    return Agent(
        name="helper",
        model="passthrough",
        tools=[shout],
        hooks={"after_turn_complete": [count_turns]},
    )


def app_converter() -> DataConverter:
    return DataConverter(payload_codec=AppCodec())


class AppInterceptor(Interceptor):
    """An application's worker interceptor (it intercepts nothing)."""


async def test_turns_run_beside_an_apps_workflows_on_its_queue_and_through_its_codec(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    # The application's own client: Temporal's converter, its own codec, nothing of turnkeep.
    app_client = await Client.connect(
        temporal.address, namespace=temporal.namespace, data_converter=app_converter()
    )
    settings = make_settings(tmp_path)
    queue = f"my-app-{uuid.uuid4().hex[:8]}"
    worker = Worker(
        app_client,
        task_queue=queue,
        workflows=[AppWorkflow],
        activities=[app_activity],
        plugins=[TurnkeepPlugin(settings, agents=[helper()])],
    )
    active = worker.config(active_config=True)
    # The worker's converter is turnkeep's with the application's codec kept.
    converter = worker.client.data_converter
    assert isinstance(converter, TurnkeepDataConverter)
    # The app's codec encodes every payload, under the store of sessions' conversations.
    assert isinstance(inner_codec(converter.payload_codec), AppCodec)
    assert any(isinstance(i, ModelInputHandoffInterceptor) for i in active.get("interceptors", []))
    assert active.get("sticky_queue_schedule_to_start_timeout") == timedelta(seconds=3)
    # A client that starts turns: the application's converter, with turnkeep's added.
    turn_client = await connect(
        temporal.address, temporal.namespace, settings=settings, data_converter=app_converter()
    )
    HOOK_CALLS.clear()
    async with worker:
        greeting = await app_client.execute_workflow(
            AppWorkflow.run, "ada", id=f"app-{uuid.uuid4().hex}", task_queue=queue
        )
        turn = await start(
            turn_client,
            TurnInput(agent="helper", messages=['***CALL_TOOL helper__shout {"text": "quietly"}']),
            task_queue=queue,
        )
        result = await turn.result()
    assert greeting == "hello, ada"
    assert result.stop_reason == StopReason.END_TURN
    assert result.final is not None and "QUIETLY, LOUDLY" in result.final.text
    assert HOOK_CALLS == ["helper:after_turn_complete"]

    # Every payload the turn recorded went through the application's codec: none in clear.
    history = await turn_client.get_workflow_handle(turn.workflow_id).fetch_history()
    encodings = [
        payload.metadata.get("encoding")
        for event in history.events
        for payloads in _payload_lists(event)
        for payload in payloads
    ]
    assert encodings and set(encodings) == {APP_ENCODING}, set(encodings)
    # (The raw bytes: a payload in clear would show its JSON here.)
    assert "LOUDLY" not in str(history.events)


def _payload_lists(event: Any) -> list[Sequence[Payload]]:
    """The input and result payloads of a history event that carries them."""
    found = []
    for attributes, field in (
        ("workflow_execution_started_event_attributes", "input"),
        ("activity_task_scheduled_event_attributes", "input"),
        ("activity_task_completed_event_attributes", "result"),
        ("workflow_execution_completed_event_attributes", "result"),
    ):
        if event.HasField(attributes):
            found.append(getattr(getattr(event, attributes), field).payloads)
    return found


async def test_the_plugin_adds_to_an_apps_runner_and_interceptors(
    client: Client, tmp_path: Path
) -> None:
    mine = AppInterceptor()
    runner = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules("tests.app_workflow")
    )
    worker = Worker(
        client,
        task_queue="unused",
        workflows=[AppWorkflow],
        activities=[app_activity],
        interceptors=[mine],
        workflow_runner=runner,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=7),
        plugins=[TurnkeepPlugin(make_settings(tmp_path), agents=[helper()])],
    )
    active = worker.config(active_config=True)
    interceptors = active.get("interceptors", [])
    assert mine in interceptors
    assert any(isinstance(i, ModelInputHandoffInterceptor) for i in interceptors)
    composed = active.get("workflow_runner")
    assert isinstance(composed, SandboxedWorkflowRunner)
    passthrough = composed.restrictions.passthrough_modules
    ours = {"turnkeep.contract", "turnkeep.workflows", "beartype"}
    assert {"tests.app_workflow", *ours} <= passthrough
    # Given by the application: kept.
    assert active.get("sticky_queue_schedule_to_start_timeout") == timedelta(seconds=7)
    names = {getattr(w, "__name__", None) for w in active.get("workflows", [])}
    assert {"AppWorkflow", "TurnWorkflow"} <= names
    assert client.data_converter is worker.client.data_converter  # turnkeep's own: kept


async def test_an_apps_codec_and_turnkeep_encryption_are_not_both_used(
    temporal: ServerInfo, tmp_path: Path
) -> None:
    app_client = await Client.connect(
        temporal.address, namespace=temporal.namespace, data_converter=app_converter()
    )
    key = base64.b64encode(b"k" * 32).decode()
    settings = make_settings(tmp_path, encryption={"current_key": "k", "keys": {"k": key}})
    with pytest.raises(ValueError, match="the payload codec AppCodec and the settings turn on"):
        Worker(app_client, task_queue="unused", plugins=[TurnkeepPlugin(settings)])


def test_a_python_agent_is_the_yaml_agent_it_stands_for(tmp_path: Path) -> None:
    yaml = make_settings(
        tmp_path,
        mcp={"servers": {"search": {"url": "http://127.0.0.1:9/mcp"}}},
        agents={
            "helper": {
                "model": "passthrough",
                "servers": ["search", "helper"],
                "tools": {"search": ["web_*"]},
                "max_iterations": 5,
                "overrides": ["temperature"],
                "hooks": {"after_turn_complete": ["count_turns"]},
                "tool_timeouts": {"start_to_close": 30},
            }
        },
    )
    python = declare(
        Settings(base_dir=tmp_path),
        agents=[
            Agent(
                name="helper",
                model="passthrough",
                tools=["search", shout],
                tool_filter={"search": ["web_*"]},
                max_iterations=5,
                overrides=["temperature"],
                hooks={"after_turn_complete": [count_turns]},
                tool_timeouts={"start_to_close": 30},
            )
        ],
        servers=[McpServer(name="search", url="http://127.0.0.1:9/mcp")],
    )
    assert python.settings == yaml
    assert python.function_tools == {"helper": [shout]}
    assert python.hooks == {"count_turns": count_turns}


def test_a_name_given_twice_is_refused(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, agents={"helper": {"model": "passthrough"}})
    with pytest.raises(ValueError, match="agent 'helper' is declared twice"):
        TurnkeepPlugin(settings, agents=[helper()])

    def count_turns(context: HookContext) -> None:  # another function, the same name
        del context

    other = Agent(name="other", hooks={"after_turn_complete": [count_turns]})
    with pytest.raises(ValueError, match="two different hooks are named 'count_turns'"):
        TurnkeepPlugin(agents=[helper(), other])


@pytest.mark.slow
def test_the_facade_loads_nothing_it_is_not_asked_for() -> None:
    # The workflow sandbox imports turnkeep.workflows: that must not pull in the worker's I/O.
    code = (
        "import sys, turnkeep.contract.turn_io, turnkeep\n"
        "assert turnkeep.TurnInput is turnkeep.contract.turn_io.TurnInput\n"
        "loaded = [m for m in ('turnkeep.worker.plugin', 'fastmcp', 'anthropic', 'openai')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "assert sorted(turnkeep.__all__) == turnkeep.__all__\n"
        "for name in turnkeep.__all__: getattr(turnkeep, name)\n"
        "assert 'turnkeep.worker.plugin' in sys.modules\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
