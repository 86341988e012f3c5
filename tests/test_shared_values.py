"""One object per distinct plan and tool across a worker's turns (``shared.SharedValues``):
what keeps a worker with thousands of turns awaiting approval from holding a copy of the
agent's instruction and tool schemas per turn (``bench.approvals``)."""

from __future__ import annotations

import gc

from pydantic import BaseModel

from tests.test_loop import plan
from turnkeep.contract.activity_io import ToolSpec
from turnkeep.contract.turn_io import TurnInput
from turnkeep.workflows.loop import TurnState
from turnkeep.workflows.shared import SharedValues

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def tool(name: str = "srv__read", description: str = "Reads a file.") -> ToolSpec:
    # A new object each time, as each turn decodes its own from list_tools' result.
    return ToolSpec(name=name, description=description, input_schema=dict(SCHEMA))


def test_equal_values_share_one_object() -> None:
    shared = SharedValues()
    first = shared(tool())
    assert shared(tool()) is first
    assert shared(plan(instruction="Be brief.")) is shared(plan(instruction="Be brief."))


def test_different_values_do_not() -> None:
    shared = SharedValues()
    read = shared(tool())
    other = shared(tool(description="Reads a file, all of it."))
    assert other is not read
    assert other.description == "Reads a file, all of it."
    assert shared(plan(instruction="Be brief.")) is not shared(plan(instruction="Be long."))


class Left(BaseModel):
    value: int


class Right(BaseModel):
    value: int


def test_a_value_shares_only_with_its_own_class() -> None:
    """Keyed by class too: two models that dump to the same JSON never stand for each other."""
    shared = SharedValues()
    left = shared(Left(value=1))
    right = shared(Right(value=1))
    assert left.model_dump_json() == right.model_dump_json()
    assert type(right) is Right


def test_a_value_no_turn_holds_goes() -> None:
    shared = SharedValues()
    kept = shared(tool("srv__a"))
    shared(tool("srv__b"))  # held by nobody once shared
    gc.collect()
    assert len(shared) == 1
    assert shared(tool("srv__a")) is kept


def test_a_turn_keeps_the_shared_objects_themselves() -> None:
    """pydantic must not copy them on the way in (it revalidates no model instance): the turn
    and each model request hold the shared plan and tools, not a copy per turn."""
    shared = SharedValues()
    turn = TurnInput(agent="test", messages=["hi"])  # type: ignore[list-item]
    one, two = (TurnState.start(turn, shared(plan())) for _ in range(2))
    assert one.plan is two.plan
    one.tools = [shared(tool())]
    two.tools = [shared(tool())]
    assert one.tools[0] is two.tools[0]
    assert one.model_request().tools[0] is two.tools[0]
    assert one.carry(before_tools=False).plan is two.plan
