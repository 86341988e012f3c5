"""Calls awaiting approval inside an agent's child turn reach the people watching its parent.

A turn that an agent called as a tool (``agent_tools``) tells its parent turn, by the
``child_approvals`` signal, which calls wait for a decision in it and in its own child turns,
each time that set changes; the parent keeps the latest report of each running child, so its
``pending_approvals`` query, its ``TurnkeepStatus`` and its details show them, and drops it when
the child ends. Decisions are not relayed: the parent refuses a decision on a child's call
naming the child (``DECIDED_IN_CHILD``), and the client sends it there, where the child's own
validator takes it. A signal comes with no proof of its sender, so the parent accepts a report
only for one of its running children and only about that child's turn and the turns below it:
a forged report can show a call that does not wait, never decide one.

Only turns at a depth above 0 with a parent report: a session's turns and those an application
starts are at depth 0, so their histories gain no command."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import FailureError

from turnkeep.contract.approval import CHILD_APPROVALS_SIGNAL, ChildApprovals, PendingCall
from turnkeep.workflows import pending_calls
from turnkeep.workflows.loop import TurnState


def parent_turn(depth: int) -> str | None:
    """The workflow id of the turn that called this one as a tool, or None."""
    parent = workflow.info().parent
    return parent.workflow_id if depth > 0 and parent is not None else None


async def report_to_parent(state: TurnState, parent_id: str) -> None:
    """Signal the parent turn the calls waiting here whenever they change, until the turn ends
    (the parent drops the report of a child that ended). Reports go one at a time, in order,
    each with the set as it stands when sent: a burst of changes sends the last one."""
    turn_id = workflow.info().workflow_id
    parent = workflow.get_external_workflow_handle(parent_id)
    sent: list[PendingCall] = []
    while True:
        await workflow.wait_condition(_changed(state, turn_id, sent))
        if state.done:
            return
        calls = pending_calls.reported_calls(state, turn_id)
        try:
            await parent.signal(
                CHILD_APPROVALS_SIGNAL, ChildApprovals(turn_id=turn_id, calls=calls)
            )
        except FailureError as err:  # the parent has closed: nobody to tell
            workflow.logger.warning("could not tell the parent turn of waiting calls: %s", err)
            return
        sent = calls


def _changed(state: TurnState, turn_id: str, sent: list[PendingCall]) -> Callable[[], bool]:
    return lambda: state.done or pending_calls.reported_calls(state, turn_id) != sent


def take_report(state: TurnState | None, args: Sequence[Any], children: dict[str, str]) -> bool:
    """The ``child_approvals`` signal: a child turn reports the calls waiting in it and below
    it (one argument, a ``ChildApprovals``; ``children``: the running child turns, by id).
    Whether the report was taken: a signal cannot be refused, so one that is not a report of a
    running child is logged and ignored."""
    try:
        if len(args) != 1:
            raise ValueError(f"child_approvals takes one argument; got {len(args)}")
        report = ChildApprovals.model_validate(args[0])
    except (ValueError, ValidationError) as err:
        workflow.logger.warning("ignored a child_approvals signal: %s", err)
        return False
    problem = report_problem(report, children)
    if state is None or state.done or problem is not None:
        workflow.logger.warning("ignored a child_approvals signal: %s", problem or "ended")
        return False
    if report.calls:
        state.descendant_approvals[report.turn_id] = report.calls
    else:
        state.descendant_approvals.pop(report.turn_id, None)
    return True


def report_problem(report: ChildApprovals, children: dict[str, str]) -> str | None:
    """Why the parent ignores ``report`` (``children``: its running child turns, by id), or
    None."""
    if report.turn_id not in children:
        return f"{report.turn_id!r} is not a running child turn of this turn"
    below = report.turn_id + "/"
    for call in report.calls:
        if call.turn_id is None or not (
            call.turn_id == report.turn_id or call.turn_id.startswith(below)
        ):
            return f"call {call.call_id!r} is not of turn {report.turn_id!r} or of a turn below it"
    return None
