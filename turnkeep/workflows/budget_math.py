"""The budget's arithmetic: its limit at the start, what counts against it, and whether the next
model call would pass it. Pure numbers over the plan and the usage, so the loop (which sets the
opening limit) and the budget's wait (``waits.budget_raise``, which applies them to the turn's
state) share them."""

from __future__ import annotations

from collections.abc import Iterable

from turnkeep.contract.activity_io import BudgetPlan
from turnkeep.contract.turn_io import BudgetUnit, Spent, Usage


def opening_limit(budget: BudgetPlan, session_spent: Spent | None) -> float:
    """The budget a turn starts with: the plan's, plus what people raised its session's budget
    by in earlier turns, never past the most the agent lets people raise it to."""
    raised = session_spent.raised if session_spent else 0.0
    ceiling = budget.max_raise
    limit = budget.limit + raised
    return limit if ceiling is None else min(limit, max(ceiling, budget.limit))


def spent(budget: BudgetPlan, usage: Iterable[Usage], earlier: Spent | None) -> float:
    """What counts against ``budget``, in its unit: every token (or dollar) of ``usage``, and
    for a budget per session what the session's earlier turns spent (``earlier``). A dollar
    budget counts the priced part (the worker refuses one on an agent whose own models have no
    price)."""
    if budget.unit == "tokens":
        return float(sum(u.tokens for u in usage) + (earlier.tokens if earlier else 0))
    return sum(u.cost_usd or 0.0 for u in usage) + (earlier.usd if earlier else 0.0)


def exceeded(
    budget: BudgetPlan, limit: float, spent: float, estimated_input_tokens: int
) -> str | None:
    """Why the next model call would pass ``limit``, or None: what is ``spent`` has reached it,
    or what is spent plus the next call's estimated input (its tokens, or their cost at the
    plan's input price) is over it. The output cannot be known before the call, and a call is
    never stopped halfway: one call may end past the budget, and the next asks."""
    said = f"spent {amount(spent, budget.unit)} of {amount(limit, budget.unit)}"
    if spent >= limit:
        return said
    if budget.unit == "tokens":
        upcoming = float(estimated_input_tokens)
    else:
        upcoming = estimated_input_tokens * (budget.input_usd_per_token or 0.0)
    if spent + upcoming > limit:
        about = amount(upcoming, budget.unit)
        return f"{said}; the next model call's input, about {about}, would pass it"
    return None


def amount(value: float, unit: BudgetUnit) -> str:
    """``12,000 tokens``, ``1.25 USD``: an amount of a budget as a person reads it."""
    if unit == "tokens":
        return f"{round(value):,} tokens"
    return f"{value:,.2f} USD" if value >= 100 else f"{value:.4g} USD"
