"""``TurnWorkflow``: one agent turn as one Temporal workflow (the documentation's *The turn
loop*, *Cancellation and repair* and *The Web UI*).

The history of this workflow *is* the checkpoint: every model call and tool call is an
activity, so a worker that dies mid-turn is replaced by another that replays to the same point
and carries on without repeating what already completed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payloads
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError

from turnkeep.contract.activity_io import (
    AgentTool,
    ContinueAsNewPlan,
    HookPoint,
    TeamPlan,
    ToolCallOutcome,
    ToolCallRequest,
    TurnPlan,
)
from turnkeep.contract.approval import (
    ALLOW_RULES_QUERY,
    CHILD_APPROVALS_SIGNAL,
    DECIDE_UPDATE,
    PENDING_QUERY,
    REVOKE_ALLOW_UPDATE,
    SESSION_RULE_REVOKED_SIGNAL,
    AllowRule,
    DecisionRecord,
    PendingCall,
)
from turnkeep.contract.limits_io import CAPACITY_GRANT_SIGNAL
from turnkeep.contract.messages import CallToolResult, Message
from turnkeep.contract.model_io import (
    MODEL_INPUT_QUERY,
    LlmRequest,
    MessageJson,
    ModelInputPage,
    model_input_page,
)
from turnkeep.contract.turn_io import WORKFLOW_NAME, TurnInput, TurnProgress, TurnResult
from turnkeep.workflows import (
    actions,
    agent_tools,
    child_approvals,
    inline_agent,
    pending_calls,
    replays,
    teams,
    turn_metrics,
    visibility,
    worker_cache,
)
from turnkeep.workflows.agent_tools import AgentCall
from turnkeep.workflows.conversation_cache import Conversation, conversations
from turnkeep.workflows.limits.capacity import Capacity
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.shared import shared
from turnkeep.workflows.starting import start_arguments
from turnkeep.workflows.task_priority import temporal_priority
from turnkeep.workflows.tool_batch import apply_rules, apply_verdicts, policy_request
from turnkeep.workflows.waits import approval, budget_raise, client_tool, server_answers, updates
from turnkeep.workflows.waits.base import ServerRequestsInFlight

# As in fast-agent: a failing after_tool_call (or after_turn_complete, once the answer stands)
# is logged and ignored; any other hook failing ends the turn with an `error` message.
_HOOKS_THAT_MAY_FAIL = (HookPoint.AFTER_TOOL_CALL, HookPoint.AFTER_TURN_COMPLETE)


# A query whose arguments fail to decode as its parameters' types is answered with pydantic's
# explanation (rather than the SDK's bare "Failed decoding arguments").
@workflow.defn(name=WORKFLOW_NAME, failure_exception_types=[ValidationError])
class TurnWorkflow:
    # Any client may start this workflow with any arguments, so they are taken as they come and
    # checked here: the SDK calls ``__init__`` and ``run`` with whatever the start carried, and
    # a wrong count (or one it cannot decode) would fail the first workflow task for ever.
    @workflow.init
    def __init__(self, *args: Any) -> None:
        # A bad start fails the workflow from `run` (the same first workflow task): raised
        # here, the SDK would leave `run`'s coroutine created and never awaited.
        self._start: _Start | ApplicationError
        try:
            self._start = _start_arguments(args)
        except ApplicationError as err:
            self._start = err
        # A run continued from an earlier one (continue-as-new) starts from the state that
        # run carried over, so watchers and queries see the whole turn from its first moment.
        self._state: TurnState | None = None
        if isinstance(self._start, _Start) and self._start.carried is not None:
            self._state = TurnState.resume(self._start.turn, self._start.carried)
        # Results of the current tool batch as they arrive, so a cancellation keeps them.
        self._completed: dict[str, CallToolResult] = {}
        # The current tool batch's calls, for current details while some await approval.
        self._batch_calls: list[ToolCallRequest] = []
        # The request of the model call in flight, which `llm_step` reads by query.
        self._model_input: LlmRequest | None = None
        # Each message's JSON, digest and size, so a model call dumps (and the compaction
        # check measures) only the messages new since the last (derived from the messages
        # alone: the same on replay).
        self._message_json = MessageJson()
        # Set once this run is about to continue as new: long-polling watchers return, and
        # ask again, which reaches the next run.
        self._continuing = False
        # Set when the conversation got too big to carry inline (payload storage off).
        self._cannot_continue = False
        # The search attribute values last upserted, so only changes are sent, and when.
        self._published: visibility.SearchAttributeValues = {}
        self._published_at: datetime | None = None
        # Those the run's start request set: ``start_turn`` sets what it knows, and a run
        # continued from another inherits that run's.
        self._start_attributes = visibility.published_values(
            workflow.info().typed_search_attributes
        )
        # Outcome timers not yet cancelled, with the history length when each was started.
        self._outcome_timers: list[tuple[asyncio.Task[None], int]] = []
        # How many of the current batch's agent-tool calls may run at once (None: all).
        self._agent_slots: asyncio.Semaphore | None = None
        # The agents called inline: their plans, the requests of their model calls in flight.
        self._inline = inline_agent.InlineCalls()
        # The running child turns, by workflow id: the agent call id or team step of each.
        self._children: dict[str, str] = {}
        # What a workflow agent's turn shows while none of its steps waits for a person.
        self._team_doing: str | None = None
        # Telling the parent turn (for a turn an agent called as a tool) of waiting calls.
        self._reporter: asyncio.Task[None] | None = None
        # What the tools' servers asked during their calls.
        self.requests_in_flight = ServerRequestsInFlight()
        # A counterfactual replay's recorded tool results (None: not a replay).
        self._replay: replays.RecordedResults | None = None
        # The turn's requests to the limiters of its limited models (``limits:``).
        self.capacity = Capacity()

    @workflow.run
    async def run(self, *args: Any) -> TurnResult:
        """One turn, possibly over several runs: a run whose history grows past the plan's
        limits continues as new between two steps, handing its state to the next run (the
        second argument), which needs neither ``prepare_turn`` nor ``list_tools`` again (their
        answers are carried). ``__init__`` has checked ``args``."""
        del args
        if isinstance(self._start, ApplicationError):
            self._failed_before_start()
            raise self._start
        turn, carried, _ = self._start
        if carried is None:  # not a run the turn continued as new into
            turn_metrics.turn_started(turn.agent)
        if self._state is None:
            try:
                # Shared with the worker's other turns of the agent (``turnkeep.workflows.shared``).
                plan = shared(await actions.prepare_turn(turn, local=_local_setup(turn)))
                turn, known = _with_history(self._start)
                if turn.replay_of is not None:
                    turn, plan = await self._start_replay(turn, plan)
            except (ActivityError, ApplicationError):  # an unknown agent, a bad history...
                self._failed_before_start()
                turn_metrics.turn_ended(turn.agent, "failed", 0)
                raise
            self._start = _Start(turn, None)
            self._state = TurnState.start(turn, plan, in_session=_in_session())
            if known is not None:
                self._message_json = MessageJson(known.json, known.run)
            # Not replayed (the SDK's workflow logger skips replay): one line per turn.
            workflow.logger.info("turn started: agent %s, model %s", turn.agent, plan.model)
        elif turn.replay_of is not None:  # a replay's next run: its record again
            await self._start_replay(turn, self._state.plan)
        state = self._state
        parent = child_approvals.parent_turn(turn.depth)
        if parent is not None:
            self._reporter = asyncio.create_task(child_approvals.report_to_parent(state, parent))
        if self._start_attributes:
            # They count as published: the rest follows when next due, not in this task, as
            # each upsert is a visibility-store write.
            self._published = dict(self._start_attributes)
            self._published_at = workflow.info().start_time
        self.show(visibility.STARTING, publish=self._publish_due())
        try:
            if carried is None:
                state.tools = [shared(t) for t in await actions.list_tools(state.plan)]
            if state.plan.team is not None and not state.done:
                await self._run_team(state.plan.team)
            # Cut between the model's tool request and the tools: this run starts with them.
            tools_next = carried is not None and carried.cut_before_tools
            while not state.done:
                if not tools_next:
                    await self._maybe_compact()
                    await self._hooks(HookPoint.BEFORE_LLM_CALL)
                    if not state.done:
                        await self._ask_model()
                    if state.awaiting_tools:
                        await self._continue_as_new_if_due(turn, before_tools=True)
                tools_next = False
                if state.awaiting_tools:
                    await self._hooks(HookPoint.BEFORE_TOOL_CALL)
                if state.awaiting_tools:
                    await self._run_tools()
                if not state.done:
                    await self._continue_as_new_if_due(turn, before_tools=False)
        except asyncio.CancelledError:
            # fast-agent's interrupted-tool repair; after_turn_complete never runs here.
            state.cancel(completed=self._completed)
            turn_metrics.turn_ended(state.plan.agent, str(state.stop_reason), state.iteration)
            self.show(visibility.ended(state), publish=True)
            await self.capacity.settled()
            await self._release_watchers()
            raise
        await self._hooks(HookPoint.AFTER_TURN_COMPLETE)
        self.show(visibility.ended(state), publish=True)
        await self.capacity.settled()
        await self._release_watchers()
        result = state.result()
        self._keep_conversation(result)
        turn_metrics.turn_ended(state.plan.agent, result.stop_reason.value, result.iterations)
        workflow.logger.info(
            "turn ended: %s after %d iteration(s)", result.stop_reason.value, result.iterations
        )
        return result

    async def _start_replay(self, turn: TurnInput, plan: TurnPlan) -> tuple[TurnInput, TurnPlan]:
        """A counterfactual replay (``replays``): the source turn's input in place of what
        the client sent, its recorded results for the tool calls, and the instruction the
        replay asked for, once the worker has checked them (``replay_source``)."""
        assert turn.replay_of is not None
        source = await replays.read_source(turn.agent, turn.replay_of)
        self._replay = replays.RecordedResults(
            turn.replay_of.turn, source.calls, live=source.live_tools
        )
        turn = turn.model_copy(update={"messages": source.messages, "history": source.history})
        if source.instruction is not None:
            plan = plan.model_copy(update={"instruction": source.instruction})
        return turn, plan

    def _keep_conversation(self, result: TurnResult) -> None:
        """Leave a session's conversation, as it was handed to this turn and as the turn hands
        it back, to the worker's next turn of the session and to a replay of this one
        (``conversation_cache``)."""
        state = self.state
        if state.history_ref is None or result.conversation is None:
            return
        json, run = self._message_json.entries, self._message_json.run
        # What the turn was handed is kept already when this worker ran the turn before.
        given = conversations.get(state.history_ref)
        if given is None or len(given.messages) != len(state.history):
            given = conversations.put(state.history_ref, state.history, json, run=run)
        kept = given.messages
        extends = (
            given
            if len(result.history) >= len(kept)
            and all(a is b for a, b in zip(kept, result.history, strict=False))
            else None
        )
        conversations.put(result.conversation, result.history, json, extends=extends, run=run)

    async def _release_watchers(self) -> None:
        # Long-polling watchers see the end (state.done) before the run closes.
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _continue_as_new_if_due(self, turn: TurnInput, *, before_tools: bool) -> None:
        """Hand the turn to a fresh run once this one's history is big enough. Called only
        between steps, with no activity in flight: whatever a step did is in ``state``."""
        state = self.state
        limits = state.plan.continue_as_new
        if self._cannot_continue or not _history_full(limits):
            return
        carried = state.carry(before_tools=before_tools)
        if limits.max_carried_bytes is not None:
            size = _payload_bytes(turn, carried)
            if size > limits.max_carried_bytes:
                # Messages are only appended from here: no later step could carry it either.
                self._cannot_continue = True
                workflow.logger.warning(
                    "not continuing as new: the turn's state (%d bytes) is over Temporal's "
                    "payload limit and payload storage is off; the turn goes on in this run",
                    size,
                )
                return
        self._continuing = True
        await self.capacity.settled()
        await self._release_watchers()
        workflow.continue_as_new(args=[turn, carried])

    async def _ask_model(self) -> None:
        state = self.state
        request = state.model_request()
        if state.plan.budget is not None and not await budget_raise.within_budget(
            self, request, self._message_json.estimate_tokens(request.messages)
        ):
            return
        self._model_input = request
        self.show(visibility.waiting_on_model(request))
        if state.plan.fallback_models:
            answer, request = await actions.call_model_chain(
                request, state.plan, self._message_json, self._next_model, self.capacity, self.show
            )
        else:
            answer = await actions.call_model(
                request, state.plan, self._message_json, self.capacity, self.show
            )
        self._model_input = None  # read only while the call is in flight
        state.on_assistant(answer, request.model)
        # An outcome gets a row of its own only when the rows after it do not tell it: not a
        # toolUse answer whose every call runs as a tool activity (its `tool …` rows say it).
        if not state.runs_every_pending_call():
            self._record_outcome(visibility.outcome_summary(request, answer))
        self.show(visibility.answered(answer), publish=self._publish_due())
        await self._hooks(HookPoint.AFTER_LLM_CALL)

    def _next_model(self, request: LlmRequest) -> None:
        """A fallback model takes the call over: the query answers with its request now."""
        self._model_input = request
        self.show(visibility.waiting_on_model(request))

    def _record_outcome(self, summary: str) -> None:
        """Record a model call's outcome in the history, as the summary of a timer nobody
        waits for (``actions.outcome_timer``), started with this workflow task's commands."""
        self._cancel_outcome_timers()
        length = workflow.info().get_current_history_length()
        self._outcome_timers.append((actions.outcome_timer(summary), length))

    def _cancel_outcome_timers(self) -> None:
        """Cancel the outcome timers started in an earlier workflow task, which the server has
        (the history has grown since); a newer one is kept for a later step to cancel."""
        length = workflow.info().get_current_history_length()
        for timer, started_at in self._outcome_timers:
            if started_at < length:
                timer.cancel()
        self._outcome_timers = [(t, at) for t, at in self._outcome_timers if at >= length]

    async def _run_tools(self) -> None:
        state = self.state
        batch = state.tool_batch()
        if self._replay is not None:  # recorded results answer what they can, before any gate
            batch = self._replay.answer(batch, list(state.messages[-1].tool_calls or {}))
        self._completed = {}
        rules = state.plan.approval
        if rules is not None and rules.policy is not None and batch.gated:
            # The agent's policy decides first (one activity for the batch); only the calls
            # it asks about wait for a person.
            self.show(f"asking approval policy `{rules.policy}`")
            request = policy_request(rules, state.plan.agent, batch.gated)
            verdicts = await actions.approval_policy(request)
            order = list(state.messages[-1].tool_calls or {})
            batch, records = apply_verdicts(batch, rules, verdicts, order, workflow.now())
            state.decisions.extend(records)
        if batch.gated and any(rule.active for rule in state.allow_rules):
            # After the policy: a rule spares the calls it covers a person's wait, no more.
            order = list(state.messages[-1].tool_calls or {})
            batch, records = apply_rules(batch, state.allow_rules, order, workflow.now())
            state.decisions.extend(records)
        self._batch_calls = batch.to_run + batch.gated + batch.client
        self.show(self._tools_doing())
        # With calls awaiting a person, the others' ends show in the details as they come.
        refresh = self.tools_moved if batch.gated or batch.client else None
        # fast-agent's max_parallel: a bound on the batch's agent calls running at once.
        bound = state.plan.max_parallel
        self._agent_slots = asyncio.Semaphore(bound) if bound else None
        results, timing = await actions.run_tools(
            batch,
            state.plan,
            self._completed,
            functools.partial(approval.approve, self),
            self._call_agent,
            refresh,
            functools.partial(server_answers.answer, self),
            functools.partial(client_tool.result, self),
        )
        # The outcome that asked for these tools spans them in the Web UI's timeline.
        self._cancel_outcome_timers()
        state.on_tool_results(results, timing)
        await self._hooks(HookPoint.AFTER_TOOL_CALL)

    async def _run_team(self, team: TeamPlan) -> None:
        """A workflow agent's turn: its steps, each another agent's child turn, in place of
        the model loop."""
        state = self.state
        self._team_doing = visibility.clip(
            f"running {team.kind}: {', '.join(s.agent for s in team.steps)}"
        )
        self.show(self._team_doing)

        async def run(
            tool: AgentTool,
            messages: list[Message],
            step: int,
            name: str,
            structured_output: dict[str, Any] | None = None,
        ) -> AgentCall:
            id = agent_tools.child_id(workflow.info().workflow_id, step, name)
            async with self._child_turn(id, name):
                call = await self._run_agent(tool, messages, id, structured_output)
            state.on_agent_usage(call.usage)
            return call

        async def ask(messages: list[Message], schema: dict[str, Any] | None) -> Message:
            request = self._model_input = LlmRequest(
                agent=state.plan.agent,
                model=state.plan.model,
                call_index=state.model_calls + 1,
                instruction=state.plan.instruction,
                messages=messages,
                tools=[],
                structured_output=schema,
            )
            answer = await actions.call_model(request, state.plan, MessageJson(), self.capacity)
            self._model_input = None
            state.on_model_answer(answer)
            return answer

        state.end_with(await teams.run_team(team, state.messages, run, ask))

    async def _call_agent(self, call: ToolCallRequest, tool: AgentTool) -> ToolCallOutcome:
        """Run a call of one of the turn's agent tools as a child turn (or inline, for an agent
        that asks for it and can: ``inline_agent``), and count its usage."""
        state = self.state
        started = workflow.time()
        id = agent_tools.child_id(workflow.info().workflow_id, state.model_calls, call.call_id)
        message = Message.user(agent_tools.agent_message(call.arguments))
        async with (
            self._child_turn(id, call.call_id),
            self._agent_slots or contextlib.nullcontext(),
        ):
            outcome = await self._run_agent(tool, [message], id)
        state.on_agent_usage(outcome.usage)
        duration_ms = (workflow.time() - started) * 1000
        return ToolCallOutcome(result=outcome.result, duration_ms=duration_ms)

    async def _run_agent(
        self,
        tool: AgentTool,
        messages: list[Message],
        id: str,
        structured_output: dict[str, Any] | None = None,
    ) -> AgentCall:
        """Run ``tool``'s agent on ``messages`` as child turn ``id`` (``agent_tools``), or
        inline under that id when the agent asks for it and the inline loop can run it
        (``inline_agent``)."""
        state = self.state
        if tool.inline and structured_output is None:
            call = await inline_agent.run_agent(
                tool,
                messages,
                key=id,
                depth=state.depth,
                parent=state.plan,
                calls=self._inline,
                capacity=self.capacity,
                show=self.show,
            )
            if call is not None:
                return call
        return await agent_tools.run_agent(
            tool,
            messages,
            id=id,
            depth=state.depth,
            parent=state.plan,
            structured_output=structured_output,
        )

    @contextlib.asynccontextmanager
    async def _child_turn(self, id: str, label: str) -> AsyncIterator[None]:
        """While child turn ``id`` runs, its reports of waiting calls are taken (``label``:
        the agent call or team step it is, shown while it waits)."""
        state = self.state
        self._children[id] = label
        try:
            yield
        finally:
            # An ended child waits for nothing: its last report goes with it.
            del self._children[id]
            if state.descendant_approvals.pop(id, None) and not state.done:
                self.tools_moved(publish=True)

    def _tools_doing(self) -> str:
        state = self.state
        # An agent call whose child turn waits for a decision awaits a person too.
        in_children = {
            self._children[id] for id, calls in state.descendant_approvals.items() if calls
        }
        if self._team_doing is not None and not in_children:
            return self._team_doing
        asking = set(self.requests_in_flight.waiting.values())
        return visibility.tools_in_progress(
            self._batch_calls, self._completed, {*state.pending_approvals, *in_children, *asking}
        )

    def tools_moved(self, *, publish: bool = False) -> None:
        """A call of the batch began to wait for a person, was decided or ended: show where the
        batch is, and once nothing but people is awaited, let the worker drop this turn from its
        cache until the next event (``worker_cache``)."""
        self.show(self._tools_doing(), publish=publish)
        if self.awaits_only_people():
            worker_cache.leave_cache()

    def awaits_only_people(self) -> bool:
        """Whether some calls of the batch wait for a decision and every other call has ended
        (a pure read, also made after each query by the worker's ``CacheRelease``)."""
        waiting = self._state.pending_approvals if self._state else {}
        asking = set(self.requests_in_flight.waiting.values())
        return bool(waiting) and all(
            c.call_id in waiting or c.call_id in asking or c.call_id in self._completed
            for c in self._batch_calls
        )

    async def _maybe_compact(self) -> None:
        """Summarise older exchanges when the context is near full; never breaks the loop."""
        state = self.state
        # The turn's own measure: only messages new since the last check are measured.
        cut = state.compaction_cut(self._message_json.estimate_tokens)
        if cut is None:
            return
        self.show(visibility.compacting(state.plan.model))
        try:
            summary = await actions.compact_history(
                state.conversation()[:cut], state.plan, self.capacity
            )
        except ActivityError as err:
            workflow.logger.warning("compaction failed, history unchanged: %s", err)
            state.compaction_failed = True
            return
        state.on_compacted(cut, summary)

    async def _hooks(self, point: HookPoint) -> None:
        """Run the agent's hooks for ``point`` as activities; none configured, none run."""
        state = self.state
        for hook in state.plan.hooks.get(point, []):
            self.show(visibility.waiting_on_hook(point, hook))
            try:
                change = await actions.run_hook(hook, state.hook_context(point))
            except ActivityError as err:
                text = f"Hook '{hook}' ({point}) failed: {actions.failure_text(err)}"
                if point in _HOOKS_THAT_MAY_FAIL:
                    workflow.logger.warning("%s (ignored)", text)
                    continue
                state.fail(text)
                return
            state.on_hook(hook, change)

    def _failed_before_start(self) -> None:
        """A turn that fails before it has a plan publishes nothing of its own; if its start
        request said ``Running``, it now says ``Failed``, or filters for running turns would
        find it for ever."""
        if self._start_attributes.get(visibility.STATUS.name) == visibility.TurnStatus.RUNNING:
            workflow.upsert_search_attributes(
                [visibility.STATUS.value_set(visibility.TurnStatus.FAILED.value)]
            )

    @property
    def task_priority(self) -> Priority:
        """What the turn's activities and child turns carry (``task_priority``): its plan's
        priority and fairness key, and before it has a plan (``prepare_turn``) its input's."""
        if self._state is not None:
            plan = self._state.plan
            return temporal_priority(plan.priority, plan.fairness_key)
        if isinstance(self._start, _Start):
            turn = self._start.turn
            return temporal_priority(turn.priority or "normal", turn.tenant)
        return Priority.default

    @property
    def state(self) -> TurnState:
        """The loop's state, once the turn has one (what the waits work on)."""
        assert self._state is not None, "the loop runs only after prepare_turn"
        return self._state

    def drop_message_json(self) -> None:
        """Let go of the conversation's JSON while a person is awaited, who may take hours: the
        turn keeps its conversation, and the next model call dumps it again."""
        self._message_json = MessageJson()

    # Arguments are taken as they come and checked by the validator: with a typed parameter, a
    # call missing it (or with one too many) would reach the handler as a TypeError, which
    # fails the workflow task, for ever, instead of rejecting the call.
    # A turn that fails (a bad start, an unknown agent) ends with watchers still waiting: they
    # learn of the end from the workflow's outcome, with nothing lost, so no warning is due.
    @workflow.update(unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def wait_for_messages(self, *args: Any) -> TurnProgress:
        """Long-poll with one argument, ``after``: returns once the turn has more than
        ``after`` messages, or has ended, or this run is about to continue as new (the caller
        asks again and reaches the next run)."""
        after: int = args[0]
        await workflow.wait_condition(
            lambda: self._progress().count > after or self._progress().done or self._continuing
        )
        return self._progress()

    @wait_for_messages.validator
    def _check_wait_for_messages(self, *args: Any) -> None:
        if len(args) != 1 or type(args[0]) is not int:  # JSON's true is a bool, not a count
            got = f"{len(args)} arguments" if len(args) != 1 else type(args[0]).__name__
            raise ApplicationError(
                "wait_for_messages takes one argument, how many of the turn's messages the "
                f"caller has (an integer); got {got}",
                type="InvalidUpdate",
                non_retryable=True,
            )

    # Sync: it only records the decision; the call's waiting coroutine carries on from there.
    @workflow.update(name=DECIDE_UPDATE)
    def decide(self, *args: Any) -> DecisionRecord:
        """A person's decision on a call awaiting approval: one argument, a ``Decision``."""
        return updates.decide(self.state, args)

    @decide.validator
    def _check_decide(self, *args: Any) -> None:
        updates.check_decide(self._state, args)

    # Sync, as decide: it only records the revocation; calls the rule covered wait from now.
    @workflow.update(name=REVOKE_ALLOW_UPDATE)
    def revoke_allow(self, *args: Any) -> AllowRule:
        """Revoke an "always allow" rule of the turn: one argument, a ``RevokeAllow``."""
        return updates.revoke_allow(self.state, args)

    @revoke_allow.validator
    def _check_revoke_allow(self, *args: Any) -> None:
        updates.check_revoke_allow(self._state, args)

    @workflow.signal(name=SESSION_RULE_REVOKED_SIGNAL)
    def session_rule_revoked(self, *args: Any) -> None:
        """The turn's session revoked one of its rules (validated there, by its update): one
        argument, a ``RevokeAllow``."""
        updates.session_rule_revoked(self._state, args)

    @workflow.query(name=ALLOW_RULES_QUERY)
    def allow_rules(self) -> list[AllowRule]:
        """The turn's "always allow" rules, revoked ones included."""
        return self._state.allow_rules if self._state else []

    @workflow.signal(name=CHILD_APPROVALS_SIGNAL)
    def child_approvals(self, *args: Any) -> None:
        """A child turn (an agent call's, a workflow agent's step) reports the calls waiting
        in it and below it: one argument, a ``ChildApprovals``. A signal cannot be refused:
        one that is not a report of a running child is logged and ignored."""
        if child_approvals.take_report(self._state, args, self._children):
            # Published at once, as for the turn's own calls: operators look for waiting turns.
            self.tools_moved(publish=True)

    @workflow.signal(name=CAPACITY_GRANT_SIGNAL)
    def capacity_granted(self, *args: Any) -> None:
        """A limiter grants a model call of this turn its capacity: one argument, a
        ``CapacityGrant``. One that answers no request the turn is waiting on is ignored."""
        self.capacity.on_grant(args)

    @workflow.query(name=PENDING_QUERY)
    def pending_approvals(self) -> list[PendingCall]:
        """The calls waiting for a decision, oldest first, then those waiting in the turn's
        child turns (each saying which turn and agent it is of)."""
        return pending_calls.waiting_calls(self._state) if self._state else []

    # Arguments taken as they come and checked (``_model_input_args``): with an optional
    # parameter, the SDK decodes a call with fewer arguments than parameters without their
    # types, so a bad ``start`` would pass unchecked.
    @workflow.query(name=MODEL_INPUT_QUERY)
    def model_input(self, *args: Any) -> ModelInputPage | None:
        """A page of the request of model call ``call_index``, from ``start``, while it is in
        flight (of the agent called inline under ``inline``, when given): arguments
        ``call_index``, then optionally ``start`` and ``inline``."""
        call_index, start, inline = _model_input_args(args)
        if inline is not None:
            request = self._inline.inputs.get(inline)
            if request is None or request.call_index != call_index:
                return None
            return model_input_page(request, start)
        request = self._model_input
        if request is None or request.call_index != call_index:
            request = self.requests_in_flight.sampling_inputs.get(call_index)
        if request is None:
            return None
        return model_input_page(request, start)

    @workflow.query
    def progress(self) -> TurnProgress:
        """How far the turn has got: what followers ask (``wait_for_messages`` without the
        wait)."""
        return self._progress()

    @workflow.query
    def transcript(self, start: int = 0) -> list[Message]:
        """``TurnResult.messages[start:]`` as they stand."""
        return self._state.messages[start:] if self._state else []

    @workflow.query
    def turn(self) -> TurnResult | None:
        """The turn as it stands; after a cancellation, the repaired conversation."""
        return self._state.result() if self._state else None

    def _progress(self) -> TurnProgress:
        state = self._state
        return TurnProgress(
            count=len(state.messages) if state else 0, done=bool(state and state.done)
        )

    def _publish_due(self) -> bool:
        """Whether search attributes may be upserted before the turn ends: at most once per
        the plan's interval since the last publish (or since the start request set some), as
        each upsert is a history event and a visibility-store write."""
        interval = self.state.plan.visibility.search_attribute_interval
        if self._published_at is None or not interval:
            return True
        return (workflow.now() - self._published_at).total_seconds() >= interval

    def show(self, doing: str, *, publish: bool = False) -> None:
        """Current details for the Web UI: where the turn is, in one glance. With ``publish``,
        the search attributes too: at the start and after a model answer when due
        (``_publish_due``), and at the end, as each upsert is an event in the history (current
        details are not)."""
        state = self._state
        if state is None:
            return
        workflow.set_current_details(visibility.details(state, doing))
        if not publish:
            return
        values = visibility.search_attribute_values(state)
        allowed = state.plan.visibility.search_attributes
        updates = visibility.search_attribute_updates(values, self._published, allowed)
        if updates:
            workflow.upsert_search_attributes(updates)
            self._published, self._published_at = values, workflow.now()


_START_USAGE = (
    'TurnWorkflow takes one argument, a TurnInput such as {"agent": "demo", "messages": ["hello"]}'
)


class _Start(NamedTuple):
    turn: TurnInput
    # The state a continued run starts from. A state from a client would skip prepare_turn:
    # its own model, system prompt and plan, with no hook or iteration cap the agent sets.
    carried: TurnState | None
    # A new turn's input as it came, until its history is checked (`_with_history`).
    unchecked: dict[str, Any] | None = None


def _start_arguments(args: Sequence[Any]) -> _Start:
    """The turn's input and the state a continued run carries (``starting``).

    A new turn's ``history`` (the whole conversation, in a session's later turns) is checked
    only once ``prepare_turn`` has answered (``_with_history``): the first workflow task needs
    just the agent and the overrides, and a session's worker runs it at the moment it is
    starting the turn, so a long conversation would hold up every ``send``."""
    value = args[0] if args else None
    if isinstance(value, dict) and "history" in value and (len(args) == 1 or args[1] is None):
        turn, _ = _checked_start([{**value, "history": []}])
        _check_owner(turn)
        _check_rules(turn)
        return _Start(turn, None, value)
    start = _Start(*_checked_start(args))
    _check_owner(start.turn)
    _check_rules(start.turn)
    return start


def _local_setup(turn: TurnInput) -> bool:
    """Whether the turn's ``prepare_turn`` runs as a local activity, in its first workflow
    task: for a turn another turn called as an agent (or ran as a team step), whose set-up
    would otherwise be an activity round trip and a workflow task more on the calling turn's
    wait. The plan is the same either way: the same ``prepare_turn`` checks the turn against
    the worker's configuration, on the worker running the turn, and a worker that dies mid-way
    leaves the workflow task to another worker, which runs it again (it only reads config).
    A turn a client started keeps the activity, which its history shows as a step of its own
    (and whose failure is the turn's failure's cause)."""
    parent = workflow.info().parent
    return turn.depth > 0 and parent is not None


def _in_session() -> bool:
    """Whether this turn is a session's: started by its parent under the session's turn ids
    (``<session id>/turn-<n>``), which no client can do (a client starts no child workflow)."""
    info = workflow.info()
    parent = info.parent
    return parent is not None and info.workflow_id.startswith(parent.workflow_id + "/turn-")


def _check_rules(turn: TurnInput) -> None:
    """A turn takes "always allow" rules only from the session it is a turn of: from anyone
    else, they would let calls run that the agent's config makes wait for a person."""
    if turn.allow_rules and not _in_session():
        raise ApplicationError(
            "allow_rules are handed to a turn only by its session: a turn takes no rules from "
            "its client",
            type="InvalidTurnInput",
            non_retryable=True,
        )


def _check_owner(turn: TurnInput) -> None:
    """A stored conversation is handed only by the session that owns it, to its own child
    turns: any client could copy a reference from another session's history (digests are no
    secret), and the worker would expand it into that session's messages. What a session's
    earlier turns spent of its budget (and raised it by) comes only from a parent too: a client
    could otherwise start a turn past any budget."""
    parent = workflow.info().parent
    if turn.session_spent is not None and parent is None:
        raise ApplicationError(
            "session_spent is handed to a turn only by its session, as its child",
            type="InvalidTurnInput",
            non_retryable=True,
        )
    ref = turn.history_ref
    if ref is None:
        if turn.messages_segment is not None:
            raise ApplicationError(
                "messages_segment is handed to a turn only by its session, with history_ref",
                type="InvalidTurnInput",
                non_retryable=True,
            )
        return
    if parent is None or parent.workflow_id != ref.owner:
        raise ApplicationError(
            "history_ref names the stored conversation of another workflow: only the session "
            "that owns a conversation may hand it to a turn, as its child",
            type="InvalidTurnInput",
            non_retryable=True,
        )


def _model_input_args(args: Sequence[Any]) -> tuple[int, int, str | None]:
    """``MODEL_INPUT_QUERY``'s arguments, checked: ``call_index``, ``start`` (0 unless given)
    and ``inline`` (None unless given)."""
    usage = (
        f"{MODEL_INPUT_QUERY} takes a model call's index and a start (integers, the start at "
        "least 0), then optionally an inline agent call's key (a string)"
    )
    if not 1 <= len(args) <= 3:
        raise ValueError(usage)
    call_index = args[0]
    start = args[1] if len(args) > 1 else 0
    inline = args[2] if len(args) > 2 else None
    # JSON's true is a bool, not an index.
    if type(call_index) is not int or type(start) is not int or start < 0:
        raise ValueError(usage)
    if inline is not None and not isinstance(inline, str):
        raise ValueError(usage)
    return call_index, start, inline


def _with_history(start: _Start) -> tuple[TurnInput, Conversation | None]:
    """The turn's input with its history checked (as ``_start_arguments`` checks the rest),
    and the conversation this worker holds for it, with the JSON already worked out for its
    messages. A history this worker has validated before (a session's previous turn ended
    with it) is taken as that turn left it."""
    if start.unchecked is None:
        return start.turn, None
    ref = start.turn.history_ref
    known = conversations.get(ref) if ref is not None else None
    if known is not None:
        return start.turn.model_copy(update={"history": list(known.messages)}), known
    turn, _ = _checked_start([start.unchecked])
    return turn, None


def _checked_start(args: Sequence[Any]) -> tuple[TurnInput, TurnState | None]:
    return start_arguments(
        args, TurnInput, TurnState, usage=_START_USAGE, error_type="InvalidTurnInput"
    )


def _history_full(limits: ContinueAsNewPlan) -> bool:
    """Whether this run's history has reached a limit (values of the current workflow task,
    the same on replay)."""
    info = workflow.info()
    return (
        (limits.when_suggested and info.is_continue_as_new_suggested())
        or (
            limits.history_bytes is not None
            and info.get_current_history_size() >= limits.history_bytes
        )
        or (
            limits.history_events is not None
            and info.get_current_history_length() >= limits.history_events
        )
    )


def _payload_bytes(*values: object) -> int:
    """The size of ``values`` as the SDK will record them inline."""
    return Payloads(payloads=workflow.payload_converter().to_payloads(list(values))).ByteSize()
