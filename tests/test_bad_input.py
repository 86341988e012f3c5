"""Bad input gets a clear error quickly, and nothing is left stuck (issue: foundation §4)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from tests.conftest import HarnessFactory
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

pytestmark = pytest.mark.asyncio


def failure(err: WorkflowFailureError) -> ApplicationError:
    cause = err.cause
    while cause.cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.cause
    assert isinstance(cause, ApplicationError)
    return cause


async def fails_with(h: object, **turn: object) -> ApplicationError:
    with pytest.raises(WorkflowFailureError) as caught:
        await h.run("hi", **turn)  # type: ignore[attr-defined]
    return failure(caught.value)


async def test_unknown_agent(harness: HarnessFactory) -> None:
    async with harness(agents={"alpha": {}, "beta": {}}) as h:
        error = await fails_with(h, agent="gamma")
    assert error.type == "UnknownAgent"
    assert "Unknown agent 'gamma'" in error.message and "alpha, beta" in error.message


async def test_unknown_model(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"model": "gpt-nonsense"}}) as h:
        error = await fails_with(h)
    assert error.type == "UnknownModel" and "gpt-nonsense" in error.message


async def test_model_override_the_agent_does_not_allow(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"model": "passthrough", "models": ["sonnet"]}}) as h:
        error = await fails_with(h, model="opus")
    assert error.type == "ModelNotAllowed"
    assert "'opus'" in error.message and "passthrough, sonnet" in error.message


async def test_other_override_the_agent_does_not_allow(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"max_iterations": 20, "overrides": ["temperature"]}}) as h:
        error = await fails_with(h, max_iterations=21)
    assert error.type == "OverrideNotAllowed" and "max_iterations" in error.message
    assert "list: temperature" in error.message and "max_iterations above 20" in error.message


async def test_mcp_server_that_fails_to_start(harness: HarnessFactory, tmp_path: Path) -> None:
    config = {
        "mcp": {"servers": {"broken": {"command": str(tmp_path / "no-such-binary")}}},
        "agents": {"test": {"model": "passthrough", "servers": ["broken"]}},
    }
    async with harness(**config) as h:
        error = await fails_with(h)
    assert error.type == "ServerUnavailable" and "'broken'" in error.message


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"agent": "test"}, "messages"),
        ({"agent": "test", "messages": "not a list"}, "messages"),
        # A turn can't smuggle in a server, command or URL: unknown keys are refused.
        (
            {"agent": "test", "messages": ["hi"], "mcp": {"servers": {"x": {"command": "sh"}}}},
            "mcp",
        ),
        ({"agent": "test", "messages": ["hi"], "max_iterations": -1}, "max_iterations"),
        # The history is checked after prepare_turn, with the same message.
        ({"agent": "test", "messages": ["hi"], "history": "not a list"}, "history"),
        ({"agent": "test", "messages": ["hi"], "history": [{"role": "robot"}]}, "history.0"),
    ],
)
async def test_malformed_input_from_a_plain_client(
    harness: HarnessFactory, client: Client, payload: dict[str, object], expected: str
) -> None:
    async with harness(agents={"test": {"model": "passthrough"}}) as h:
        handle = await client.start_workflow(
            WORKFLOW_NAME, payload, id=f"bad-{uuid.uuid4().hex[:8]}", task_queue=h.task_queue
        )
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
    message = str(caught.value.cause)
    assert "validation error for TurnInput" in message and expected in message


async def test_plain_client_with_json_input_runs_a_turn(
    harness: HarnessFactory, client: Client
) -> None:
    async with harness(agents={"test": {"model": "passthrough"}}) as h:
        handle = await client.start_workflow(
            WORKFLOW_NAME,
            {"agent": "test", "messages": ["plain json"]},
            id=f"plain-{uuid.uuid4().hex[:8]}",
            task_queue=h.task_queue,
        )
        result = await handle.result()
    assert result["final"]["content"][0]["text"] == "plain json"
    assert result["stop_reason"] == "endTurn"
