"""``LimiterWorkflow``: the durable ledger of one configured limit, one per namespace
(``turnkeep-limit-<name>``), shared by every worker's turns.

A turn asks by signal (``ask_capacity``, through the ``ask_capacity`` activity's
signal-with-start), and the limiter answers by signal to the turn: the grant, or first why it
waits (when it cannot grant at once) and the grant later. The turn settles the call (what it
used, and the provider's ``retry-after`` if it answered 429/529) or withdraws it by signal.
The ledger's rules are ``turnkeep.workflows.limits.ledger``'s.

Untrusted clients: the limit's values come from the config of the worker running the limiter (an
activity at each run's start), never from its input; a state is taken only from a run of the
same workflow that continued as new; every handler validates its argument and a settle or
withdrawal counts only for a request the ledger knows.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from functools import partial
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, FailureError

from turnkeep.contract.limits_io import (
    ASK_CAPACITY_SIGNAL,
    CAPACITY_GRANT_SIGNAL,
    LIMIT_VALUES,
    LIMITER_ID_PREFIX,
    LIMITER_WORKFLOW_NAME,
    SETTLE_CAPACITY_SIGNAL,
    WITHDRAW_CAPACITY_SIGNAL,
    CapacityGrant,
    CapacityRequest,
    CapacitySettle,
    CapacityWait,
    LimiterStart,
    LimitValues,
)
from turnkeep.workflows.limits import limit_metrics
from turnkeep.workflows.limits.ledger import Lease, Ledger, LedgerState
from turnkeep.workflows.limits.sending import spawn

# A limiter's history grows with every request; it continues as new well before it is large.
CONTINUE_AFTER_EVENTS = 8000
# A limiter with nothing waiting, granted or in its window this long ends.
IDLE_AFTER = timedelta(minutes=10)


@workflow.defn(name=LIMITER_WORKFLOW_NAME)
class LimiterWorkflow:
    @workflow.init
    def __init__(self, *args: Any) -> None:
        info = workflow.info()
        self._name = info.workflow_id.removeprefix(LIMITER_ID_PREFIX)
        self._ledger: Ledger | None = None
        self._failed: str | None = None
        # A ledger only from a run of this workflow that continued as new.
        self._carried: LedgerState | None = None
        if info.continued_run_id is not None and args:
            with contextlib.suppress(ValidationError):
                start = LimiterStart.model_validate(args[0])
                if start.ledger is not None:
                    self._carried = LedgerState.model_validate(start.ledger)
        self._changed = False
        self._outbox: list[Lease] = []
        # Requests asked since the last grant round: those it does not grant hear why.
        self._asked: list[CapacityRequest] = []
        # Grants and words on why requests wait, on their way to the turns.
        self._sending: set[asyncio.Task[None]] = set()
        self._details = "starting"

    @workflow.run
    async def run(self, *args: Any) -> None:
        if not workflow.info().workflow_id.startswith(LIMITER_ID_PREFIX) or not self._name:
            self._failed = "not a limiter's workflow id"
            raise ApplicationError(
                f"A limiter's workflow id is {LIMITER_ID_PREFIX}<limit name>.",
                type="NotALimiter",
                non_retryable=True,
            )
        try:
            values = await workflow.execute_local_activity(
                LIMIT_VALUES,
                self._name,
                result_type=LimitValues,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
        except Exception as err:
            self._failed = f"limit {self._name!r} is unknown to this worker"
            raise ApplicationError(
                f"Limit {self._name!r} could not be read from the worker's config: {err}",
                type="UnknownLimit",
                non_retryable=True,
            ) from None
        self._ledger = Ledger(values, self._carried)
        while True:
            # Reset before granting, not after: a request or settle that comes while the
            # grants below are being sent must wake the next round, or it is lost.
            self._changed = False
            now = workflow.time()
            self._outbox += self._ledger.grants(now)
            told = [(r, self._ledger.why(r.key, now)) for r in self._asked]
            told = [(r, why) for r, why in told if why not in ("granted", "unknown request")]
            self._asked = []
            # Sent without waiting for them: granting goes on while a fleet's worth of
            # signals is on its way (each is a transaction of the server's).
            sending, self._outbox = self._outbox, []
            for lease in sending:
                spawn(self._sending, partial(self._send, lease))
            for request, why in told:
                spawn(self._sending, partial(self._tell, request, why))
            now = workflow.time()
            self._show(now)
            if self._continue_due():
                # Requests asked meanwhile are in the ledger it carries (the next run grants
                # them; only the word on why they wait is not sent).
                await workflow.wait_condition(
                    lambda: workflow.all_handlers_finished() and not self._sending
                )
                workflow.continue_as_new(
                    LimiterStart(ledger=self._ledger.state.model_dump(mode="json"))
                )
            wake = self._ledger.next_check(now)
            idle = wake is None and self._ledger.idle(now)
            timeout = None if wake is None else timedelta(seconds=max(0.001, wake - now))
            try:
                await workflow.wait_condition(
                    lambda: self._changed, timeout=IDLE_AFTER if idle else timeout
                )
            except TimeoutError:
                if idle and workflow.all_handlers_finished() and not self._sending:
                    # Nothing to remember: the next request starts a limiter anew, on the
                    # queue of the turn that asks (a fleet that moved queues is not held by
                    # a limiter no worker polls any more).
                    return

    def _continue_due(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > CONTINUE_AFTER_EVENTS
        )

    async def _send(self, lease: Lease) -> None:
        """Tell the turn it may call; a turn that has closed gets nothing, and the grant is
        taken back (the call never ran)."""
        assert self._ledger is not None
        grant = CapacityGrant(limit=self._name, request_id=lease.request_id)
        turn = workflow.get_external_workflow_handle(lease.workflow_id, run_id=lease.run_id)
        try:
            await turn.signal(CAPACITY_GRANT_SIGNAL, grant)
        except FailureError as err:
            workflow.logger.info("grant to a closed turn %s dropped: %s", lease.workflow_id, err)
            self._ledger.drop(lease.key)
            self._changed = True

    async def _tell(self, request: CapacityRequest, why: str) -> None:
        """Tell a turn why its request waits (its details show it)."""
        answer = CapacityGrant(limit=self._name, request_id=request.request_id, waiting=why)
        turn = workflow.get_external_workflow_handle(request.workflow_id, run_id=request.run_id)
        try:
            await turn.signal(CAPACITY_GRANT_SIGNAL, answer)
        except FailureError as err:
            # A turn that closed while it waited: its request goes.
            workflow.logger.info("turn %s closed while it waited: %s", request.workflow_id, err)
            if self._ledger is not None:
                self._ledger.withdraw(request.key, workflow.time())
            self._changed = True

    def _show(self, now: float) -> None:
        assert self._ledger is not None
        self._details = self._ledger.summary(self._name, now)
        workflow.set_current_details(self._details)
        requests, tokens = self._ledger.in_use(now)
        limit_metrics.in_use(self._name, requests, tokens)

    async def _loaded(self) -> Ledger:
        await workflow.wait_condition(lambda: self._ledger is not None or self._failed is not None)
        if self._ledger is None:
            raise ApplicationError(self._failed or "no ledger", type="UnknownLimit")
        return self._ledger

    @workflow.signal(name=ASK_CAPACITY_SIGNAL)
    async def ask_capacity(self, *args: Any) -> None:
        """A turn asks for one model call's capacity: one argument, a ``CapacityRequest``. A
        signal cannot be refused: a malformed one, or one for another limit, is ignored (the
        turn's activity checks what it sends)."""
        try:
            request = CapacityRequest.model_validate(args[0]) if len(args) == 1 else None
        except ValidationError:
            request = None
        if request is None or request.limit != self._name:
            workflow.logger.warning("a malformed capacity request, or another limit's, ignored")
            return
        ledger = await self._loaded()
        if ledger.is_known(request.key) or ledger.has_granted(request.key):
            return  # asked again (an attempt run again): it has its place, or its grant
        ledger.ask(request, workflow.time())
        self._asked.append(request)
        self._changed = True

    @workflow.signal(name=SETTLE_CAPACITY_SIGNAL)
    async def settle_capacity(self, *args: Any) -> None:
        """A granted call ended (or the turn withdrew): one argument, a ``CapacitySettle``.
        A signal cannot be refused: one that names no request of the ledger is ignored."""
        settle = _settle(args)
        if settle is None:
            return
        ledger = await self._loaded()
        now = workflow.time()
        if settle.outcome == "withdrawn":
            if ledger.is_known(settle.key):
                ledger.withdraw(settle.key, now)
        elif ledger.has_granted(settle.key):
            ledger.settle(settle.key, settle.used, settle.retry_after, now)
        self._changed = True

    @workflow.signal(name=WITHDRAW_CAPACITY_SIGNAL)
    async def withdraw_capacity(self, *args: Any) -> None:
        """A turn no longer wants its request (it was cancelled): a ``CapacitySettle``."""
        settle = _settle(args)
        if settle is None:
            return
        ledger = await self._loaded()
        if ledger.is_known(settle.key):
            ledger.withdraw(settle.key, workflow.time())
        self._changed = True

    @workflow.query
    def waiting(self) -> list[CapacityWait]:
        """The turns waiting for this limit (the first hundred, in grant order), and why."""
        if self._ledger is None:
            return []
        return [
            CapacityWait(limit=self._name, workflow_id=w.workflow_id, priority=w.priority, why=why)
            for w, why in self._ledger.waiters()
        ]

    @workflow.query
    def status(self) -> str:
        """The limiter's state in a line (as its current details show it)."""
        return self._failed or self._details


def _settle(args: tuple[Any, ...]) -> CapacitySettle | None:
    try:
        return CapacitySettle.model_validate(args[0]) if len(args) == 1 else None
    except ValidationError:
        workflow.logger.warning("a malformed settle of a limiter was ignored")
        return None
