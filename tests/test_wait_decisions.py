"""Every kind of wait decides as it did when ``TurnState`` was split by feature: a sample of the
decisions a person may send (each kind, in and out of a session, every field of ``Decision``
set or not) checked and taken on a waiting call, and each kind's timeout, against what they
gave then (``wait_decisions.json``). Refusal texts, records and the state a decision leaves are
the contract clients and carried-over turns rely on: a change here is a change of behaviour.

``python -m tests.test_wait_decisions`` writes the file again, for a change meant as one."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.test_loop import plan
from turnkeep.contract.activity_io import (
    BudgetPlan,
    ClientTool,
    ClientToolsPlan,
    ToolCallRequest,
    ToolSpec,
)
from turnkeep.contract.approval import ApprovalPlan, Decision
from turnkeep.contract.server_requests import ServerRequest, ServerRequestPlan
from turnkeep.contract.turn_io import TurnInput, Usage
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.waits import approval, budget_raise, client_tool, kinds, server_ask

RECORDED = Path(__file__).with_name("wait_decisions.json")
NOW = datetime(2025, 1, 1, tzinfo=UTC)
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
KINDS = ["approval", "client_result", "elicitation", "sampling", "budget"]
# One refusal in so many of the whole grid (25,920 cases, all but a few refused) is recorded,
# spread over it; every decision taken is.
STRIDE = 433
# What a decision changes of the state (the rest is the turn's conversation and plan).
CHANGED = {
    "pending_approvals",
    "decisions",
    "allow_rules",
    "budget_limit",
    "budget_raised",
    "budget_passed",
    "done",
    "stop_reason",
}


def waiting(kind: str, in_session: bool) -> tuple[TurnState, str]:
    """A turn in which a call of ``kind`` waits (and an approval besides, for "always allow"),
    and the id it waits under."""
    state = TurnState.start(
        TurnInput(agent="a", messages=["hi"]),
        plan(
            agent="a",
            model="m",
            max_iterations=5,
            approval=ApprovalPlan(tools=["*"], timeout=33),
            client_tools=ClientToolsPlan(
                tools=[ClientTool(spec=ToolSpec(name="client__p"), output_schema=SCHEMA)],
                timeout=44,
            ),
            server_requests={
                "srv": ServerRequestPlan(elicitation="forms", sampling=True, sampling_approval=True)
            },
            budget=BudgetPlan(unit="tokens", limit=100, max_raise=1000, timeout=55),
        ),
        in_session=in_session,
    )
    state.usage = {"m": Usage(input_tokens=60, calls=1)}
    name = {"elicitation": "srv__t", "sampling": "srv__t", "client_result": "client__p"}
    call = ToolCallRequest(agent="a", call_id="c1", name=name.get(kind, "x__y"), arguments={"q": 1})
    wait_id = "c1"
    if kind == "approval":
        approval.hold(state, call, NOW)
    elif kind == "client_result":
        client_tool.hold(state, call, NOW)
    elif kind in ("elicitation", "sampling"):
        schema = SCHEMA if kind == "elicitation" else None
        request = ServerRequest(
            kind=kind, digest="d", server="srv", message="m?", requested_schema=schema
        )
        wait_id = f"c1:{kind}:1"
        server_ask.hold(state, call, wait_id, request, NOW)
    else:
        wait_id = budget_raise.hold(state, "over", NOW).call_id
    other = ToolCallRequest(agent="a", call_id="c2", name="x__y", arguments={"q": 1})
    approval.hold(state, other, NOW)
    return state, wait_id


def after(state: TurnState) -> dict[str, Any]:
    return {
        **state.model_dump(mode="json", include=CHANGED),
        "last_message": state.messages[-1].model_dump(mode="json") if state.messages else None,
        "server_answers": {k: v.model_dump(mode="json") for k, v in state.server_answers.items()},
        "submitted": {k: v.model_dump(mode="json") for k, v in state.submitted.items()},
        "server_asks": sorted(state.server_asks),
    }


def outcome(kind: str, in_session: bool, fields: dict[str, Any]) -> list[Any]:
    """What a decision (``fields``) on a waiting call of ``kind`` gives: the validator's refusal,
    or None with the record (where it is among the state's decisions) and the state it
    leaves."""
    state, wait_id = waiting(kind, in_session)
    decision = Decision.model_validate({"call_id": wait_id, "by": "b", **fields})
    problem = kinds.decision_problem(state, decision)
    if problem is not None:
        return [problem]
    record = kinds.decide(state, decision, NOW, "rule-x" if decision.remember else None)
    # The record is among the state's decisions (an "always allow" rule may add others).
    return [None, state.decisions.index(record), after(state)]


def timeouts() -> list[Any]:
    """Each kind's timeout, and the budget's stop after one."""
    rows: list[Any] = []
    for kind in KINDS:
        state, wait_id = waiting(kind, False)
        record = kinds.KINDS[state.pending_approvals[wait_id].kind].time_out(state, wait_id, NOW)
        again = kinds.decision_problem(state, Decision(call_id=wait_id, decision="approve", by="b"))
        rows.append([kind, record.model_dump(mode="json"), after(state), again])
    state, wait_id = waiting("budget", False)
    exceeded = [budget_raise.exceeded(state, n) for n in (10, 50)]
    budget_raise.stop(state, "over", kinds.KINDS["budget"].time_out(state, wait_id, NOW))
    rows.append(["budget stopped", exceeded, budget_raise.spent(state), after(state)])
    return rows


def test_every_kind_of_wait_decides_as_recorded() -> None:
    recorded = json.loads(RECORDED.read_text(encoding="utf-8"))
    for kind, in_session, fields, *expected in recorded["decisions"]:
        assert json.loads(json.dumps(outcome(kind, in_session, fields))) == expected, fields
    assert json.loads(json.dumps(timeouts())) == recorded["timeouts"]


def record() -> None:
    """Write the file again: every decision the turn takes, and one refusal in ``STRIDE``."""
    keys = ["decision", "arguments", "remember", "remember_arguments", "content", "cancel"]
    grid = itertools.product(
        KINDS,
        [False, True],
        ["approve", "deny"],
        [None, {}, {"q": 2}],
        [None, "turn", "session"],
        [False, True],
        [None, {}, {"n": 3}],
        [False, True],
        [None, {"structured_content": {"n": 1}}, {"content": []}],
        [None, 50.0, 500.0, 5000.0],
    )
    rows: list[Any] = []
    for i, (kind, in_session, *values) in enumerate(grid):
        fields = {
            k: v
            for k, v in zip([*keys, "result", "limit"], values, strict=True)
            if v is not None and v is not False
        }
        got = outcome(kind, in_session, fields)
        if got[0] is None or i % STRIDE == 0:
            rows.append([kind, in_session, fields, *got])
    lines = ",\n".join(json.dumps(row, sort_keys=True) for row in rows)
    timed_out = ",\n".join(json.dumps(row, sort_keys=True) for row in timeouts())
    text = f'{{"decisions": [\n{lines}\n],\n"timeouts": [\n{timed_out}\n]}}\n'
    RECORDED.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    record()
