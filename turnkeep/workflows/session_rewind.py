"""How a ``SessionWorkflow`` goes back to an earlier turn (its ``rewind`` update): what it keeps
of each turn as it ends (``turn_mark``), which rewinds it refuses (``rewind_problem``) and what a
rewind changes (``rewind``). Pure functions of the session's state, for workflow code.

What a rewind changes, and what it does not:

- The conversation the next turn sees goes back to turn ``to_turn``'s: by reference when it is
  stored (the history's chain of segments ends where it ended then; no message is copied), else
  the history the session holds, cut to its length then.
- The transcript does not: every message of every turn stays, indices and all, and the
  next turn's segment chains on from its end, so the rewound turns' messages stay stored for
  ``show`` and the audit, and payload storage's collection keeps them with the session's.
- Turn numbers keep counting up: the next turn is ``turns + 1``, never a rewound turn's id.
- Money spent stays spent: the per-session budget's ``spent`` and the token count are not
  rewound.
- "Always allow" rules that rewound turns set are revoked (kept, marked, for the audit): a
  rewind never leaves a permission granted in a conversation that no longer happened.
"""

from __future__ import annotations

from datetime import datetime

from turnkeep.contract.approval import revoked
from turnkeep.contract.conversation import ConversationRef
from turnkeep.contract.rewind import REWIND_BUSY, Rewind, RewindRequest, TurnMark, rewound
from turnkeep.contract.session_io import SessionState


def turn_mark(state: SessionState) -> TurnMark:
    """Where ``state`` stands once a turn has ended (and its outcome is taken in)."""
    ref = state.conversation
    if ref is not None:
        return TurnMark(
            conversation=ref.model_copy(update={"transcript": ref.head}),
            rules=len(state.allow_rules),
        )
    return TurnMark(history_end=len(state.history), rules=len(state.allow_rules))


def forget_history_ends(state: SessionState) -> None:
    """After a turn that rewrote a conversation the session holds itself (a compaction): the
    earlier turns' history lengths no longer cut it where it was."""
    for mark in state.turn_marks.values():
        mark.history_end = None


def current_turn(state: SessionState) -> int:
    """The last ended turn the conversation still holds (0: none)."""
    return max(
        (n for n in state.turn_ends if rewound(state.rewinds, n) is None),
        default=0,
    )


def rewind_problem(state: SessionState, request: RewindRequest, *, busy: str | None) -> str | None:
    """Why the session refuses to rewind to ``request.to_turn``, or None. ``busy``: what is
    under way (a running turn, a queued message) that a rewind would race with."""
    if busy is not None:
        return (
            f"{busy}: {REWIND_BUSY}. Cancel the running turn first "
            "(SessionHandle.cancel_turn, or Ctrl-C in `turnkeep chat`), wait for it to end, "
            "then rewind"
        )
    to, current = request.to_turn, current_turn(state)
    if to > state.turns or (to and to not in state.turn_ends):
        return (
            f"turn {to} is not one of this session's ended turns; its last is turn {current} "
            f"(rewind to 0 for the conversation it started with)"
        )
    undone = rewound(state.rewinds, to)
    if undone is not None:
        return f"turn {to} was itself {undone.describe()}; fork it to go on from it"
    if to == current:
        return f"the session is at turn {to} already: nothing to rewind"
    if to == 0 and 0 not in state.turn_marks:
        return None  # the empty conversation (a fork's turn 0 is the one it started with)
    mark = state.turn_marks.get(to)
    if mark is None:
        return f"the session does not know where turn {to}'s conversation ended: it cannot go back"
    if state.conversation is not None and mark.conversation is None:
        return f"turn {to}'s conversation was not stored: the session cannot go back to it"
    if state.conversation is None and mark.history_end is None:
        return f"turn {to}'s conversation was compacted since: the session cannot go back to it"
    return None


def rewind(state: SessionState, request: RewindRequest, *, owner: str, now: datetime) -> Rewind:
    """Rewind ``state`` (checked by ``rewind_problem``) to ``request.to_turn``; the record of it,
    also appended to ``state.rewinds``."""
    to = request.to_turn
    mark = state.turn_marks.get(to, TurnMark(history_end=0))
    ref = state.conversation
    if ref is not None:
        # The history as it was; the transcript goes on from where it is now.
        base = mark.conversation or ConversationRef(owner=owner)
        state.conversation = base.model_copy(update={"transcript": ref.transcript})
    else:
        state.history = state.history[: mark.history_end or 0]
    by = f"rewind:{request.by}"
    state.allow_rules = [
        revoked(rule, by, now) if i >= mark.rules and rule.active else rule
        for i, rule in enumerate(state.allow_rules)
    ]
    record = Rewind(
        to_turn=to,
        from_turn=current_turn(state),
        by=request.by,
        at=now,
        at_message=len(state.transcript),
        turns=state.turns,
    )
    state.rewinds.append(record)
    return record


def rewinds_details(rewinds: list[Rewind]) -> str:
    """The session's current details in the Web UI (markdown): its rewinds, the last first."""
    lines = [f"- {r.describe()}" for r in reversed(rewinds[-10:])]
    more = len(rewinds) - 10
    if more > 0:
        lines.append(f"- and {more} earlier")
    return "**rewinds**\n\n" + "\n".join(lines)
