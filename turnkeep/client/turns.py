"""Client helpers: start a turn, watch its messages as they are produced, get its result.

Any Temporal client can do the same by hand: start workflow type ``TurnWorkflow`` on its agent's
task queue (``turnkeep.<agent>``: ``agent_task_queue``) with a ``TurnInput`` as JSON. These
helpers add following a turn by query (``turnkeep.client.queries``), and reading the repaired
conversation of a cancelled turn.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowQueryRejectedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError

from turnkeep.client.children import TurnEvent, with_children
from turnkeep.client.history import read_turn
from turnkeep.client.live import StreamEvent, stream_turn
from turnkeep.client.queries import poll_query, query_retrying
from turnkeep.contract.approval import (
    ALLOW_RULES_QUERY,
    DECIDE_UPDATE,
    DECIDED_IN_CHILD,
    PENDING_QUERY,
    REVOKE_ALLOW_UPDATE,
    AllowRule,
    Decision,
    DecisionRecord,
    PendingCall,
    RememberScope,
    RevokeAllow,
    SubmittedResult,
)
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import (
    DEFAULT_TASK_QUEUE,
    TurnCancelledError,
    TurnInput,
    TurnProgress,
    TurnResult,
    agent_task_queue,
)
from turnkeep.observability.search_attributes import present_search_attributes
from turnkeep.payloads.conversations import with_history
from turnkeep.workflows import visibility
from turnkeep.workflows.task_priority import temporal_priority
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME, TurnWorkflow

if TYPE_CHECKING:
    from typing import Unpack

    from turnkeep.client.forks import ForkOptions
    from turnkeep.client.sessions import SessionHandle


def summarize(turn: TurnInput) -> str:
    """The Web UI's one-line summary of a turn: its prompt, shortened."""
    return visibility.prompt_summary(turn.messages[-1].text)


async def start_turn(
    client: Client,
    turn: TurnInput,
    *,
    workflow_id: str | None = None,
    task_queue: str | None = None,
) -> TurnHandle:
    """Start ``turn`` and return its handle. ``task_queue``: where the turn runs; by default
    its agent's queue on turnkeep's default task queue (``turnkeep.<agent>``), which only
    workers with the agent poll. A worker whose config names another ``task_queue`` serves
    ``agent_task_queue(that, agent)``; an application's own worker, its own queue."""
    # The search attributes the starter knows go with the start request: the workflow then
    # need not upsert them in its first task: one write to the server's visibility store less
    # per turn, a cost the dev server pays in CPU.
    present = await present_search_attributes(client)
    handle = await client.start_workflow(
        WORKFLOW_NAME,
        turn,
        id=workflow_id or f"turn-{turn.agent}-{uuid.uuid4().hex[:12]}",
        task_queue=task_queue or agent_task_queue(DEFAULT_TASK_QUEUE, turn.agent),
        result_type=TurnResult,
        static_summary=summarize(turn),
        search_attributes=visibility.start_search_attributes(turn.agent, present),
        # When a worker of this client polls the task queue (`turnkeep run`, an app that
        # embeds its worker), the server hands it the turn's first workflow task in the start
        # response instead of through a poll, a round trip less per turn. Any other starter
        # gets a normal start.
        request_eager_start=True,
        # Its workflow tasks and set-up go ahead of lower-priority work too, as what it
        # schedules once its plan says its priority (``turnkeep.workflows.task_priority``).
        priority=temporal_priority(turn.priority or "normal", turn.tenant),
    )
    return TurnHandle(handle, client)


def _child_turn(err: WorkflowUpdateFailedError, parent_id: str) -> str | None:
    """The child turn a decision was refused for, to be sent to instead: only a turn below
    ``parent_id`` (child ids extend their parent's), so each hop goes deeper and none leaves
    the tree of the turn the caller named."""
    cause = err.cause
    if not isinstance(cause, ApplicationError) or cause.type != DECIDED_IN_CHILD:
        return None
    child = cause.details[0] if cause.details else None
    return child if isinstance(child, str) and child.startswith(parent_id + "/") else None


def get_turn(client: Client, workflow_id: str, run_id: str | None = None) -> TurnHandle:
    """A turn by workflow id. A long turn continues as new (several runs, one workflow id), so
    updates, queries and cancel go to whichever run is current; ``run_id`` only says where
    ``result()`` starts following the chain of runs."""
    return TurnHandle(
        WorkflowHandle(client, workflow_id, result_run_id=run_id, result_type=TurnResult), client
    )


class NoBudgetWait(ValueError):
    """``raise_budget`` or ``stop_at_budget`` on a turn that is not waiting at its budget."""


class TurnHandle:
    def __init__(self, handle: WorkflowHandle[Any, TurnResult], client: Client) -> None:
        self.handle = handle
        self.client = client

    @property
    def workflow_id(self) -> str:
        return self.handle.id

    async def messages(
        self,
        start: int = 0,
        *,
        include_tool_results: bool = False,
        every: bool = False,
        to_the_end: bool = True,
    ) -> AsyncIterator[Message]:
        """Each message of ``TurnResult.messages`` from index ``start`` on, as soon as the
        workflow has it: assistant messages, plus tool-result messages when asked for, or
        with ``every`` all of them (the input too), for a follower that counts them. Without
        ``to_the_end``, it stops as soon as the turn has ended, leaving the messages it has
        not yielded to the caller's other source (a session's transcript): reading them from
        the closed turn would decode its whole result, conversation and all. It asks by query
        (``poll_query``): a message comes at most half a second after the turn has it."""
        index = start
        while True:
            progress = await poll_query(
                self.handle, TurnWorkflow.progress, _news_after(index), hold=True
            )
            if not to_the_end and (progress is None or progress.done):
                return
            if progress is None:  # the run has closed: read what it ended with
                closed = await self._closed()
                new = closed.messages[index:] if closed else []
            else:
                new = await self._transcript(index) if progress.count > index else []
            for message in new:
                index += 1
                if (
                    every
                    or message.role == "assistant"
                    or (include_tool_results and message.tool_results)
                ):
                    yield message
            if progress is None or (progress.done and index >= progress.count):
                return

    def stream(
        self,
        start: int = 0,
        *,
        include_tool_results: bool = False,
        every: bool = False,
        to_the_end: bool = True,
    ) -> AsyncIterator[StreamEvent]:
        """``messages()`` as ``MessageEvent``s, with the live text of each model call in
        between as the provider streams it (``TextDelta``, ``ToolCallStart``, ``Restarted``
        when a call is retried) when the worker serves it (``streaming:`` in its config).
        Without a reachable live stream, only the ``MessageEvent``s: no error. The messages
        are always the ones in history (``turnkeep.client.live``)."""
        messages = self.messages(
            start, include_tool_results=include_tool_results, every=every, to_the_end=to_the_end
        )
        return stream_turn(self.client, self.handle, messages)

    def stream_with_children(
        self, start: int = 0, *, include_tool_results: bool = False
    ) -> AsyncIterator[TurnEvent]:
        """``stream()``, with each child turn the turn starts (a team's step, an agent called
        as a tool) as it starts and ends (``ChildStarted``, ``ChildEnded``), and its live text
        while it runs (``ChildText``, when its worker streams). They come from the turn's
        history, read as it grows (``turnkeep.client.children``): no query, no worker."""
        events = self.stream(start, include_tool_results=include_tool_results)
        return with_children(self.client, self.handle, events)

    async def result(self) -> TurnResult:
        """The turn's result; raises ``TurnCancelledError`` (with the repaired conversation)
        when it was cancelled. A session's turn hands its history back by reference: it is
        read from the conversation store (the same payload storage as the workers')."""
        try:
            return await with_history(
                self.client.data_converter.payload_codec, await self.handle.result()
            )
        except WorkflowFailureError as err:
            if isinstance(err.cause, CancelledError):
                raise TurnCancelledError(await self.current()) from err
            raise

    async def current(self) -> TurnResult | None:
        """The turn as it stands, on a running or a closed (including cancelled) workflow.

        A running turn is asked by query, which a worker for its task queue answers; a closed
        one is read without any worker (see ``_closed``)."""
        if not await self._running():
            return await self._closed()
        try:
            turn: TurnResult = await query_retrying(self.handle, TurnWorkflow.turn)
        except RPCError:
            if not await self._running():
                return await self._closed()  # it closed meanwhile
            raise
        return turn

    async def cancel(self) -> None:
        await self.handle.cancel()

    async def fork(self, at: int, **options: Unpack[ForkOptions]) -> SessionHandle:
        """A new session whose conversation is this turn's up to its ``at``-th message
        (counted from 1 as ``turnkeep show`` prints the turn; a session's turn is forked as
        its session at that message), then ``message`` if given; the turn is untouched.
        ``options`` as for ``SessionHandle.fork``."""
        from turnkeep.client.forks import fork

        return await fork(self.client, self.workflow_id, at=at, **options)

    async def decide(
        self,
        call_id: str,
        approve: bool,
        reason: str | None = None,
        by: str = "unknown",
        arguments: dict[str, Any] | None = None,
        limit: float | None = None,
        *,
        remember: RememberScope | None = None,
        remember_arguments: bool = False,
    ) -> DecisionRecord:
        """Approve or deny a tool call awaiting approval (``arguments``: run it with these
        instead). ``remember`` ("turn" or "session"), with an approval, also allows the tool's
        later calls (with ``remember_arguments``: only with the same arguments) for the rest of
        the turn or of its session, without waiting: the record names the rule it set. A
        refused decision (an unknown or already decided call, a turn that has ended) raises
        ``WorkflowUpdateFailedError`` saying why; the turn goes on unaffected.

        A call waiting in a child turn (an agent this turn called as a tool, or one below it)
        is decided there: the turn refuses the decision naming that turn, and it goes to it."""
        decision = Decision(
            call_id=call_id,
            decision="approve" if approve else "deny",
            reason=reason,
            by=by,
            arguments=arguments,
            limit=limit,
            remember=remember,
            remember_arguments=remember_arguments,
        )
        return await self.send_decision(decision)

    async def answer_elicitation(
        self,
        call_id: str,
        content: dict[str, Any] | None = None,
        *,
        decline: bool = False,
        cancel: bool = False,
        reason: str | None = None,
        by: str = "unknown",
    ) -> DecisionRecord:
        """Answer what an MCP server asked during a tool call (an elicitation waiting under
        ``call_id``, ``<tool call id>:elicit:<n>``): ``content`` (MCP's accept, checked against
        the requested schema), or ``decline``, or ``cancel``. A refused answer (content that
        does not match the schema, naming the field; content with a decline) raises
        ``WorkflowUpdateFailedError`` saying why; the turn goes on waiting."""
        if decline and cancel:
            raise ValueError("decline or cancel, not both")
        decision = Decision(
            call_id=call_id,
            decision="deny" if decline or cancel else "approve",
            reason=reason,
            by=by,
            content=content if content is not None or decline or cancel else {},
            cancel=cancel,
        )
        return await self.send_decision(decision)

    async def submit_tool_result(
        self,
        call_id: str,
        result: str | list[Any] | dict[str, Any],
        *,
        is_error: bool = False,
        by: str = "unknown",
    ) -> DecisionRecord:
        """Answer a call of a client-side tool with its result: text, a list of MCP content
        blocks, or a dict (structured content, also sent to the model as its JSON text). A
        tool with an output schema takes structured content that matches it. A refused result
        (a call that is not waiting or not a client-side tool's, a result that does not match)
        raises ``WorkflowUpdateFailedError`` saying why; the call still waits. To refuse the
        call instead, ``decide(call_id, approve=False, reason=...)``."""
        return await self.send_decision(
            Decision(
                call_id=call_id,
                decision="approve",
                by=by,
                result=SubmittedResult.of(result, is_error=is_error),
            )
        )

    async def send_decision(self, decision: Decision) -> DecisionRecord:
        """Send a ``Decision`` as it is (``decide`` and ``submit_tool_result`` build one),
        following a call that waits in a child turn to that turn."""
        try:
            return await self.handle.execute_update(
                DECIDE_UPDATE, decision, result_type=DecisionRecord
            )
        except WorkflowUpdateFailedError as err:
            child = _child_turn(err, self.workflow_id)
            if child is None:
                raise
        return await get_turn(self.client, child).send_decision(decision)

    async def raise_budget(
        self, limit: float, by: str = "unknown", reason: str | None = None
    ) -> DecisionRecord:
        """Raise the budget of a turn waiting at it to ``limit`` (in the budget's unit: tokens
        or USD), so its next model call goes ahead. Refused (``WorkflowUpdateFailedError``,
        the turn still waiting) when no budget waits, or ``limit`` is not above what is spent
        or is above the agent's ``max_raise``."""
        return await self.decide(await self._budget_call(), True, reason=reason, by=by, limit=limit)

    async def stop_at_budget(
        self, by: str = "unknown", reason: str | None = None
    ) -> DecisionRecord:
        """Stop a turn waiting at its budget: it ends with a final message saying so."""
        return await self.decide(await self._budget_call(), False, reason=reason, by=by)

    async def _budget_call(self) -> str:
        """The id of the budget wait of this turn (or of a child turn, which ``decide``
        sends the decision to)."""
        waiting = [c for c in await self.pending_approvals() if c.kind == "budget"]
        if not waiting:
            raise NoBudgetWait(f"turn {self.workflow_id!r} is not waiting at its budget")
        return waiting[0].call_id

    async def allow_rules(self) -> list[AllowRule]:
        """The turn's "always allow" rules (its session's and its own), revoked ones
        included (``AllowRule.active`` is False)."""
        return await self.handle.query(ALLOW_RULES_QUERY, result_type=list[AllowRule])

    async def revoke_allow(self, rule_id: str, *, by: str = "unknown") -> AllowRule:
        """Revoke one of the turn's rules: the calls it covered wait for a person again. A
        session's rule is revoked for this turn only (``SessionHandle.revoke_allow`` revokes it
        for the session)."""
        return await self.handle.execute_update(
            REVOKE_ALLOW_UPDATE, RevokeAllow(rule_id=rule_id, by=by), result_type=AllowRule
        )

    async def pending_approvals(
        self, rpc_timeout: timedelta | None = None, *, open_only: bool = False
    ) -> list[PendingCall]:
        """The turn's calls waiting for a decision (a worker of its task queue answers). With
        ``open_only``, a turn that has ended is refused by the server at once
        (``WorkflowQueryRejectedError``) rather than replayed on a worker to say nothing waits."""
        # Asked again when the server would not hold it (a worker runs the turn's task):
        # a reader would otherwise take a turn that waits for one that works.
        return await query_retrying(
            self.handle,
            PENDING_QUERY,
            result_type=list[PendingCall],
            rpc_timeout=rpc_timeout,
            reject_condition=QueryRejectCondition.NOT_OPEN if open_only else None,
        )

    async def _transcript(self, start: int) -> list[Message]:
        """``TurnResult.messages[start:]``: by query while the current run is open (every run
        of the turn holds them all, so which one answers does not matter), else from what the
        turn ended with. A query on a closed run would have a worker replay its whole history
        to answer what the result already says."""
        try:
            messages: list[Message] = await query_retrying(
                self.handle,
                TurnWorkflow.transcript,
                start,
                reject_condition=QueryRejectCondition.NOT_OPEN,
            )
        except WorkflowQueryRejectedError:
            closed = await self._closed()
            return closed.messages[start:] if closed else []
        return messages

    async def _running(self) -> bool:
        return (await self.handle.describe()).status == WorkflowExecutionStatus.RUNNING

    async def _closed(self) -> TurnResult | None:
        """What a closed turn ended with: its result if it completed, else the turn as its
        history has it (a cancelled turn's repaired conversation; as far as a failed one got),
        replayed here (``turnkeep.client.history``), so no worker has to be running."""
        try:
            return await with_history(
                self.client.data_converter.payload_codec, await self.handle.result()
            )
        except WorkflowFailureError:
            pass
        # Any run the handle knows of pins the turn (should its workflow id be reused);
        # read_turn follows the chain from it to the run the turn ended in. None: the latest.
        # (The SDK's handle keeps its client private.)
        h = self.handle
        run_id = h.result_run_id or h.run_id or h.first_execution_run_id
        return (await read_turn(self.client, self.workflow_id, run_id)).result


def _news_after(count: int) -> Callable[[TurnProgress], bool]:
    """Whether a turn's progress is news to a follower that has ``count`` of its messages."""
    return lambda progress: progress.count > count or progress.done
