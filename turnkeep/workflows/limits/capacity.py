"""The turn's side of limits: before each model call of a limited model the turn asks the
limit's limiter for capacity (``ask_capacity``, a local activity that signals it), waits for
the grant as a workflow waiting for a signal (no worker slot held; the limiter first says why,
when it cannot grant at once), and after the call settles
it with the provider's usage, or with the ``retry-after`` of a 429/529 that holds every
worker's calls. A cancelled turn withdraws what it asked.

A turn whose models have no limit makes none of these steps: its history is as before."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import FailureError

from turnkeep.contract.activity_io import Timeouts, TurnPlan
from turnkeep.contract.limits_io import (
    ASK_CAPACITY,
    MAX_LEASE_SECONDS,
    SETTLE_CAPACITY_SIGNAL,
    WITHDRAW_CAPACITY_SIGNAL,
    CapacityGrant,
    CapacityRequest,
    CapacitySettle,
    limiter_id,
    waiting_text,
)
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import Usage
from turnkeep.workflows.limits import limit_metrics
from turnkeep.workflows.limits.sending import spawn

# Asking only signals the limiter: quick, retried a little; the same request asked again is
# queued once (the ledger knows it by its key).
_ASK_TIMEOUT = timedelta(seconds=30)
_ASK_RETRY = RetryPolicy(maximum_attempts=5, maximum_interval=timedelta(seconds=5))


class Capacity:
    """A turn's requests to limiters, and the grants that answered them."""

    def __init__(self) -> None:
        self._asked = 0
        # request id -> the limit asked, while the turn waits for its grant.
        self._waiting: dict[str, str] = {}
        self._granted: set[str] = set()
        # A grant for the next request, come before the turn asked it (request id -> limit).
        self._early: dict[str, str] = {}
        # Settles sent without waiting for them (the turn goes on with its call's answer).
        # How the turn shows why it waits (the limiter's word on the request it waits on).
        self._show: Callable[[str], None] | None = None
        self._sending: set[asyncio.Task[None]] = set()

    def on_grant(self, args: tuple[Any, ...]) -> None:
        """A limiter's grant (the turn's signal): it counts only if it answers a request this
        turn is waiting on, of that limit; any other is logged and ignored."""
        try:
            grant = CapacityGrant.model_validate(args[0]) if len(args) == 1 else None
        except ValidationError:
            grant = None
        if grant is None:
            workflow.logger.warning("a malformed capacity grant was ignored")
            return
        rid = grant.request_id
        if grant.waiting is not None:
            # Why a request waits: shown while it does; otherwise (granted meanwhile, or a
            # stray) it changes nothing.
            if self._waiting.get(rid) == grant.limit and rid not in self._granted and self._show:
                self._show(waiting_text(grant.limit, grant.waiting))
        elif self._waiting.get(rid) == grant.limit:
            self._granted.add(rid)
        elif rid == self._next_id() and not self._waiting:
            # The request this turn is about to make (again): a run replayed from its start,
            # after a worker died while asking, gets its grant delivered before its code
            # reaches the ask again (which the limiter, knowing the request, ignores).
            self._early[rid] = grant.limit
        else:
            workflow.logger.warning("a capacity grant that answers no request was ignored")

    async def acquire(
        self,
        limit: str,
        plan: TurnPlan,
        *,
        input_tokens: int,
        max_output_tokens: int | None,
        t: Timeouts,
        show: Callable[[str], None] | None,
    ) -> str:
        """Ask ``limit`` for a call's capacity and wait for it; the request's id, to settle
        with. Cancelled while waiting: the request is withdrawn."""
        self._asked += 1
        early = self._early.pop(f"c{self._asked}", None)
        self._early.clear()
        info = workflow.info()
        attempts = t.max_attempts or 10
        request = CapacityRequest(
            limit=limit,
            request_id=f"c{self._asked}",
            workflow_id=info.workflow_id,
            run_id=info.run_id,
            priority=plan.priority,
            fairness_key=plan.fairness_key,
            input_tokens=input_tokens,
            max_output_tokens=max_output_tokens,
            lease_seconds=min(MAX_LEASE_SECONDS, t.start_to_close * attempts + 60),
        )
        rid = request.request_id
        self._waiting[rid] = limit
        if early == limit:
            self._granted.add(rid)
        started = workflow.time()
        try:
            await workflow.execute_local_activity(
                ASK_CAPACITY,
                request,
                summary=f"ask for capacity: {limit}",
                start_to_close_timeout=_ASK_TIMEOUT,
                retry_policy=_ASK_RETRY,
            )
            if rid not in self._granted:
                self._show = show
                await workflow.wait_condition(lambda: rid in self._granted)
        except BaseException:
            # Cancelled (or the limiter unreachable): the request must not hold a place.
            self._signal(limit, WITHDRAW_CAPACITY_SIGNAL, request, outcome="withdrawn")
            raise
        finally:
            self._show = None
            self._waiting.pop(rid, None)
            self._granted.discard(rid)
        limit_metrics.waited(limit, plan.priority, workflow.time() - started)
        return rid

    def settle(
        self, limit: str, request_id: str, answer: Message | None, retry_after: float | None
    ) -> None:
        """Tell ``limit`` the call of ``request_id`` ended: what it used (from ``answer``'s
        usage), and the ``retry-after`` of a 429/529. Sent with the turn's next commands;
        the turn does not wait for it."""
        info = workflow.info()
        request = CapacityRequest(
            limit=limit, request_id=request_id, workflow_id=info.workflow_id, run_id=info.run_id
        )
        self._signal(
            limit,
            SETTLE_CAPACITY_SIGNAL,
            request,
            used=used_tokens(answer) if answer is not None else None,
            retry_after=retry_after,
        )

    def _next_id(self) -> str:
        return f"c{self._asked + 1}"

    async def settled(self) -> None:
        """Wait until the limiters have every settle and withdrawal sent so far: before a run
        ends, whose end would drop a signal not yet sent (and hold its slot until the lease
        expires). Nothing to wait for in a turn that asked no limiter."""
        if self._sending:
            await asyncio.gather(*list(self._sending))

    def _signal(self, limit: str, signal: str, request: CapacityRequest, **fields: Any) -> None:
        settle = CapacitySettle(
            request_id=request.request_id,
            workflow_id=request.workflow_id,
            run_id=request.run_id,
            **fields,
        )
        spawn(self._sending, partial(_send, limit, signal, settle))


async def _send(limit: str, signal: str, settle: CapacitySettle) -> None:
    try:
        await workflow.get_external_workflow_handle(limiter_id(limit)).signal(signal, settle)
    except FailureError as err:  # no limiter runs: nothing holds the request anyway
        workflow.logger.info("limit %s was not told of request %s: %s", limit, settle.key, err)


def used_tokens(answer: Message) -> int | None:
    """The tokens a call took by its provider's report (input and output); None: unreported."""
    reported = answer.channel_json("usage")
    if not isinstance(reported, dict):
        return None
    try:
        usage = Usage.model_validate(reported)
    except ValidationError:
        return None
    return usage.input_tokens + usage.output_tokens
