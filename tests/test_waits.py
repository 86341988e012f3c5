"""The kinds of wait (``turnkeep.workflows.waits``): every kind the contract names has its
module behind the one interface, and the budget's ledger opens where the plan says."""

from __future__ import annotations

from typing import get_args

from turnkeep.contract.activity_io import BudgetPlan
from turnkeep.contract.approval import WaitKind
from turnkeep.contract.turn_io import Spent
from turnkeep.workflows import budget_math
from turnkeep.workflows.waits.base import Wait
from turnkeep.workflows.waits.kinds import KINDS


def test_every_kind_of_wait_is_decided_by_its_own_module() -> None:
    assert set(KINDS) == set(get_args(WaitKind))
    for kind, wait in KINDS.items():
        assert isinstance(wait, Wait) and wait.kind == kind


def test_a_budget_opens_with_what_the_session_raised_it_by_up_to_the_ceiling() -> None:
    plan = BudgetPlan(unit="tokens", limit=100, per="session", max_raise=150)
    assert budget_math.opening_limit(plan, None) == 100
    assert budget_math.opening_limit(plan, Spent(raised=30)) == 130
    assert budget_math.opening_limit(plan, Spent(raised=90)) == 150
    assert budget_math.amount(12000, "tokens") == "12,000 tokens"
