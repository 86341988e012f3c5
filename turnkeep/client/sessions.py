"""Client side of sessions (``SessionWorkflow``): open one, send it messages, follow every
turn's messages across turns, cancel the running turn, close it.

```python
session = await open_session(client, agent="demo")
sent = await session.send("hello")
async for message in session.messages(until_turn=sent.turn):
    ...
```
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import (
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.history import TurnView, read_turn
from turnkeep.client.live import MessageEvent, StreamEvent
from turnkeep.client.queries import poll_query, query_retrying
from turnkeep.client.turns import get_turn
from turnkeep.contract.approval import (
    ALLOW_RULES_QUERY,
    REVOKE_ALLOW_UPDATE,
    AllowRule,
    RevokeAllow,
)
from turnkeep.contract.messages import Message
from turnkeep.contract.rewind import (
    REWIND_BUSY,
    REWIND_UPDATE,
    Rewind,
    RewindRequest,
)
from turnkeep.contract.session_io import (
    DEFAULT_TURNS_PER_RUN,
    SESSION_WORKFLOW_NAME,
    NewMessageMode,
    Sent,
    SessionInput,
    SessionProgress,
    SessionResult,
)
from turnkeep.contract.turn_io import DEFAULT_TASK_QUEUE, TaskPriority, agent_task_queue
from turnkeep.observability.search_attributes import present_search_attributes
from turnkeep.workflows import visibility
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.task_priority import temporal_priority

if TYPE_CHECKING:
    from typing import Unpack

    from turnkeep.client.forks import ForkOptions


async def read_transcript(
    handle: WorkflowHandle[Any, Any], start: int = 0, stop: int | None = None
) -> AsyncIterator[Message]:
    """A running session's transcript from index ``start`` (up to ``stop``, else to its end as
    it stands), by its ``transcript`` query, which answers a page at a time: an answer holding
    the whole of a long conversation would pass payload storage's threshold and be stored
    again, whole, for every reader."""
    index = start
    while stop is None or index < stop:
        page: list[Message] = await query_retrying(handle, SessionWorkflow.transcript, index)
        if not page:
            return
        for message in page[: None if stop is None else stop - index]:
            index += 1
            yield message


# How often `rewind(cancel_running=True)` cancels what runs and asks again.
_REWIND_ATTEMPTS = 5


class SessionClosedError(RuntimeError):
    """The session has ended: it takes no more messages, and its id is not reused."""


async def open_session(
    client: Client,
    *,
    agent: str,
    session_id: str | None = None,
    task_queue: str | None = None,
    idle_timeout: float | None = None,
    turns_per_run: int = DEFAULT_TURNS_PER_RUN,
    on_new_message: NewMessageMode = "queue",
    priority: TaskPriority | None = None,
    tenant: str | None = None,
) -> SessionHandle:
    """Start a session with ``agent``, or attach to the running session ``session_id`` (its
    own agent, limits and mode stay). Raises ``SessionClosedError`` for a session that has
    ended: it stays readable (``get_session``), and is never restarted empty under the same id.

    ``on_new_message`` is what a message sent while a turn runs does: ``queue`` waits for the
    turn, ``interrupt`` cancels it. Pass the agent's own setting
    (``AgentOptions.on_new_message``): the session cannot read the worker's config.
    ``task_queue``: where the session and its turns run, by default the agent's queue
    (``start_turn``). ``priority`` and ``tenant``: each turn's (``TurnInput``'s: a priority
    lower than the agent's, the tenant its work is shared fairly by)."""
    session = SessionInput(
        agent=agent,
        idle_timeout=idle_timeout,
        turns_per_run=turns_per_run,
        on_new_message=on_new_message,
        priority=priority,
        tenant=tenant,
    )
    workflow_id = session_id or f"session-{agent}-{uuid.uuid4().hex[:12]}"
    return await start_session(client, session, workflow_id=workflow_id, task_queue=task_queue)


async def start_session(
    client: Client,
    session: SessionInput,
    *,
    workflow_id: str,
    task_queue: str | None = None,
    summary: str | None = None,
    fork_of: str | None = None,
) -> SessionHandle:
    """Start the session ``session`` as ``workflow_id`` (``open_session``; a fork names its
    source in ``fork_of``, ``TurnkeepForkOf``), or attach to it if it runs."""
    agent = session.agent
    present = await present_search_attributes(client)
    try:
        handle = await client.start_workflow(
            SESSION_WORKFLOW_NAME,
            session,
            id=workflow_id,
            task_queue=task_queue or agent_task_queue(DEFAULT_TASK_QUEUE, agent),
            result_type=SessionResult,
            static_summary=summary or f"session with {agent}",
            search_attributes=visibility.start_search_attributes(agent, present, fork_of=fork_of),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # Its workflow tasks and its turns' starts, at its turns' priority.
            priority=temporal_priority(session.priority or "normal", session.tenant),
        )
    except WorkflowAlreadyStartedError as err:
        raise SessionClosedError(
            f"session {workflow_id!r} has ended: it stays readable (get_session), but takes no "
            "more messages; start a new session"
        ) from err
    return SessionHandle(handle, client)


def get_session(client: Client, session_id: str) -> SessionHandle:
    """A session by id, running or closed, without starting anything."""
    return SessionHandle(WorkflowHandle(client, session_id, result_type=SessionResult), client)


class SessionHandle:
    def __init__(self, handle: WorkflowHandle[Any, SessionResult], client: Client) -> None:
        # No run id: updates and queries reach whichever run is current (a session continues
        # as new between turns).
        self.handle = client.get_workflow_handle(handle.id, result_type=SessionResult)
        self.client = client

    @property
    def session_id(self) -> str:
        return self.handle.id

    async def send(self, message: str | Message) -> Sent:
        """Queue a user message; returns once the turn that answers it has started (or, when
        a turn is running, with the id of the next turn, which will answer it). A refused
        message (empty, not a user message, a session closing) raises
        ``WorkflowUpdateFailedError`` saying why; a session that has ended,
        ``SessionClosedError``."""
        arg = message if isinstance(message, str) else message.model_dump(mode="json")
        # One update id for every attempt: the server answers a repeat with the first's
        # outcome instead of queueing the message twice.
        update_id = uuid.uuid4().hex
        while True:
            try:
                return await self.handle.execute_update("send", arg, id=update_id, result_type=Sent)
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                _reraise_if_cancelled(err)  # else a slow start: ask again
            except RPCError as err:
                if await self._running():
                    raise
                raise SessionClosedError(
                    f"session {self.session_id!r} has ended: it takes no more messages"
                ) from err

    async def messages(
        self, start: int = 0, *, until_turn: int | None = None
    ) -> AsyncIterator[Message]:
        """Every message of every turn from index ``start`` of the session's transcript on,
        as soon as its turn has it: the user's, the model's and tool results, so the number
        received is where to resume. Runs until the session ends, or with ``until_turn``
        (``Sent.turn``) until that turn has ended, yielding no message of a later turn."""
        async for event in self._follow(start, until_turn, live_text=False):
            if isinstance(event, MessageEvent):
                yield event.message

    def stream(
        self, start: int = 0, *, until_turn: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        """``messages()`` as ``MessageEvent``s, with the live text of the running turn's model
        calls in between (``TurnHandle.stream()``)."""
        return self._follow(start, until_turn, live_text=True)

    async def _follow(
        self, start: int, until_turn: int | None, *, live_text: bool
    ) -> AsyncIterator[StreamEvent]:
        index = start
        seen: str | None = None  # the turn running when we last asked
        followed: str | None = None  # the last turn whose messages we streamed live
        end: int | None = None  # where turn `until_turn` ends in the transcript, once it has
        while True:
            progress = await self._wait(index, seen)
            if progress is None:  # the session has closed: read what it ended with
                closed = await self.handle.result()
                stop = len(closed.transcript)
                if until_turn is not None:
                    stop = closed.turn_ends.get(until_turn, stop)
                for message in closed.transcript[index:stop]:
                    yield MessageEvent(message=message)
                return
            if until_turn is not None and end is None and progress.turns_ended >= until_turn:
                end = await self._turn_end(until_turn, progress)
            # Only what `progress` counts: the transcript may hold turns that ended since.
            limit = progress.count if end is None else min(progress.count, end)
            if limit > index:
                async for message in read_transcript(self.handle, index, limit):
                    index += 1
                    yield MessageEvent(message=message)
            if end is not None and index >= end:
                return
            turn = progress.turn
            # A turn running once `until_turn` has ended is a later one: not followed.
            if (
                turn is not None
                and end is None
                and turn.workflow_id != followed
                and index >= turn.start
            ):
                followed = turn.workflow_id
                live = get_turn(self.client, turn.workflow_id)
                # Its last messages come from the session, which takes them in when it ends.
                if live_text:
                    async for event in live.stream(
                        index - turn.start, every=True, to_the_end=False
                    ):
                        index += isinstance(event, MessageEvent)
                        yield event
                else:
                    messages = live.messages(index - turn.start, every=True, to_the_end=False)
                    async for message in messages:
                        index += 1
                        yield MessageEvent(message=message)
            seen = turn.workflow_id if turn else None
            if progress.closed and turn is None and index >= progress.count:
                return

    async def _turn_end(self, turn: int, progress: SessionProgress) -> int:
        """Where turn ``turn``, which has ended, ends in the transcript, given the progress
        that says so."""
        if progress.turns_ended == turn:
            return progress.count  # the last turn to end: the transcript ends with it
        try:
            end: int | None = await query_retrying(self.handle, SessionWorkflow.turn_end, turn)
        except WorkflowQueryFailedError:
            end = None  # a worker from before sessions kept their turns' ends
        # Unknown (a number the session skipped, say): up to what has ended, as it stands.
        return progress.count if end is None else end

    async def progress(self) -> SessionProgress:
        """The session's progress as it stands, asked as a follower asks (``query_retrying``):
        bounded, as the server holds a query to a run that has just continued as new until
        that run's first workflow task."""
        progress: SessionProgress = await query_retrying(self.handle, SessionWorkflow.progress)
        return progress

    def transcript(self, start: int = 0, stop: int | None = None) -> AsyncIterator[Message]:
        """The messages of the running session's ended turns from index ``start`` (up to
        ``stop``), as it holds them now, read a page at a time (``read_transcript``)."""
        return read_transcript(self.handle, start, stop)

    async def cancel_turn(self) -> bool:
        """Cancel the running turn, if any (its conversation is repaired and kept; the session
        goes on). Whether there was one."""
        turn = (await self.progress()).turn
        if turn is None:
            return False
        await get_turn(self.client, turn.workflow_id).cancel()
        return True

    async def allow_rules(self, *, include_revoked: bool = False) -> list[AllowRule]:
        """The session's "always allow" rules: those of its ended turns, then those remembered
        for the session in the running turn (which join the session when that turn ends)."""
        rules = await self.handle.query(ALLOW_RULES_QUERY, result_type=list[AllowRule])
        running = (await self.progress()).turn
        if running is not None:
            known = {rule.id for rule in rules}
            in_turn = await get_turn(self.client, running.workflow_id).allow_rules()
            rules += [r for r in in_turn if r.scope == "session" and r.id not in known]
        return rules if include_revoked else [rule for rule in rules if rule.active]

    async def revoke_allow(self, rule_id: str, *, by: str = "unknown") -> AllowRule:
        """Revoke one of the session's rules, for the session and its running turn: the calls
        it covered wait for a person again. A rule remembered in the running turn is revoked
        there (it never joins the session). A refused revocation (an unknown or revoked rule)
        raises ``WorkflowUpdateFailedError`` saying why."""
        rules = await self.handle.query(ALLOW_RULES_QUERY, result_type=list[AllowRule])
        running = (await self.progress()).turn
        if running is not None and rule_id not in {rule.id for rule in rules}:
            return await get_turn(self.client, running.workflow_id).revoke_allow(rule_id, by=by)
        revoke = RevokeAllow(rule_id=rule_id, by=by)
        return await self.handle.execute_update(REVOKE_ALLOW_UPDATE, revoke, result_type=AllowRule)

    async def rewind(
        self, to_turn: int, *, by: str = "unknown", cancel_running: bool = False
    ) -> Rewind:
        """Go back to the conversation as it was once turn ``to_turn`` had ended (0: before
        the first turn, empty, or a fork's first conversation): the next message is answered
        as if the turns after it had not happened. Their workflows and messages stay, for the
        audit; the returned ``Rewind`` (also in ``rewinds()``) says who (``by``) rewound the
        session, when, and from which turn to which.

        The session refuses (``WorkflowUpdateFailedError`` saying why) while a turn runs or a
        message waits for one, unless ``cancel_running``: the running turn is cancelled first
        (its conversation repaired, as any cancelled turn's) and the rewind waits for it to
        end. It refuses a turn out of range, one a rewind took out already, or the turn it is
        at; a session that has ended raises ``SessionClosedError``."""
        request = RewindRequest(to_turn=to_turn, by=by)
        # One update id per attempt's request, as for `send`: a repeat gets the first's answer.
        update_id = uuid.uuid4().hex
        for attempt in itertools.count(1):
            if cancel_running:
                await self._cancel_running()
            try:
                return await self.handle.execute_update(
                    REWIND_UPDATE, request, id=update_id, result_type=Rewind
                )
            except WorkflowUpdateRPCTimeoutOrCancelledError as err:
                _reraise_if_cancelled(err)
            except WorkflowUpdateFailedError as err:
                # A queued message's turn was starting as the last one ended: cancel it too.
                busy = REWIND_BUSY in str(err.cause)
                if not (cancel_running and busy and attempt < _REWIND_ATTEMPTS):
                    raise
                update_id = uuid.uuid4().hex
            except RPCError as err:
                if await self._running():
                    raise
                raise SessionClosedError(
                    f"session {self.session_id!r} has ended: it cannot be rewound"
                ) from err
        raise AssertionError("unreachable")

    async def _cancel_running(self) -> None:
        """Cancel the running turn, if any, and wait for it to end."""
        progress = await self.progress()
        while progress.turn is not None:
            await get_turn(self.client, progress.turn.workflow_id).cancel()
            after = await self._wait(progress.count, progress.turn.workflow_id)
            if after is None:
                return  # the session has ended: the rewind says so
            progress = after

    async def rewinds(self) -> list[Rewind]:
        """The session's rewinds, in order: who rewound it, when, from which turn to which.
        Read from Temporal's record of it, so no worker is needed (``turnkeep show`` of a
        session whose worker is down): a closed session's result, else what its current run
        carried over, then the rewinds that run answered."""
        described = await self.handle.describe()
        if described.status == WorkflowExecutionStatus.COMPLETED:
            return (await self.handle.result()).rewinds
        converter = self.client.data_converter
        rewinds: list[Rewind] = []
        accepted: set[int] = set()
        handle = self.client.get_workflow_handle(self.session_id, run_id=described.run_id)
        async for event in handle.fetch_history_events():
            if event.HasField("workflow_execution_started_event_attributes"):
                started = event.workflow_execution_started_event_attributes.input.payloads
                if len(started) == 2:  # a run continued as new: the state it carried
                    [state] = await converter.decode(started[1:], [_CarriedRewinds])
                    rewinds = list(cast(_CarriedRewinds, state).rewinds)
            elif event.HasField("workflow_execution_update_accepted_event_attributes"):
                request = event.workflow_execution_update_accepted_event_attributes.accepted_request
                if request.input.name == REWIND_UPDATE:
                    accepted.add(event.event_id)
            elif event.HasField("workflow_execution_update_completed_event_attributes"):
                done = event.workflow_execution_update_completed_event_attributes
                if done.accepted_event_id in accepted and done.outcome.HasField("success"):
                    [record] = await converter.decode(done.outcome.success.payloads, [Rewind])
                    rewinds.append(cast(Rewind, record))
        return rewinds

    async def fork(self, at: int, **options: Unpack[ForkOptions]) -> SessionHandle:
        """A new session whose conversation is this one's first ``at`` messages (counted from
        1, as ``turnkeep show`` prints them), then ``message`` if given; this one is untouched.
        ``options``: ``agent``, ``model``, ``message``, ``session_id``, ``task_queue``
        (``turnkeep.client.forks.ForkOptions``)."""
        from turnkeep.client.forks import fork

        return await fork(self.client, self.session_id, at=at, **options)

    async def close(self) -> None:
        """Answer what is queued, then end the session; its result is the conversation."""
        await self.handle.execute_update(SessionWorkflow.close)

    async def result(self) -> SessionResult:
        return await self.handle.result()

    async def _wait(self, after: int, seen: str | None) -> SessionProgress | None:
        """The session's progress once it differs from what the caller knows (more messages,
        another turn running or none, the session ending); None once the session has
        closed. Asked by query (``poll_query``)."""

        def news(progress: SessionProgress) -> bool:
            running = progress.turn.workflow_id if progress.turn else None
            return progress.count > after or running != seen or progress.closed

        progress: SessionProgress | None = await poll_query(
            self.handle, SessionWorkflow.progress, news
        )
        return progress

    async def _running(self) -> bool:
        return (await self.handle.describe()).status == WorkflowExecutionStatus.RUNNING

    async def described(self) -> WorkflowExecutionDescription | None:
        """The session's workflow, described; None when no session has this id (no workflow
        at all, or one of another kind)."""
        try:
            described = await self.handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return None
            raise
        return described if described.workflow_type == SESSION_WORKFLOW_NAME else None


class SessionView(BaseModel):
    """A session as its turns' histories record it: what ``turnkeep show SESSION`` prints."""

    session_id: str
    status: str  # open, closed, or how it ended otherwise (``session_state``)
    turns: list[TurnView]
    rewinds: list[Rewind] = []  # in order (``SessionHandle.rewinds``)


async def read_session(client: Client, session_id: str) -> SessionView | None:
    """The session ``session_id``, open or closed, read from its turns' histories (no worker
    needed, as for ``read_turn``); None when no session has that id."""
    described = await get_session(client, session_id).described()
    if described is None:
        return None
    turns: list[TurnView] = []
    # Turn ids are `<session id>/turn-<n>` from 1 up: read them until one is missing (the next
    # turn, not started yet). A number whose id another client's workflow held when the session
    # got to it was skipped (SessionWorkflow): that workflow is not the session's to show.
    for n in itertools.count(1):
        turn_id = f"{session_id}/turn-{n}"
        parent = await _parent(client, turn_id)
        if parent is None:
            break
        if parent == session_id:
            turns.append(await read_turn(client, turn_id))
    rewinds = await get_session(client, session_id).rewinds()
    return SessionView(
        session_id=session_id,
        status=session_state(described.status),
        turns=turns,
        rewinds=rewinds,
    )


def turn_number(turn_id: str) -> int:
    """The number of a session's turn, from its id (``<session id>/turn-<n>``)."""
    return int(turn_id.rsplit("/turn-", 1)[1])


def session_state(status: WorkflowExecutionStatus | None) -> str:
    """A session's state in one word wherever it is shown (``sessions``, ``show``): ``open``
    while its workflow runs, ``closed`` once it ended as a session ends, else how it ended
    (``terminated``, ``failed``, ``timed out``...)."""
    if status == WorkflowExecutionStatus.RUNNING:
        return "open"
    if status in (None, WorkflowExecutionStatus.COMPLETED):
        return "closed"
    if status == WorkflowExecutionStatus.CANCELED:
        return "cancelled"
    return status.name.lower().replace("_", " ")


async def _parent(client: Client, workflow_id: str) -> str | None:
    """The id of the workflow that started ``workflow_id`` ("" if a client did); None when
    there is no such workflow."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    return described.parent_id or ""


def _reraise_if_cancelled(err: Exception) -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        # The SDK turns our cancellation into this error; give it back as one.
        raise asyncio.CancelledError() from err


class _CarriedRewinds(BaseModel):
    """The one field of a session's carried state that ``SessionHandle.rewinds`` reads."""

    rewinds: list[Rewind] = []
