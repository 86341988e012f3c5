"""What crosses between a parent workflow's ``turnkeep.workflow.run_turn`` and the activity that
reads a cancelled child turn's repaired conversation (``turnkeep/activities/child_turn.py``).

A cancelled workflow closes with no result and no details, and a workflow cannot query
another, so the parent asks an activity to query the closed child."""

from __future__ import annotations

from pydantic import BaseModel, Field

from turnkeep.workflows.turn_io import NAME_MAX_CHARS, TurnResult

READ_CHILD_TURN = "read_child_turn"


class ChildTurnRef(BaseModel):
    """A child turn of the calling workflow: the activity refuses any other."""

    # Temporal's own limit on a workflow id is 1,000 bytes; a bounded id keeps errors short.
    workflow_id: str = Field(min_length=1, max_length=5 * NAME_MAX_CHARS)


class ChildTurnState(BaseModel):
    # None for a turn cancelled before it had a plan (no conversation to repair yet).
    result: TurnResult | None
