"""Forks: a new session whose conversation is another's first messages (``SessionHandle.fork``,
``TurnHandle.fork``, ``turnkeep fork``).

The source is read from Temporal's own record of it (a session's stored conversation or its
transcript; a turn's history) and left untouched. The fork is a ``SessionWorkflow`` like any
other, whose start the workflow checks as any start (``turnkeep.workflows.session_fork``): it
carries messages only, never the source's allow rules, budget spent or turn count. Where the
source's conversation is stored, the fork goes on from its segments by reference
(``ConversationCodec.prefix`` and ``store_fork``) and stores only the messages after the last
whole segment it shares; otherwise it starts with the messages themselves.

Messages are counted as ``turnkeep show`` prints them, from 1: a session's every turn's
messages in order (its transcript), a turn's own messages (after the history it was given,
which a fork of it keeps). After a rewind, a session's transcript holds rewound turns'
messages before later turns': a message there forks as its turn, the conversation as it
stood at that message. A cut between an assistant's tool calls and their results is closed
as cancellation closes one: each call answered as interrupted.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Sequence
from typing import TypedDict, Unpack, cast

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.queries import query_retrying
from turnkeep.client.sessions import SessionHandle, get_session, read_transcript, start_session
from turnkeep.client.turns import get_turn
from turnkeep.contract.conversation import ConversationRef
from turnkeep.contract.messages import Message
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME, ForkOrigin, SessionInput
from turnkeep.contract.turn_io import TaskPriority, TurnInput
from turnkeep.payloads.conversations import ConversationCodec
from turnkeep.workflows import visibility
from turnkeep.workflows.repair import repair_dangling_tool_calls
from turnkeep.workflows.session_turns import TurnOutcome
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME


class ForkError(ValueError):
    """A fork that cannot be made: no such source, a message index out of its range."""


class ForkOptions(TypedDict, total=False):
    """What a fork may be given besides its source and ``at``: its ``agent`` (by default the
    source's) and the ``model`` of its turns (where the agent's config lets a turn choose), a
    ``message`` to send it at once, its ``session_id`` and ``task_queue`` (by default as
    ``open_session``'s), and its turns' ``priority`` and ``tenant`` (``TurnInput``'s)."""

    agent: str | None
    model: str | None
    priority: TaskPriority | None
    tenant: str | None
    message: str | Message | None
    session_id: str | None
    task_queue: str | None


async def fork(
    client: Client, source: str, *, at: int, **options: Unpack[ForkOptions]
) -> SessionHandle:
    """Start a session whose conversation is the first ``at`` messages of ``source`` (a
    session's id or a turn's), then send it ``message`` if given (``ForkOptions``). The source
    is untouched. Raises ``ForkError`` for an unknown source or an ``at`` out of range."""
    agent, model = options.get("agent"), options.get("model")
    if at < 1:
        raise ForkError(f"--at counts messages from 1 (the first message); got {at}")
    described = await described_source(client, source)
    source_agent = await agent_of(client, described)
    agent = agent or source_agent
    if not agent:
        raise ForkError(f"{source!r} names no agent: give the fork's agent")
    fork_id = options.get("session_id") or f"session-{agent}-{uuid.uuid4().hex[:12]}"
    if described.workflow_type == SESSION_WORKFLOW_NAME:
        origin, messages, ref = await _session_prefix(client, described, at, fork_id)
    else:
        origin, messages, ref = await _turn_prefix(client, described, at, fork_id)
    session = SessionInput(
        agent=agent,
        model=model,
        priority=options.get("priority"),
        tenant=options.get("tenant"),
        fork=origin,
        transcript=messages,
        conversation=ref,
    )
    handle = await start_session(
        client,
        session,
        workflow_id=fork_id,
        task_queue=options.get("task_queue"),
        summary=visibility.fork_summary(origin.source, origin.at, agent),
        fork_of=visibility.fork_of(origin.source, origin.at),
    )
    message = options.get("message")
    if message is not None:
        await handle.send(message)
    return handle


async def agent_of(client: Client, described: WorkflowExecutionDescription) -> str | None:
    """The agent a turn or session is of: its ``TurnkeepAgent`` search attribute, else the
    agent its start input named; None when neither names one."""
    agent = described.typed_search_attributes.get(visibility.AGENT)
    if agent:
        return agent
    # A namespace without turnkeep's search attributes: the agent its start input named.
    kind = SessionInput if described.workflow_type == SESSION_WORKFLOW_NAME else TurnInput
    handle = client.get_workflow_handle(described.id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        if not payloads:
            return None
        try:
            decoded = await client.data_converter.decode(payloads[:1], [kind])
        except Exception:  # not a turnkeep input: nobody's agent
            return None
        found = getattr(decoded[0], "agent", None)
        return found if isinstance(found, str) else None
    return None


async def described_source(client: Client, source: str) -> WorkflowExecutionDescription:
    """The turn or session ``source``, described; ``ForkError`` when there is none."""
    try:
        described = await client.get_workflow_handle(source).describe()
    except RPCError as err:
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise ForkError(f"no turn or session {source!r} to fork") from None
        raise
    if described.workflow_type not in (SESSION_WORKFLOW_NAME, WORKFLOW_NAME):
        raise ForkError(f"{source!r} is neither a turn nor a session of turnkeep's")
    return described


async def _session_prefix(
    client: Client, described: WorkflowExecutionDescription, at: int, fork_id: str
) -> tuple[ForkOrigin, list[Message], ConversationRef | None]:
    """The first ``at`` messages of a session: by reference where its conversation is stored
    and the client reads the same store, else read by its ``transcript`` query."""
    handle = client.get_workflow_handle(described.id)
    holding = await _turn_after_rewind(client, described, at)
    if holding is not None:
        # After a rewind the transcript is no conversation that happened: fork the turn
        # holding message `at`, as it stood then.
        turn_id, end = holding
        turn = await described_source(client, turn_id)
        return await _turn_prefix(client, turn, at, fork_id, session=(described.id, end))
    codec = client.data_converter.payload_codec
    origin = ForkOrigin(source=described.id, at=at)
    stored: ConversationRef | None = None
    if isinstance(codec, ConversationCodec):
        stored = await _stored_conversation(client, described)
    if stored is not None and isinstance(codec, ConversationCodec):
        prefix = await codec.prefix(stored, at)
        _check_range(described.id, at, len(prefix.texts))
        last = prefix.last()
        tail = _repair([last] if last is not None else [])
        ref = await codec.store_fork(prefix, fork_id, tail)
        # The workflow reads them from the store: the start records only the reference.
        return origin, [], ref
    messages = [m async for m in read_transcript(handle, 0, at)]
    _check_range(described.id, at, len(messages))
    return origin, messages + _repair(messages), None


async def _stored_conversation(
    client: Client, described: WorkflowExecutionDescription
) -> ConversationRef | None:
    """Where a session's conversation is stored, from Temporal's record of it (no worker
    needed): a closed session's result, else its current run's last ended turn, else what the
    run started from; asked of the session itself only after a cancelled turn, whose repaired
    conversation its history does not hold."""
    handle = client.get_workflow_handle(described.id)
    if described.status == WorkflowExecutionStatus.COMPLETED:
        return (await SessionHandle(handle, client).result()).conversation
    last: Payload | None = None
    started: Sequence[Payload] = ()
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            started = event.workflow_execution_started_event_attributes.input.payloads
        elif event.HasField("child_workflow_execution_completed_event_attributes"):
            payloads = event.child_workflow_execution_completed_event_attributes.result.payloads
            last = payloads[0] if payloads else None
        elif event.HasField("child_workflow_execution_canceled_event_attributes"):
            last = None
            started = ()
    if last is not None:
        [outcome] = await client.data_converter.decode([last], [TurnOutcome])
        return cast(TurnOutcome, outcome).conversation
    if len(started) == 2:  # a run continued as new: the state it carried
        [state] = await client.data_converter.decode(started[1:], [_CarriedRef])
        return cast(_CarriedRef, state).conversation
    if len(started) == 1:  # a fork's first run, or a session with no turn yet
        [session] = await client.data_converter.decode(started, [_CarriedRef])
        return cast(_CarriedRef, session).conversation
    ref: ConversationRef | None = await handle.query(SessionWorkflow.conversation)
    return ref


async def _turn_after_rewind(
    client: Client, described: WorkflowExecutionDescription, at: int
) -> tuple[str, int] | None:
    """The turn holding a session's message ``at`` and where the transcript ends with it,
    when a rewind came before that message (else None: the transcript's first ``at`` messages
    are the conversation as it stood)."""
    session = SessionHandle(client.get_workflow_handle(described.id), client)
    before = [r for r in await get_session(client, described.id).rewinds() if r.at_message < at]
    if not before:
        return None
    # Turns the session started before its last rewind ended before message `at`.
    first = max(r.turns for r in before) + 1
    if described.status == WorkflowExecutionStatus.COMPLETED:
        ends = (await session.result()).turn_ends
    else:
        ends = {}
        for turn in range(first, (await session.progress()).turns_ended + 1):
            end = await query_retrying(session.handle, SessionWorkflow.turn_end, turn)
            if end is not None:  # None: a number the session skipped
                ends[turn] = end
                if end >= at:
                    break
    for turn in sorted(n for n in ends if n >= first):
        if ends[turn] >= at:
            return f"{described.id}/turn-{turn}", ends[turn]
    _check_range(described.id, at, max(ends.values(), default=0))
    return None


class _CarriedRef(BaseModel):
    """The one field of a session's start input or carried state that a fork reads."""

    conversation: ConversationRef | None = None


async def _turn_prefix(
    client: Client,
    described: WorkflowExecutionDescription,
    at: int,
    fork_id: str,
    *,
    session: tuple[str, int] | None = None,
) -> tuple[ForkOrigin, list[Message], ConversationRef | None]:
    """The history a turn was given, then its first ``at`` messages: by reference when the
    turn is a session's whose conversation is stored (the history it ends with, which ends
    with the turn's messages), else the messages themselves. With ``session`` (the turn's
    session and where its transcript ends with the turn), ``at`` counts the session's
    messages instead, and the fork is recorded as the session's."""
    result = await get_turn(client, described.id).current()
    if result is None:
        raise ForkError(f"turn {described.id!r} has no messages yet to fork")
    own = result.messages
    origin = ForkOrigin(source=described.id, at=at)
    if session is not None:
        origin = ForkOrigin(source=session[0], at=at)
        at -= session[1] - len(own)
    _check_range(described.id, at, len(own))
    codec = client.data_converter.payload_codec
    if result.conversation is not None and isinstance(codec, ConversationCodec):
        whole = await codec.prefix(result.conversation, sys.maxsize, history=True)
        prefix = await codec.prefix(
            result.conversation, len(whole.texts) - len(own) + at, history=True
        )
        last = prefix.last()
        tail = _repair([last] if last is not None else [])
        return origin, [], await codec.store_fork(prefix, fork_id, tail)
    history = result.history
    before = history[: len(history) - len(own)] if history[-len(own) :] == own else history
    messages = [*before, *own[:at]]
    return origin, messages + _repair(messages), None


def _check_range(source: str, at: int, count: int) -> None:
    if at > count:
        raise ForkError(
            f"{source!r} has {count} message{'s' if count != 1 else ''}: --at must be from 1 "
            f"to {count}; got {at}"
        )


def _repair(messages: list[Message]) -> list[Message]:
    """The message that closes a tool batch the cut falls inside, answered as cancellation
    answers the calls it interrupts; none otherwise."""
    repair, _ = repair_dangling_tool_calls(messages, {})
    return [repair] if repair is not None else []
