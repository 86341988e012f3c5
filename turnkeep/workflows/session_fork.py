"""A forked session's start: the conversation it begins with, checked as any start is.

A fork is a ``SessionWorkflow`` whose input carries a conversation (``SessionInput.transcript``,
by reference once stored) and where it came from (``SessionInput.fork``). Any client may start
one, so the workflow takes nothing else from it: no allow rules, no budget spent, no turn count;
the conversation must be the session's own when it is a reference (its turns would otherwise
hand another session's reference on), and must not end inside a tool batch (the client repairs
one as cancellation does: ``turnkeep.workflows.repair``).
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from turnkeep.contract.rewind import TurnMark
from turnkeep.contract.session_io import SessionInput, SessionState
from turnkeep.workflows.repair import dangling_tool_request


def forked_state(session: SessionInput) -> SessionState | None:
    """The state a fork's first run starts from (None for a session that is no fork), or a
    non-retryable ``InvalidSessionInput`` saying what is wrong with its start."""
    if session.fork is None:
        if session.transcript or session.conversation is not None:
            raise _invalid("only a fork (`fork`) starts with a conversation")
        return None
    messages = session.transcript
    if not messages:
        raise _invalid("a fork starts with at least one message of its source")
    if dangling_tool_request(messages) is not None:
        raise _invalid(
            "a fork's conversation ends with tool calls nobody answered: repair it first "
            "(turnkeep.workflows.repair), as the clients do"
        )
    ref = session.conversation
    if ref is not None and ref.owner != workflow.info().workflow_id:
        raise _invalid(
            "the fork's stored conversation is another session's: a fork stores its own "
            "(turnkeep's clients do)"
        )
    # Turn 0, what `rewind --to-turn 0` goes back to: the conversation the fork started with.
    start = (
        TurnMark(conversation=ref.model_copy(update={"transcript": ref.head}))
        if ref is not None
        else TurnMark(history_end=len(messages))
    )
    return SessionState(
        transcript=list(messages),
        # The next turn's history: by reference when stored, else the messages themselves.
        history=[] if ref is not None else list(messages),
        conversation=ref,
        turn_ends={0: len(messages)},
        turn_marks={0: start},
    )


def without_conversation(session: SessionInput) -> SessionInput:
    """What a fork's later runs are started with: its origin, not its first conversation,
    which the carried state holds (by reference) from then on."""
    if not session.transcript and session.conversation is None:
        return session
    return session.model_copy(update={"transcript": [], "conversation": None})


def _invalid(message: str) -> ApplicationError:
    return ApplicationError(message, type="InvalidSessionInput", non_retryable=True)
