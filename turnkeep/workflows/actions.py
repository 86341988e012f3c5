"""The loop's *actions* as seen from workflow code: each one schedules activities by name and turns
their failures into what the loop expects (the documentation's *The turn loop*): a failed model
call becomes an assistant ``error`` message, a failed tool call an isError result. Nothing here
decides when to call what; that is ``turnkeep.workflows.loop``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeVar

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    CancelledError,
    FailureError,
)
from temporalio.exceptions import (
    TimeoutError as ActivityTimeout,
)

from turnkeep.contract.activity_io import (
    CALL_TOOL,
    COMPACT_HISTORY,
    LIST_TOOLS,
    LLM_STEP,
    PREPARE_TURN,
    RUN_HOOK,
    TOOL_SEPARATOR,
    AgentTool,
    CompactRequest,
    HookChange,
    HookContext,
    HookRequest,
    PrepareTurnRequest,
    Timeouts,
    ToolCallOutcome,
    ToolCallRequest,
    ToolCatalog,
    ToolSpec,
    ToolsRequest,
    TurnPlan,
)
from turnkeep.contract.approval import (
    APPROVAL_POLICY,
    PolicyRequest,
    PolicyVerdicts,
    failed_policy,
)
from turnkeep.contract.limits_io import RATE_LIMITED
from turnkeep.contract.messages import (
    CallToolResult,
    Message,
    StopReason,
    TextContent,
    estimate_chars,
)
from turnkeep.contract.model_io import LlmRequest, LlmStepRequest, MessageJson
from turnkeep.contract.turn_io import TurnInput
from turnkeep.workflows import task_priority, visibility
from turnkeep.workflows.limits.capacity import Capacity
from turnkeep.workflows.tool_batch import ToolBatch

T = TypeVar("T")

# Preparing a turn only reads configuration; a few attempts cover a worker dying mid-way,
# while configuration errors are non-retryable anyway.
SETUP = Timeouts(start_to_close=120.0, heartbeat=15.0, max_attempts=3)
# Hooks are the worker owner's own code: quick, and retried a little in case of I/O hiccups.
_HOOK = Timeouts(start_to_close=60.0, heartbeat=None, max_attempts=3)
# A policy decides while the model's tool calls wait: quick, and retried a little.
_POLICY = Timeouts(start_to_close=30.0, heartbeat=None, max_attempts=3)


async def execute(
    name: str,
    arg: BaseModel,
    result_type: type[T],
    summary: str,
    t: Timeouts,
    task_queue: str | None = None,
    *,
    non_retryable: Sequence[str] = (),
) -> T:
    """Schedule one of the turn's activities by name, with ``t``'s timeouts and retry policy,
    on ``task_queue`` (None: the turn's own), at the workflow's task priority, and await its
    result. Failures of the types in ``non_retryable`` come back at once, whatever the
    activity says."""
    return await _outcome(
        workflow.execute_activity(
            name,
            arg,
            result_type=result_type,
            task_queue=task_queue,
            summary=summary,
            start_to_close_timeout=timedelta(seconds=t.start_to_close),
            heartbeat_timeout=timedelta(seconds=t.heartbeat) if t.heartbeat else None,
            retry_policy=_retry_policy(t, non_retryable),
            priority=task_priority.current(),
        )
    )


async def _outcome(activity: Awaitable[T]) -> T:
    try:
        return await activity
    except ActivityError as err:
        # A cancelled activity surfaces as an ActivityError; the loop must see a cancellation
        # (and repair the conversation), not a failure to report to the model.
        if isinstance(err.cause, CancelledError):
            raise asyncio.CancelledError() from err
        raise
    except CancelledError as err:  # a local activity's, unwrapped
        raise asyncio.CancelledError() from err


def _retry_policy(t: Timeouts, non_retryable: Sequence[str] = ()) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=t.initial_interval),
        backoff_coefficient=t.backoff,
        maximum_interval=timedelta(seconds=t.max_interval),
        maximum_attempts=t.max_attempts,
        non_retryable_error_types=list(non_retryable) or None,
    )


def failure_text(err: ActivityError) -> str:
    """What went wrong, in the activity's own words: the failure under the activity wrapper
    (its own causes are detail a user doesn't need, and may be host-specific)."""
    cause = err.cause or err
    kind = cause.type if isinstance(cause, ApplicationError) and cause.type else None
    message = cause.message if isinstance(cause, FailureError) else str(cause)
    return f"{kind}: {message}" if kind else message


async def prepare_turn(turn: TurnInput, *, local: bool = False) -> TurnPlan:
    """The turn's plan from the worker's ``prepare_turn``; with ``local``, run as a local
    activity, in the workflow task that asks for it (``local_setup``)."""
    request = PrepareTurnRequest(
        agent=turn.agent,
        overrides=turn.overrides(),
        depth=turn.depth,
        budget=turn.budget,
        priority=turn.priority,
        tenant=turn.tenant,
    )
    summary = visibility.prepare_summary(turn.agent)
    if local:
        return await execute_local(PREPARE_TURN, request, TurnPlan, summary, SETUP)
    return await execute(PREPARE_TURN, request, TurnPlan, summary, SETUP)


async def execute_local(
    name: str, arg: BaseModel, result_type: type[T], summary: str, t: Timeouts
) -> T:
    """``execute`` as a local activity: run by the worker running the workflow task, within
    it, its result recorded in a marker. Only for short steps that are safe to run again, as
    a worker that dies mid-way leaves the task to time out and another worker runs it anew.
    ``t``'s heartbeat does not apply (a local activity has none). A failure is raised as the
    activity raised it (an ``ApplicationError``), not wrapped in an ``ActivityError``."""
    return await _outcome(
        workflow.execute_local_activity(
            name,
            arg,
            result_type=result_type,
            summary=summary,
            start_to_close_timeout=timedelta(seconds=t.start_to_close),
            retry_policy=_retry_policy(t),
        )
    )


async def list_tools(plan: TurnPlan) -> list[ToolSpec]:
    """The tools the turn offers the model: its servers' tools, then, as fast-agent adds them,
    its agent tools (those whose names no server tool has taken), then its client-side tools
    (from the plan: no server lists them)."""
    listed = await _server_tools(plan)
    taken = {tool.name for tool in listed}
    tools = [*listed, *(a.spec for a in plan.agent_tools if a.spec.name not in taken)]
    if plan.client_tools is not None:
        tools += [t.spec for t in plan.client_tools.tools]
    return tools


async def _server_tools(plan: TurnPlan) -> list[ToolSpec]:
    if not plan.has_tools:
        return []
    if not plan.tool_task_queues:
        return (await _list_tools(ToolsRequest(agent=plan.agent), plan, None)).tools
    # Each task queue lists its own servers, at once; the tools keep the agent's server order.
    servers: dict[str | None, list[str]] = {}
    for server, queue in plan.tool_task_queues.items():
        servers.setdefault(queue, []).append(server)
    catalogs = await asyncio.gather(
        *(
            _list_tools(ToolsRequest(agent=plan.agent, servers=names), plan, queue)
            for queue, names in servers.items()
        )
    )
    by_server: dict[str, list[ToolSpec]] = {}
    for tool in (tool for catalog in catalogs for tool in catalog.tools):
        by_server.setdefault(tool.name.partition(TOOL_SEPARATOR)[0], []).append(tool)
    return [tool for server in plan.tool_task_queues for tool in by_server.get(server, [])]


async def _list_tools(request: ToolsRequest, plan: TurnPlan, queue: str | None) -> ToolCatalog:
    # A tool server that is briefly down (an HTTP server restarting) is retried as a tool call
    # would be; one that cannot start fails at once (non-retryable).
    summary = visibility.LIST_TOOLS_SUMMARY
    return await execute(LIST_TOOLS, request, ToolCatalog, summary, plan.tools, queue)


async def call_model(
    request: LlmRequest,
    plan: TurnPlan,
    messages: MessageJson,
    capacity: Capacity | None = None,
    show: Callable[[str], None] | None = None,
    inline: str | None = None,
) -> Message:
    """One model call. The workflow must answer ``MODEL_INPUT_QUERY`` with ``request`` while
    this runs: the activity reads the request from there (see ``LlmStepRequest``).
    ``messages`` is the turn's, kept from call to call. A model with a limit (``plan.limits``)
    waits for its capacity first (``capacity``; ``show`` tells the turn's details why).
    ``inline``: the agent call whose inline loop (``inline_agent``) makes this call, under
    which the workflow holds the request; its summary names the called agent."""
    info = workflow.info()
    step = LlmStepRequest.referencing(
        request, workflow_id=info.workflow_id, run_id=info.run_id, messages=messages, inline=inline
    )
    try:
        summary = visibility.llm_summary(request.call_index, request.model)
        if inline is not None:
            summary = visibility.clip(f"{request.agent} · {summary}")
        return await _llm_step(step, request, summary, plan.llm, plan, messages, capacity, show)
    except ActivityError as err:
        return _failed_call(err)


async def _llm_step(
    step: LlmStepRequest,
    request: LlmRequest,
    summary: str,
    t: Timeouts,
    plan: TurnPlan,
    messages: MessageJson,
    capacity: Capacity | None,
    show: Callable[[str], None] | None,
) -> Message:
    """``llm_step`` on ``request``'s model, within its limit if it has one."""
    limit = plan.limits.get(request.model)
    if limit is None or capacity is None:
        return await execute(LLM_STEP, step, Message, summary, t)
    # The instruction and tool definitions are sent with every call and counted by the
    # provider: the estimate includes them, from the request's JSON already built.
    tokens = messages.estimate_tokens(request.messages) + step.header_chars() // 4
    resume = None if show is None else (lambda: show(visibility.waiting_on_model(request)))
    call = _LimitedCall(limit, tokens, request.max_tokens or plan.max_tokens, show, resume)
    return await call.run(LLM_STEP, step, summary, t, plan, capacity)


class _LimitedCall:
    """A model call (``llm_step`` or ``compact_history``) within its limit: ask, wait, call,
    settle. A 429 or 529 is not retried within the activity: the limiter is told its
    ``retry-after`` (which holds every worker's calls of the limit) and the turn asks again,
    each such answer counting as one of ``t``'s attempts."""

    def __init__(
        self,
        limit: str,
        input_tokens: int,
        max_output_tokens: int | None,
        show: Callable[[str], None] | None,
        resume: Callable[[], None] | None,
    ) -> None:
        self.limit, self.input_tokens, self.max_output_tokens = (
            limit,
            input_tokens,
            max_output_tokens,
        )
        self.show, self.resume = show, resume

    async def run(
        self,
        name: str,
        arg: BaseModel,
        summary: str,
        t: Timeouts,
        plan: TurnPlan,
        capacity: Capacity,
    ) -> Message:
        attempts = 0
        while True:
            attempts += 1
            ticket = await capacity.acquire(
                self.limit,
                plan,
                input_tokens=self.input_tokens,
                max_output_tokens=self.max_output_tokens,
                t=t,
                show=self.show,
            )
            if self.resume is not None:
                self.resume()
            try:
                answer = await execute(name, arg, Message, summary, t, non_retryable=RATE_LIMITED)
            except ActivityError as err:
                wait = _rate_limited(err, t, attempts)
                capacity.settle(self.limit, ticket, None, wait)
                if wait is None or (t.max_attempts and attempts >= t.max_attempts):
                    raise
                # The limiter has the backoff before the turn asks again (a local activity
                # runs before the workflow task's commands, the settle among them, are sent).
                await capacity.settled()
                continue
            except asyncio.CancelledError:
                capacity.settle(self.limit, ticket, None, None)
                raise
            capacity.settle(self.limit, ticket, answer, None)
            return answer


def _rate_limited(err: ActivityError, t: Timeouts, attempts: int) -> float | None:
    """How long the limit holds after a call failed with ``err``: the provider's
    ``retry-after`` when it answered 429/529 (else the retry policy's interval for this
    attempt); None when it failed otherwise."""
    cause = err.cause
    if not isinstance(cause, ApplicationError) or cause.type not in RATE_LIMITED:
        return None
    if cause.next_retry_delay is not None:
        return cause.next_retry_delay.total_seconds()
    return min(t.max_interval, t.initial_interval * t.backoff ** (attempts - 1))


def _failed_call(err: ActivityError) -> Message:
    text = failure_text(err)
    return Message(
        role="assistant",
        content=[TextContent(text=f"The model call failed: {text}")],
        channels={"error": [TextContent(text=text)]},
        stop_reason=StopReason.ERROR,
    )


# Failures turnkeep's providers give a call the provider ended (``turnkeep.providers.errors``)
# besides those whose type starts with "Provider": another model may well answer these. A
# refusal of turnkeep's own (a model the agent does not allow, a request that no longer
# matches) would be refused for any model, and is not one.
_PROVIDER_FAILURES = frozenset({"ContextLengthExceeded", "MissingApiKey"})


def falls_back(err: ActivityError) -> bool:
    """Whether a model call that failed for good with ``err`` goes to the next model of a
    fallback chain: a provider's final error, or its rate limits, overloads and time-outs past
    the attempts the chain gives it."""
    cause = err.cause
    if isinstance(cause, ActivityTimeout):
        return True
    return isinstance(cause, ApplicationError) and bool(
        cause.type and (cause.type.startswith("Provider") or cause.type in _PROVIDER_FAILURES)
    )


async def call_model_chain(
    request: LlmRequest,
    plan: TurnPlan,
    messages: MessageJson,
    on_request: Callable[[LlmRequest], None],
    capacity: Capacity | None = None,
    show: Callable[[str], None] | None = None,
) -> tuple[Message, LlmRequest]:
    """``call_model`` along the plan's fallback chain: ``request`` on its model with at most
    ``fallback_after_attempts`` attempts, then the same request on each fallback model in turn
    (the last with all of the agent's attempts), until one answers or fails otherwise than a
    provider's final error. ``on_request`` is told each request before it is made (the workflow
    answers ``MODEL_INPUT_QUERY`` with it). Returns the answer and the request it answered."""
    chain = [request.model, *plan.fallback_models]
    bound = plan.fallback_after_attempts
    for position, model in enumerate(chain):
        last = position == len(chain) - 1
        attempts = plan.llm.max_attempts
        if not last:  # 0 is Temporal's "no limit"
            attempts = bound if attempts == 0 else min(attempts, bound)
        asked = request if position == 0 else request.model_copy(update={"model": model})
        on_request(asked)
        info = workflow.info()
        step = LlmStepRequest.referencing(
            asked, workflow_id=info.workflow_id, run_id=info.run_id, messages=messages
        )
        summary = visibility.llm_summary(asked.call_index, asked.model)
        t = plan.llm.model_copy(update={"max_attempts": attempts})
        try:
            return await _llm_step(step, asked, summary, t, plan, messages, capacity, show), asked
        except ActivityError as err:
            if last or not falls_back(err):
                return _failed_call(err), asked
            workflow.logger.warning(
                "model %s failed (%s); model call #%d goes to %s",
                model,
                failure_text(err),
                asked.call_index,
                chain[position + 1],
            )
    raise AssertionError("a fallback chain has at least one model")


# Waits for a person's decision on a call: the call to run (edited or not), or the result a
# denial answers it with.
Approver = Callable[[ToolCallRequest], Awaitable[ToolCallRequest | CallToolResult]]
# Runs a call of one of the turn's agent tools (``turnkeep.workflows.agent_tools``).
AgentCaller = Callable[[ToolCallRequest, AgentTool], Awaitable[ToolCallOutcome]]
# Settles what a call's server asked during a run (``ToolCallOutcome.needs_input``, and the
# requests the run declined): the call to run again with the answer, the result to end it
# with, or None when the outcome stands.
ServerAnswerer = Callable[
    [ToolCallRequest, ToolCallOutcome], Awaitable[ToolCallRequest | CallToolResult | None]
]
# Waits for a client to submit a client-side call's result (or for its denial).
ClientWaiter = Callable[[ToolCallRequest], Awaitable[CallToolResult]]


async def run_tools(
    batch: ToolBatch,
    plan: TurnPlan,
    completed: dict[str, CallToolResult],
    approve: Approver,
    call_agent: AgentCaller,
    on_result: Callable[[], None] | None = None,
    answer_server: ServerAnswerer | None = None,
    client_result: ClientWaiter | None = None,
    inline: bool = False,
) -> tuple[dict[str, CallToolResult], dict[str, float]]:
    """Run a batch; ``completed`` fills in as calls finish (``on_result`` is called after
    each), so a cancellation keeps them. Gated calls wait for ``approve`` alongside the
    others, then run (or are answered) on their own, whatever ``parallel_tool_calls`` says:
    one person's wait must not hold up the rest. Calls of agent tools go to ``call_agent``;
    client-side calls wait for ``client_result`` alongside the others, and run nothing.
    ``inline``: the batch of an agent called inline (``inline_agent``), whose summaries name
    it."""
    timing: dict[str, float] = {}
    completed.update(batch.answered)
    for call_id in batch.answered:
        timing[call_id] = 0.0

    async def run_one(call: ToolCallRequest) -> None:
        started = workflow.time()
        try:
            agent = plan.agent_tool(call.name)
            if agent is not None:
                outcome = await call_agent(call, agent)
            else:
                summary, queue = visibility.tool_summary(call), plan.tool_task_queue(call.name)
                if inline:
                    summary = visibility.clip(f"{call.agent} · {summary}")
                t = plan.tools
                outcome = await execute(CALL_TOOL, call, ToolCallOutcome, summary, t, queue)
                # A call whose server asked something runs again once it is answered.
                while answer_server is not None and (outcome.needs_input or outcome.declined):
                    again = await answer_server(call, outcome)
                    if isinstance(again, CallToolResult):
                        outcome = ToolCallOutcome(result=again, duration_ms=outcome.duration_ms)
                    if not isinstance(again, ToolCallRequest):
                        break
                    call = again
                    outcome = await execute(CALL_TOOL, call, ToolCallOutcome, summary, t, queue)
            completed[call.call_id] = outcome.result
            timing[call.call_id] = outcome.duration_ms
        except ActivityError as err:
            completed[call.call_id] = CallToolResult.error(f"Error: {failure_text(err)}")
            timing[call.call_id] = (workflow.time() - started) * 1000
        if on_result is not None:
            on_result()

    async def run_approved(call: ToolCallRequest) -> None:
        decided = await approve(call)
        if isinstance(decided, CallToolResult):
            completed[call.call_id] = decided
            timing[call.call_id] = 0.0
            if on_result is not None:
                on_result()
        else:
            await run_one(decided)

    async def run_ungated() -> None:
        if plan.parallel_tool_calls and len(batch.to_run) > 1:
            await asyncio.gather(*(run_one(call) for call in batch.to_run))
        else:
            for call in batch.to_run:
                await run_one(call)

    async def run_on_client(call: ToolCallRequest) -> None:
        assert client_result is not None, "a batch with client-side calls needs a waiter"
        started = workflow.time()
        completed[call.call_id] = await client_result(call)
        timing[call.call_id] = (workflow.time() - started) * 1000
        if on_result is not None:
            on_result()

    async def run_all() -> None:
        if not batch.gated and not batch.client:
            await run_ungated()
            return
        await asyncio.gather(
            run_ungated(),
            *(run_approved(call) for call in batch.gated),
            *(run_on_client(call) for call in batch.client),
        )

    # Shielded so that cancelling the turn cannot reach an activity whose result arrived in
    # the same workflow task as the cancel: the SDK would turn that result into a
    # CancelledError, and a tool that really ran would be reported as interrupted.
    work = asyncio.ensure_future(run_all())
    try:
        await asyncio.shield(work)
    except asyncio.CancelledError:
        # A condition is checked only once every ready task has run: by then results that
        # came with the cancel are in `completed`, and only calls still running get cancelled.
        await workflow.wait_condition(lambda: True)
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise
    return dict(completed), timing


async def run_hook(hook: str, context: HookContext) -> HookChange:
    """Raises ``ActivityError`` if the hook fails; what that means depends on the hook point."""
    request = HookRequest(hook=hook, context=context)
    summary = visibility.hook_summary(context.hook_point, hook)
    return await execute(RUN_HOOK, request, HookChange, summary, _HOOK)


async def approval_policy(request: PolicyRequest) -> PolicyVerdicts:
    """The policy's decisions on a batch's held calls; a policy that fails on every attempt
    denies them all (never allows)."""
    summary = visibility.clip(f"approval policy {request.policy} · {len(request.calls)} call(s)")
    try:
        return await execute(APPROVAL_POLICY, request, PolicyVerdicts, summary, _POLICY)
    except ActivityError as err:
        workflow.logger.warning("approval policy %r failed: %s", request.policy, failure_text(err))
        return failed_policy(request)


async def compact_history(
    messages: list[Message], plan: TurnPlan, capacity: Capacity | None = None
) -> str:
    """A summary of ``messages`` by the agent's model, within its limit if it has one;
    raises ``ActivityError`` on failure."""
    request = CompactRequest(agent=plan.agent, model=plan.model, messages=messages)
    what = visibility.COMPACT_SUMMARY
    limit = plan.limits.get(plan.model)
    if limit is None or capacity is None:
        return (await execute(COMPACT_HISTORY, request, Message, what, plan.llm)).text
    tokens = sum(estimate_chars(m) for m in messages) // 4
    call = _LimitedCall(limit, tokens, plan.max_tokens, None, None)
    return (await call.run(COMPACT_HISTORY, request, what, plan.llm, plan, capacity)).text


# Longer than the tools of one answer take, as a rule; if one fires all the same, nothing waits
# on it. Not longer: a server keeps the timer's task in its queue until then, cancelled or not.
OUTCOME_TIMER = timedelta(days=1)


def outcome_timer(summary: str) -> asyncio.Task[None]:
    """Record ``summary`` in the history as the summary of a timer that nobody waits for, which
    the Web UI shows like an activity's: its TimerStarted event goes out with the workflow
    task's other commands, so it costs no activation of its own (a local activity's marker
    would). Cancel the task once the server has the timer (a timer cancelled in the workflow
    task that started it is never sent, and its summary would be lost)."""
    return asyncio.ensure_future(workflow.sleep(OUTCOME_TIMER, summary=visibility.clip(summary)))
