"""Every activity re-checks its request against the worker's config (issue #21): none runs on
its own (standalone activity execution), and a workflow of someone's own that schedules them
with crafted requests gets only what the config lets the agent it names do. A turn may set
what widens nothing (temperature, structured output...) and keep within its agent's bounds
(lower limits); going past a bound needs the agent to list it in `overrides` (issue #36)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

from tests.conftest import Harness, HarnessFactory, make_settings, turn_setup
from tests.crafted_workflow import CraftedWorkflow
from turnkeep.config.settings import ALL_OVERRIDES, BOUNDED_OVERRIDES, FREE_OVERRIDES
from turnkeep.contract.activity_io import (
    CALL_TOOL,
    COMPACT_HISTORY,
    LIST_TOOLS,
    LLM_STEP,
    PREPARE_TURN,
    RUN_HOOK,
    HookContext,
    HookPoint,
    PrepareTurnRequest,
)
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.model_io import LlmRequest, model_input_page, request_digest
from turnkeep.contract.turn_io import TurnOverrides
from turnkeep.providers.openai import OpenAIProvider
from turnkeep.testing.fake_api import FakeModelApi, Reply

MODEL = "anthropic.test-model"
ran: list[str] = []  # tool and hook executions


def allowed() -> str:
    """A tool the agent may call."""
    ran.append("allowed")
    return "ok"


def audit(context: HookContext) -> None:
    ran.append(f"audit {context.hook_point}")


def wipe(context: HookContext) -> None:
    ran.append("wipe")  # registered on the worker, enabled for no agent


def config(fake: FakeModelApi) -> dict[str, Any]:
    return {
        "anthropic": {"api_key": "sk-test", "base_url": fake.base_url_anthropic},
        "agents": {
            "test": {
                "model": MODEL,
                "models": ["anthropic.second-model"],
                "servers": ["local"],
                "max_tokens": 500,
                "hooks": {"before_llm_call": ["audit"]},
            }
        },
    }


@pytest.fixture
async def h(harness: HarnessFactory, fake: FakeModelApi) -> AsyncIterator[Harness]:
    ran.clear()
    tools = {"local": [allowed]}
    async with harness(tools, {"audit": audit, "wipe": wipe}, **config(fake)) as h:
        yield h


def hook_request(hook: str, point: HookPoint, agent: str = "test") -> dict[str, Any]:
    context = HookContext(
        hook_point=point,
        agent=agent,
        model=MODEL,
        iteration=0,
        messages=[],
        last_message=None,
        usage={},
    )
    return {"hook": hook, "context": context.model_dump(mode="json")}


def llm_request(max_tokens: int | None, model: str = MODEL) -> LlmRequest:
    return LlmRequest(
        agent="test",
        model=model,
        call_index=1,
        instruction=None,
        messages=[Message.user("Write me a novel.")],
        tools=[],
        max_tokens=max_tokens,
    )


def llm_step(request: LlmRequest) -> dict[str, Any]:
    """A step referencing ``request`` (the crafted workflow fills in its own ids)."""
    return {
        "agent": request.agent,
        "model": request.model,
        "call_index": request.call_index,
        "digest": request_digest(request),
    }


HI = [Message.user("hi").model_dump(mode="json")]
VALID_REQUESTS: dict[str, dict[str, Any]] = {
    PREPARE_TURN: {"agent": "test", "overrides": {}},
    LIST_TOOLS: {"agent": "test"},
    CALL_TOOL: {"agent": "test", "call_id": "c1", "name": "local__allowed", "arguments": {}},
    LLM_STEP: {**llm_step(llm_request(500)), "workflow_id": "w", "run_id": "r"},
    COMPACT_HISTORY: {"agent": "test", "model": MODEL, "messages": HI},
    RUN_HOOK: hook_request("audit", HookPoint.BEFORE_LLM_CALL),
}


def application_error(err: BaseException) -> ApplicationError:
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.__cause__ or getattr(cause, "cause", None)
    assert isinstance(cause, ApplicationError), err
    return cause


# --- standalone activity execution --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VALID_REQUESTS))
async def test_no_activity_runs_on_its_own(
    name: str, h: Harness, client: Client, fake: FakeModelApi
) -> None:
    fake.script(Reply.text("a novel"), api="anthropic")
    with pytest.raises(Exception) as caught:
        await client.execute_activity(
            name,
            VALID_REQUESTS[name],
            id=f"standalone-{uuid.uuid4().hex[:8]}",
            task_queue=h.task_queue,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
    error = application_error(caught.value)
    assert error.type == "NotInWorkflow" and error.non_retryable
    assert repr(name) in error.message
    assert fake.requests == [] and ran == []


# --- a workflow of one's own scheduling crafted requests ----------------------------------


@pytest.fixture
async def crafted_queue(client: Client) -> AsyncIterator[str]:
    queue = f"crafted-{uuid.uuid4().hex[:10]}"
    async with Worker(client, task_queue=queue, workflows=[CraftedWorkflow]):
        yield queue


async def crafted(
    h: Harness,
    queue: str,
    activity: str,
    request: dict[str, Any],
    model_input: LlmRequest | None = None,
) -> Any:
    page = model_input_page(model_input, 0).model_dump(mode="json") if model_input else None
    return await h.client.execute_workflow(
        CraftedWorkflow.run,
        args=[activity, h.task_queue, request, page],
        id=f"crafted-{uuid.uuid4().hex[:8]}",
        task_queue=queue,
    )


async def refused(h: Harness, queue: str, activity: str, request: dict[str, Any], **kw: Any) -> Any:
    with pytest.raises(WorkflowFailureError) as caught:
        await crafted(h, queue, activity, request, **kw)
    error = application_error(caught.value)
    assert error.non_retryable
    return error


async def test_llm_step_runs_only_the_agents_models(
    h: Harness, crafted_queue: str, fake: FakeModelApi
) -> None:
    request = llm_request(500, model="opus")
    error = await refused(h, crafted_queue, LLM_STEP, llm_step(request), model_input=request)
    assert error.type == "ModelNotAllowed"
    assert "'test'" in error.message and "'opus'" in error.message
    assert "anthropic.second-model, anthropic.test-model" in error.message
    assert "sk-test" not in error.message
    assert fake.requests == []


async def test_llm_step_holds_a_call_to_the_agents_limits(
    h: Harness, crafted_queue: str, fake: FakeModelApi
) -> None:
    for max_tokens in (100_000, None):  # above the agent's 500; none at all: the provider's
        request = llm_request(max_tokens)
        error = await refused(h, crafted_queue, LLM_STEP, llm_step(request), model_input=request)
        assert error.type == "OverrideNotAllowed" and "max_tokens" in error.message
    assert fake.requests == []

    # The same crafted call within the agent's limits does reach the model: the query path
    # works, so the refusals above were the checks.
    fake.script(Reply.text("Once upon a time."), api="anthropic")
    request = llm_request(500)
    answer = await crafted(h, crafted_queue, LLM_STEP, llm_step(request), model_input=request)
    assert Message.model_validate(answer).text == "Once upon a time."
    (sent,) = fake.requests_for("anthropic")
    assert sent.body["max_tokens"] == 500


async def test_llm_step_takes_what_widens_nothing_but_no_more_tokens(
    h: Harness, crafted_queue: str, fake: FakeModelApi
) -> None:
    """The agent lists no overrides: a crafted call may still carry a temperature, a schema and
    fewer tokens, as a turn may, but those free settings carry no raise of its limit along."""
    schema = {"type": "object", "properties": {"title": {"type": "string"}}}
    free = {"temperature": 0.7, "structured_output": schema}
    request = llm_request(100_000).model_copy(update=free)
    error = await refused(h, crafted_queue, LLM_STEP, llm_step(request), model_input=request)
    assert error.type == "OverrideNotAllowed" and "max_tokens above 500" in error.message
    assert fake.requests == []

    fake.script(Reply.text('{"title": "Once"}'), api="anthropic")
    request = llm_request(100).model_copy(update=free)
    answer = await crafted(h, crafted_queue, LLM_STEP, llm_step(request), model_input=request)
    assert Message.model_validate(answer).text == '{"title": "Once"}'
    (sent,) = fake.requests_for("anthropic")
    assert sent.body["max_tokens"] == 100 and '"title"' in sent.body["system"]


async def test_llm_step_sends_only_the_request_its_digest_names(
    h: Harness, crafted_queue: str, fake: FakeModelApi
) -> None:
    """A digest in any other form, such as the sha256 of the whole request's JSON, names no
    request: the step is refused before the model is called."""
    request = llm_request(500)
    whole = hashlib.sha256(request.model_dump_json().encode()).hexdigest()
    step = {**llm_step(request), "digest": whole}
    error = await refused(h, crafted_queue, LLM_STEP, step, model_input=request)
    assert error.type == "ModelInputMismatch"
    assert fake.requests == []


async def test_compact_history_runs_only_the_agents_models(
    h: Harness, crafted_queue: str, fake: FakeModelApi
) -> None:
    request = {"agent": "test", "model": "anthropic.claude-opus-4-1", "messages": HI}
    error = await refused(h, crafted_queue, COMPACT_HISTORY, request)
    assert error.type == "ModelNotAllowed" and "'anthropic.claude-opus-4-1'" in error.message
    error = await refused(h, crafted_queue, COMPACT_HISTORY, {**request, "agent": "nobody"})
    assert error.type == "UnknownAgent"
    assert fake.requests == []


async def test_run_hook_runs_only_hooks_the_agent_enables_there(
    h: Harness, crafted_queue: str
) -> None:
    # Registered on the worker, but enabled for no agent.
    error = await refused(
        h, crafted_queue, RUN_HOOK, hook_request("wipe", HookPoint.AFTER_TURN_COMPLETE)
    )
    assert error.type == "HookNotEnabled" and "'wipe'" in error.message
    # Enabled, but at another hook point.
    error = await refused(
        h, crafted_queue, RUN_HOOK, hook_request("audit", HookPoint.AFTER_TOOL_CALL)
    )
    assert error.type == "HookNotEnabled"
    assert "after_tool_call" in error.message and "enables there: none" in error.message
    assert ran == []

    await crafted(h, crafted_queue, RUN_HOOK, hook_request("audit", HookPoint.BEFORE_LLM_CALL))
    assert ran == ["audit before_llm_call"]


# --- overrides: what widens nothing is free, bounds are kept unless listed ------------------


def plan(tmp_path: Path, agent: dict[str, Any], **overrides: Any) -> Any:
    settings = make_settings(tmp_path, agents={"a": agent})
    request = PrepareTurnRequest(agent="a", overrides=TurnOverrides(**overrides))
    return turn_setup(settings).plan(request)


def refusal(tmp_path: Path, agent: dict[str, Any], **overrides: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        plan(tmp_path, agent, **overrides)
    assert caught.value.non_retryable
    return caught.value


def test_every_override_is_either_free_or_bounded() -> None:
    assert FREE_OVERRIDES | BOUNDED_OVERRIDES == ALL_OVERRIDES
    assert not FREE_OVERRIDES & BOUNDED_OVERRIDES


@pytest.mark.parametrize(
    "override",
    [
        {"temperature": 0.2},
        {"use_history": False},
        {"structured_output": {"type": "object"}},
        {"parallel_tool_calls": False},
    ],
)
def test_overrides_that_widen_nothing_need_no_listing(
    tmp_path: Path, override: dict[str, Any]
) -> None:
    ((name, value),) = override.items()
    assert getattr(plan(tmp_path, {"model": "passthrough"}, **override), name) == value


# The agent's bound, a value past it and one within it, per bounded override.
BOUNDS: dict[str, tuple[Any, Any, Any]] = {
    "max_iterations": (20, 21, 3),
    "max_tokens": (1000, 1001, 200),
    "parallel_tool_calls": (False, True, False),
}


@pytest.mark.parametrize("name", sorted(BOUNDED_OVERRIDES))
def test_a_turn_keeps_within_its_agents_bounds_unless_the_agent_lists_them(
    tmp_path: Path, name: str
) -> None:
    bound, past, within = BOUNDS[name]
    agent = {"model": "passthrough", name: bound}
    assert getattr(plan(tmp_path, agent, **{name: within}), name) == within
    assert getattr(plan(tmp_path, agent, **{name: bound}), name) == bound
    error = refusal(tmp_path, agent, **{name: past})
    assert error.type == "OverrideNotAllowed" and name in error.message
    assert "list: none" in error.message
    # Listed, a bound may be exceeded.
    assert getattr(plan(tmp_path, {**agent, "overrides": [name]}, **{name: past}), name) == past


def test_a_refusal_names_each_bound_a_turn_went_past(tmp_path: Path) -> None:
    agent = {"model": "passthrough", "max_iterations": 20, "max_tokens": 1000}
    agent |= {"parallel_tool_calls": False, "overrides": ["temperature"]}
    past = {"max_iterations": 10**9, "max_tokens": 1001, "parallel_tool_calls": True}
    error = refusal(tmp_path, agent, **past)
    assert error.message == (
        "Agent 'a' does not let a turn set max_iterations above 20, max_tokens above 1000, "
        "parallel_tool_calls on (a turn may lower a limit and turn parallel_tool_calls off; the "
        "agent's `overrides`, which let it go further, list: temperature)."
    )


def test_max_tokens_without_an_agent_limit_is_bounded_by_the_providers_default(
    tmp_path: Path,
) -> None:
    # Anthropic requires max_tokens and is sent 4096 when nothing sets it: lower only.
    assert plan(tmp_path, {"model": MODEL}, max_tokens=4096).max_tokens == 4096
    assert refusal(tmp_path, {"model": MODEL}, max_tokens=4097).type == "OverrideNotAllowed"
    # OpenAI-compatible APIs and offline models get no limit at all: any value is lower.
    for model in ("openai.gpt-test", "passthrough"):
        assert plan(tmp_path, {"model": model}, max_tokens=1_000_000).max_tokens == 1_000_000


async def test_a_turn_above_its_agents_limit_fails(harness: HarnessFactory) -> None:
    async with harness(agents={"test": {"model": "passthrough", "max_iterations": 20}}) as h:
        with pytest.raises(WorkflowFailureError) as caught:
            await h.run("hi", max_iterations=1_000_000_000)
        error = application_error(caught.value)
        assert error.type == "OverrideNotAllowed" and "max_iterations" in error.message
        result = await h.run("hi", max_iterations=1)
        assert result.stop_reason == StopReason.END_TURN


# --- generic models only where the config names a server ----------------------------------


def test_generic_models_need_a_configured_server(tmp_path: Path) -> None:
    error = refusal(tmp_path, {"model": "generic.llama3.2"})
    assert error.type == "ModelNotConfigured" and "generic" in error.message
    with pytest.raises(ApplicationError) as caught:
        OpenAIProvider(None, generic=True)
    assert caught.value.type == "ModelNotConfigured"

    settings = make_settings(
        tmp_path,
        generic={"base_url": "http://127.0.0.1:9/v1"},
        agents={"a": {"model": "generic.llama3.2"}},
    )
    request = PrepareTurnRequest(agent="a", overrides=TurnOverrides())
    assert turn_setup(settings).plan(request).model == "generic.llama3.2"
