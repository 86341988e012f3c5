"""``SessionWorkflow``: one conversation as one durable workflow, each of its turns a child
``TurnWorkflow`` (readable on its own in the Web UI).

``send`` queues a message; turns run one at a time, in order, each with the conversation so
far as its ``history`` (by reference once it is stored, which each turn extends by a segment of
its own: ``turnkeep.contract.conversation``, ``session_turns``) and everything queued since
the last turn began as its ``messages`` (messages that arrive while a turn runs are answered
together by the next one; with ``on_new_message: interrupt`` such a message first cancels the
running turn). A cancelled turn's repaired conversation is kept, and the session goes on.
Between turns the session continues as new every ``turns_per_run`` turns, or sooner when
Temporal suggests it, carrying the conversation by reference. ``close`` or ``idle_timeout``
seconds without a message end it; its result is the conversation.

Followers ask ``progress``, long-poll ``wait_for_messages`` and read ``transcript``: every
turn's messages in order, indexed across turns and runs, with the running turn's id so a
client can follow it live (``turnkeep.client.sessions``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, NamedTuple

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import Priority, RawValue
from temporalio.exceptions import (
    ApplicationError,
    ChildWorkflowError,
    FailureError,
    WorkflowAlreadyStartedError,
)

from turnkeep.contract.approval import (
    ALLOW_RULES_QUERY,
    REVOKE_ALLOW_UPDATE,
    SESSION_RULE_REVOKED_SIGNAL,
    AllowRule,
    RevokeAllow,
    revoke_problem,
    revoked,
)
from turnkeep.contract.conversation import ConversationRef
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import page_end
from turnkeep.contract.rewind import REWIND_UPDATE, REWINDS_QUERY, Rewind, RewindRequest
from turnkeep.contract.session_io import (
    SESSION_WORKFLOW_NAME,
    RunningTurn,
    Sent,
    SessionInput,
    SessionProgress,
    SessionResult,
    SessionState,
)
from turnkeep.contract.turn_io import HistoryChange, Spent, TurnCancelledError
from turnkeep.workflows import session_rewind, visibility, worker_cache
from turnkeep.workflows.child_turn import start_child, turn_child_result
from turnkeep.workflows.conversation_cache import conversations
from turnkeep.workflows.session_fork import forked_state, without_conversation
from turnkeep.workflows.session_turns import ConversationJson, TurnOutcome, decode, take_in
from turnkeep.workflows.starting import handler_argument, start_arguments
from turnkeep.workflows.task_priority import temporal_priority

# The line a session logs for a turn that failed (`turnkeep chat` says it in its own words).
TURN_FAILED_LOG = "turn %s failed: %s"

_SEND_USAGE = (
    'send takes one argument: the text of a user message, or a user Message such as {"role": '
    '"user", "content": [{"type": "text", "text": "hello"}]}'
)


@workflow.defn(name=SESSION_WORKFLOW_NAME)
class SessionWorkflow:
    # As TurnWorkflow: any client may start this with any arguments, so they are taken as they
    # come and checked here, and a bad start fails the workflow from `run`.
    @workflow.init
    def __init__(self, *args: Any) -> None:
        self._start: _Start | ApplicationError
        forked: SessionState | None = None
        try:
            self._start = _start_arguments(args)
            if self._start.carried is None:
                forked = forked_state(self._start.session)
        except ApplicationError as err:
            self._start = err
        self._state = (
            self._start.carried
            if isinstance(self._start, _Start) and self._start.carried
            else forked or SessionState()
        )
        self._turn: RunningTurn | None = None
        # The conversation's JSON, message by message, from which each turn's input is written.
        self._history_json = ConversationJson()
        # The running turn's child workflow, until an interrupting message cancels it.
        self._child: workflow.ChildWorkflowHandle[Any, RawValue] | None = None
        self._interrupts = (
            isinstance(self._start, _Start) and self._start.session.on_new_message == "interrupt"
        )
        self._started = self._state.turns  # turns whose child workflow has started
        # Turn numbers skipped because another workflow held the id, to the number used.
        self._renumbered: dict[int, int] = {}
        # Turns whose outcome the session has taken in: every carried one (a run continues as
        # new between turns). Counted apart from `turns`, which goes up before a turn starts.
        self._turns_ended = self._state.turns
        self._ended = False  # no turn runs and none will: followers stop
        self._continuing = False  # about to continue as new: followers ask the next run
        # The session may upsert only the attributes its start request set (those are
        # registered: a start naming an unknown one is refused); a run continued from another
        # inherits them.
        self._published = visibility.published_values(workflow.info().typed_search_attributes)
        self._allowed = set(self._published)

    @property
    def task_priority(self) -> Priority:
        """What the session's turns and activities carry (``task_priority``): the priority and
        tenant it was opened with (each turn's own plan may lower the priority further)."""
        if isinstance(self._start, ApplicationError):
            return Priority.default
        session = self._start.session
        return temporal_priority(session.priority or "normal", session.tenant)

    @workflow.run
    async def run(self, *args: Any) -> SessionResult:
        del args
        if isinstance(self._start, ApplicationError):
            raise self._start
        session = self._start.session
        state = self._state
        if state.rewinds:  # a run continued from one that rewound says so too
            workflow.set_current_details(session_rewind.rewinds_details(state.rewinds))
        turns_this_run = 0
        while True:
            if self.idle():
                # Until a message comes, which may be in months (`worker_cache`).
                worker_cache.leave_cache_when_idle()
            try:
                await workflow.wait_condition(
                    lambda: bool(state.queued) or state.closing,
                    timeout=session.idle_timeout,
                    timeout_summary="idle timeout",
                )
            except TimeoutError:
                state.closing = True
            if not state.queued:
                break  # closing, with every message answered
            worker_cache.stay_in_cache()
            await self._run_turn(session)
            turns_this_run += 1
            if _continue_as_new_due(turns_this_run, session) and not (
                state.closing and not state.queued
            ):
                self._continuing = True
                await workflow.wait_condition(workflow.all_handlers_finished)
                if state.conversation is not None:
                    # For the next run, if this worker runs it (``conversation_cache``).
                    conversations.put(state.conversation, state.transcript, kind="transcript")
                workflow.continue_as_new(args=[without_conversation(session), self._state])
        self._ended = True
        self._publish(visibility.TurnStatus.COMPLETED)
        await workflow.wait_condition(workflow.all_handlers_finished)
        return SessionResult(
            history=state.history,
            transcript=state.transcript,
            conversation=state.conversation,
            turns=state.turns,
            tokens=state.tokens,
            turn_ends=state.turn_ends,
            rewinds=state.rewinds,
        )

    async def _run_turn(self, session: SessionInput) -> None:
        state = self._state
        messages, state.queued = state.queued, []
        state.turns += 1
        turn_id = _turn_id(state.turns)
        ref = state.conversation
        if ref is None and not state.history and not state.transcript:
            # The session's first turn: an empty conversation by reference, so a worker that
            # stores segments hands back the start of a stored one.
            ref = ConversationRef(owner=workflow.info().workflow_id)
        rules = [r for r in state.allow_rules if r.active]
        turn = self._history_json.turn_input(
            session.agent,
            state.history,
            messages,
            ref,
            state.spent,
            rules,
            session.model,
            priority=session.priority,
            tenant=session.tenant,
        )
        while True:
            try:
                child = await start_child(turn, messages[-1], RawValue, id=turn_id, task_queue=None)
                break
            except WorkflowAlreadyStartedError:
                # A workflow this session did not start runs under the turn's id (any client
                # may start one): the next number answers the same messages, and the session
                # goes on rather than failing.
                workflow.logger.warning("turn id %s is taken; starting the next", turn_id)
                self._renumbered[state.turns] = state.turns + 1
                state.turns += 1
                turn_id = _turn_id(state.turns)
        self._turn = RunningTurn(workflow_id=turn_id, start=len(state.transcript))
        self._child = child
        self._started = state.turns
        self._publish(visibility.TurnStatus.RUNNING)
        cancelled: TurnCancelledError | None = None
        outcome: TurnOutcome | None = None
        try:
            result = await turn_child_result(child)
            outcome = decode(result, TurnOutcome)
            if outcome.conversation is None:
                state.history = take_in(state.history, outcome, result)
                if outcome.history_change not in (HistoryChange.APPENDED, HistoryChange.UNCHANGED):
                    session_rewind.forget_history_ends(state)
        except TurnCancelledError as err:
            cancelled = err
            if err.result is not None:
                outcome = TurnOutcome.model_validate(err.result, from_attributes=True)
                if outcome.conversation is None:
                    state.history = err.result.history
        except ChildWorkflowError as err:
            # An unknown agent, say: its messages go unanswered and the session goes on.
            workflow.logger.warning(TURN_FAILED_LOG, turn_id, err.cause or err)
        if outcome is not None:
            if outcome.conversation is not None:
                state.conversation = outcome.conversation
            state.transcript += outcome.messages
            state.tokens += sum(u.input_tokens + u.output_tokens for u in outcome.usage.values())
            if outcome.session_budget:
                state.spent = (state.spent or Spent()).after(outcome.usage, outcome.budget_raised)
            if outcome.allow_rules:
                state.allow_rules = _merged_rules(state.allow_rules, outcome.allow_rules)
        state.turn_ends[state.turns] = len(state.transcript)
        state.turn_marks[state.turns] = session_rewind.turn_mark(state)
        self._turn = None
        self._child = None
        self._turns_ended = state.turns
        self._publish(visibility.TurnStatus.RUNNING)
        task = asyncio.current_task()
        if cancelled is not None and task is not None and task.cancelling():
            # The session itself was cancelled (its turn with it): it ends cancelled, after
            # keeping the repaired conversation above for its watchers.
            self._ended = True
            raise cancelled

    def idle(self) -> bool:
        """Whether the session waits for a message: no turn runs, none is queued, and it is not
        closing (a pure read, also made after each query by the worker's ``CacheRelease``)."""
        state = self._state
        return not (self._turn or state.queued or state.closing or self._ended)

    def _publish(self, status: visibility.TurnStatus) -> None:
        values: visibility.SearchAttributeValues = {
            visibility.AGENT.name: self._agent(),
            visibility.STATUS.name: status.value,
            visibility.ITERATIONS.name: self._state.turns,
            visibility.TOKENS.name: self._state.tokens,
        }
        updates = visibility.search_attribute_updates(values, self._published, self._allowed)
        if updates:
            workflow.upsert_search_attributes(updates)
            self._published = {**self._published, **values}

    def _agent(self) -> str:
        return self._start.session.agent if isinstance(self._start, _Start) else ""

    # Arguments are taken as they come and checked by the validators (see TurnWorkflow's
    # wait_for_messages): a bad call is rejected and the session goes on unaffected.
    @workflow.update
    async def send(self, *args: Any) -> Sent:
        """Queue one user message; returns once the turn that answers it has started, or, when
        a turn is running, with the id of the next turn, which will answer it."""
        state = self._state
        number = state.turns + 1
        queued = self._turn is not None
        state.queued.append(_sent_message(args))
        if self._child is not None and self._interrupts:
            # Cancel once: the turn repairs its conversation and ends, then the next turn
            # answers this message with any others queued meanwhile.
            self._child.cancel()
            self._child = None
        if not queued:
            # A run about to continue as new carries the message to the next run's turn.
            await workflow.wait_condition(lambda: self._started >= number or self._continuing)
            while number in self._renumbered:
                number = self._renumbered[number]
        return Sent(turn_id=_turn_id(number), turn=number, queued=queued)

    @send.validator
    def _check_send(self, *args: Any) -> None:
        if self._state.closing or self._ended:
            raise _invalid("the session is closed: it takes no more messages")
        _sent_message(args)

    @workflow.update
    async def close(self, *args: Any) -> None:
        """Answer what is queued, then end. A closed session's result is its conversation."""
        del args
        self._state.closing = True

    @close.validator
    def _check_close(self, *args: Any) -> None:
        if args:
            raise _invalid(f"close takes no arguments; got {len(args)}")

    @workflow.update(name=REVOKE_ALLOW_UPDATE)
    async def revoke_allow(self, *args: Any) -> AllowRule:
        """Revoke one of the session's "always allow" rules: one argument, a ``RevokeAllow``.
        The running turn, which was handed the rule, is told to drop it too."""
        revoke = RevokeAllow.model_validate(args[0])
        rules = self._state.allow_rules
        i = next(i for i, r in enumerate(rules) if r.id == revoke.rule_id)
        rules[i] = revoked(rules[i], revoke.by, workflow.now())
        if self._turn is not None:
            turn = workflow.get_external_workflow_handle(self._turn.workflow_id)
            try:
                await turn.signal(SESSION_RULE_REVOKED_SIGNAL, revoke)
            except FailureError as err:  # the turn ended meanwhile: nothing to tell
                workflow.logger.info("revocation not relayed to %s: %s", turn.id, err)
        return rules[i]

    @revoke_allow.validator
    def _check_revoke_allow(self, *args: Any) -> None:
        revoke = handler_argument(args, RevokeAllow, "revoke_allow", "InvalidUpdate")
        problem = revoke_problem(self._state.allow_rules, revoke.rule_id, "this session")
        if problem is not None:
            raise ApplicationError(problem, type="InvalidDecision", non_retryable=True)

    @workflow.update(name=REWIND_UPDATE)
    async def rewind(self, *args: Any) -> Rewind:
        """Go back to the conversation as it was once turn ``to_turn`` had ended: one argument,
        a ``RewindRequest`` (``session_rewind`` says what changes and what stays)."""
        request = RewindRequest.model_validate(args[0])
        record = session_rewind.rewind(
            self._state, request, owner=workflow.info().workflow_id, now=workflow.now()
        )
        workflow.set_current_details(session_rewind.rewinds_details(self._state.rewinds))
        return record

    @rewind.validator
    def _check_rewind(self, *args: Any) -> None:
        request = handler_argument(args, RewindRequest, "rewind", "InvalidUpdate")
        state = self._state
        if state.closing or self._ended:
            raise _invalid("the session is closed: it cannot be rewound")
        busy = None
        # `turns` counts a turn from before its child starts until its outcome is taken in.
        if state.turns > self._turns_ended:
            busy = f"turn {state.turns} is running"
        elif state.queued:
            busy = "a message is queued for the next turn"
        problem = session_rewind.rewind_problem(state, request, busy=busy)
        if problem is not None:
            raise _invalid(f"rewind: {problem}")

    @workflow.query(name=REWINDS_QUERY)
    def rewinds(self) -> list[Rewind]:
        """The session's rewinds, in order (who, when, from which turn to which)."""
        return self._state.rewinds

    @workflow.query(name=ALLOW_RULES_QUERY)
    def allow_rules(self) -> list[AllowRule]:
        """The session's "always allow" rules (from the turns that have ended), revoked ones
        included."""
        return self._state.allow_rules

    @workflow.update(unfinished_policy=workflow.HandlerUnfinishedPolicy.ABANDON)
    async def wait_for_messages(self, *args: Any) -> SessionProgress:
        """Long-poll with ``after`` (how many transcript messages the caller has) and
        ``seen`` (the id of the turn running when it last asked, or None): returns once the
        transcript has more, another turn runs (or none does any more), the session ends, or
        this run is about to continue as new (the caller asks again and reaches the next
        run)."""
        after: int = args[0]
        seen: str | None = args[1] if len(args) > 1 else None
        await workflow.wait_condition(
            lambda: (
                len(self._state.transcript) > after
                or (self._turn.workflow_id if self._turn else None) != seen
                or self._ended
                or self._continuing
            )
        )
        return self._progress()

    @wait_for_messages.validator
    def _check_wait_for_messages(self, *args: Any) -> None:
        # JSON's true is a bool, not a count.
        if not 1 <= len(args) <= 2 or type(args[0]) is not int:
            raise _invalid(
                "wait_for_messages takes how many of the session's messages the caller has "
                "(an integer), and optionally the id of the last turn it followed"
            )
        if len(args) == 2 and not (args[1] is None or isinstance(args[1], str)):
            raise _invalid("wait_for_messages: the turn id must be a string or null")

    @workflow.query
    def transcript(self, start: int = 0) -> list[Message]:
        """The ended turns' messages from index ``start`` on, a page of them (about 192 KB, at
        least one message; none past the end): an answer holding a long conversation whole
        would be written to payload storage whole, for every reader (``read_transcript``)."""
        transcript = self._state.transcript
        start = max(start, 0)
        return transcript[start : page_end(transcript, start)]

    @workflow.query
    def turn_end(self, turn: int) -> int | None:
        """The transcript's length once turn ``turn`` had ended; None for a turn that has not
        ended (or that the session does not know the end of: ``SessionState.turn_ends``)."""
        return self._state.turn_ends.get(turn)

    @workflow.query
    def conversation(self) -> ConversationRef | None:
        """Where the session's conversation is stored (None while it is not): what a fork of it
        goes on from by reference (``turnkeep.client.forks``)."""
        return self._state.conversation

    @workflow.query
    def progress(self) -> SessionProgress:
        return self._progress()

    def _progress(self) -> SessionProgress:
        state = self._state
        return SessionProgress(
            count=len(state.transcript),
            turn=self._turn,
            turns_ended=self._turns_ended,
            closed=self._ended,
        )


class _Start(NamedTuple):
    session: SessionInput
    # A carried conversation from a client could claim any past: only the session's own
    # earlier run hands one over.
    carried: SessionState | None


def _start_arguments(args: Sequence[Any]) -> _Start:
    """The session's input and the state a continued run carries (``starting``). A carried
    transcript this worker holds already (its last run ended here, or this run is replayed
    here) is taken as it is, and one it does not is kept for the next replay
    (``conversation_cache``)."""
    args, known = _known_transcript(args)
    start = _Start(
        *start_arguments(
            args,
            SessionInput,
            SessionState,
            usage='SessionWorkflow takes one argument, a SessionInput such as {"agent": "demo"}',
            error_type="InvalidSessionInput",
        )
    )
    carried = start.carried
    if carried is not None and carried.conversation is not None:
        if carried.conversation.owner != workflow.info().workflow_id:
            raise ApplicationError(
                "the carried state's conversation is another session's: a session's run "
                "carries only its own",
                type="InvalidSessionInput",
                non_retryable=True,
            )
        if known is not None:
            carried.transcript = list(known)
        else:
            conversations.put(carried.conversation, carried.transcript, kind="transcript")
    return start


def _known_transcript(args: Sequence[Any]) -> tuple[Sequence[Any], tuple[Message, ...] | None]:
    """``args`` without the carried transcript when this process holds it, and that transcript.
    Only a run continued as new may carry state (``start_arguments`` refuses any other), and
    the reference names the transcript's content."""
    carried = args[1] if len(args) == 2 else None
    if not isinstance(carried, dict) or not isinstance(carried.get("conversation"), dict):
        return args, None
    try:
        ref = ConversationRef.model_validate(carried["conversation"])
    except ValidationError:
        return args, None  # refused with the rest of the state
    if ref.owner != workflow.info().workflow_id:
        return args, None  # refused with the rest of the state
    known = conversations.get(ref, kind="transcript")
    if known is None:
        return args, None
    return [args[0], {**carried, "transcript": []}], known.messages


def _merged_rules(session: list[AllowRule], turn: list[AllowRule]) -> list[AllowRule]:
    """The session's rules after a turn that knew ``turn``: the session-scoped rules it set are
    added, and those it saw revoked are revoked; a rule the session has revoked meanwhile stays
    revoked, whatever the turn last knew of it."""
    merged = {rule.id: rule for rule in session}
    for rule in turn:
        if rule.scope != "session":
            continue
        known = merged.get(rule.id)
        if known is None or (known.active and not rule.active):
            merged[rule.id] = rule
    return list(merged.values())


def _continue_as_new_due(turns_this_run: int, session: SessionInput) -> bool:
    return turns_this_run >= session.turns_per_run or workflow.info().is_continue_as_new_suggested()


def _turn_id(n: int) -> str:
    return f"{workflow.info().workflow_id}/turn-{n}"


def _sent_message(args: Sequence[Any]) -> Message:
    """The user message a ``send`` carries, or an ``InvalidUpdate`` error saying what is wrong."""
    if len(args) != 1:
        raise _invalid(f"{_SEND_USAGE}; got {len(args)} arguments")
    value = args[0]
    if isinstance(value, str):
        if not value.strip():
            raise _invalid("send: the message is empty")
        return Message.user(value)
    if not isinstance(value, dict):
        raise _invalid(f"{_SEND_USAGE}; got {type(value).__name__}")
    try:
        message = Message.model_validate(value)
    except ValidationError as err:
        raise _invalid(f"send: not a Message: {err}") from None
    if message.role != "user" or message.tool_calls:
        raise _invalid("send: a session takes user messages only")
    return message


def _invalid(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidUpdate", non_retryable=True)
