"""``EvaluationWorkflow``: an evaluation from history (``turnkeep replay --query``). It lists the
recorded turns a visibility query matches (an activity, checked against the worker's config),
replays each as a child turn (``TurnInput.replay_of``) on its own task queue (whose
workers share its config, the agents the listing checked), a few at a time, compares each replay
with its source and has the pair scored by the judge, if any: a function the worker's config
names (in the comparing activity) or an agent (a child turn asked for a score).

Its history is the evaluation's progress: a worker that dies mid-batch costs only the
activities in flight, the replays already started go on, and any worker picks the rest up.
The ``report`` query answers with the rows so far."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, FailureError

from turnkeep.contract.activity_io import Timeouts
from turnkeep.contract.evaluation_io import (
    EVALUATION_REFUSED,
    EVALUATION_WORKFLOW,
    JUDGE_SCHEMA,
    LIST_EVALUATION_TURNS,
    SCORE_REPLAY,
    EvaluatedTurn,
    EvaluationInput,
    EvaluationPlan,
    EvaluationReport,
    EvaluationSummary,
    EvaluationTarget,
    ScoredPair,
    ScoreRequest,
    clip,
    read_judgement,
)
from turnkeep.contract.messages import Message
from turnkeep.contract.turn_io import (
    WORKFLOW_NAME,
    ReplayOf,
    TaskPriority,
    TurnInput,
    TurnResult,
)
from turnkeep.workflows import actions, visibility
from turnkeep.workflows.task_priority import temporal_priority

# Listing reads visibility, page by page: quick, retried for a busy server.
_LIST = Timeouts(start_to_close=120.0, heartbeat=None, max_attempts=5)
# Comparing reads two closed turns' results, and runs the function judge (the worker owner's
# code): a judge that raises is recorded in the row, not retried; a worker that dies is
# noticed by the missing heartbeats.
_SCORE = Timeouts(start_to_close=300.0, heartbeat=10.0, max_attempts=5)


# An evaluation replays many turns at once: busy workers serve people's turns first.
EVALUATION_PRIORITY: TaskPriority = "batch"


@workflow.defn(name=EVALUATION_WORKFLOW)
class EvaluationWorkflow:
    # Its own activities and its children, replays and judges, run at the batch priority
    # (``task_priority``).
    task_priority = temporal_priority(EVALUATION_PRIORITY, None)

    def __init__(self) -> None:
        self._request: EvaluationInput | None = None
        self._plan = EvaluationPlan()
        self._rows: dict[int, EvaluatedTurn] = {}
        self._finished = False

    @workflow.run
    async def run(self, *args: Any) -> EvaluationReport:
        # Any client may start it with anything: a start that is not one EvaluationInput
        # fails the evaluation at once, rather than its workflow task for ever.
        try:
            [raw] = args
            request = EvaluationInput.model_validate(raw)
        except (ValueError, TypeError) as err:
            why = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ApplicationError(
                f"not an evaluation's input (one EvaluationInput): {clip(why, 300)}",
                type=EVALUATION_REFUSED,
                non_retryable=True,
            ) from None
        self._request = request
        try:
            self._plan = await actions.execute(
                LIST_EVALUATION_TURNS,
                request,
                EvaluationPlan,
                visibility.clip(f"list turns: {request.query or 'all'}"),
                _LIST,
            )
        except ActivityError as err:
            # A refused request (an unknown judge, a query visibility rejects) ends the
            # evaluation with the worker's explanation rather than retrying for ever.
            raise ApplicationError(
                actions.failure_text(err), type=EVALUATION_REFUSED, non_retryable=True
            ) from None
        turns = iter(enumerate(self._plan.turns))

        async def slot() -> None:
            # Each slot takes the next turn when its last is done: at most `concurrency`
            # replays in flight, in the order listed.
            for index, target in turns:
                self._rows[index] = await self._evaluate(index, target, request)

        await asyncio.gather(*(slot() for _ in range(request.concurrency)))
        self._finished = True
        return self.report()

    @workflow.query(name="report")
    def report(self) -> EvaluationReport:
        request = self._request or EvaluationInput()
        rows = [self._rows[i] for i in sorted(self._rows)]
        return EvaluationReport(
            evaluation_id=workflow.info().workflow_id,
            query=request.query,
            model=request.model,
            agent=request.agent,
            judge=request.judge,
            finished=self._finished,
            summary=EvaluationSummary.of(
                rows, turns=len(self._plan.turns), skipped=self._plan.skipped
            ),
            rows=rows,
        )

    async def _evaluate(
        self, index: int, target: EvaluationTarget, request: EvaluationInput
    ) -> EvaluatedTurn:
        parent = workflow.info().workflow_id
        replay_id = f"{parent}/replay-{index}"
        failed = EvaluatedTurn(
            source=target.turn, replay=replay_id, agent=target.agent, status="failed"
        )
        try:
            await self._replay(replay_id, target, request)
        except ChildWorkflowError as err:
            return failed.model_copy(update={"error": _why(err)})
        score = ScoreRequest(
            source=target.turn,
            replay=replay_id,
            judge_function=request.judge_function,
            judge_prompt=request.judge_agent is not None,
        )
        try:
            scored = await actions.execute(
                SCORE_REPLAY, score, ScoredPair, visibility.clip(f"compare {replay_id}"), _SCORE
            )
        except ActivityError as err:
            return failed.model_copy(update={"error": actions.failure_text(err)})
        row = scored.row
        if request.judge_agent is not None and scored.judge_prompt is not None:
            row = await self._judge(f"{parent}/judge-{index}", row, scored.judge_prompt, request)
        return row

    async def _replay(
        self, replay_id: str, target: EvaluationTarget, request: EvaluationInput
    ) -> None:
        attributes = list(
            visibility.start_search_attributes(target.agent, self._plan.search_attributes)
        )
        if visibility.REPLAY_OF.name in self._plan.search_attributes:
            attributes.append(SearchAttributePair(visibility.REPLAY_OF, target.turn))
        turn = TurnInput(
            agent=target.agent,
            # The worker replaces it with the source's input (``replay_source``).
            messages=[Message.user(f"replay of {target.turn}")],
            model=request.model,
            replay_of=ReplayOf(turn=target.turn, instruction=request.instruction),
            priority=EVALUATION_PRIORITY,
        )
        # The result stays a payload: the comparing activity reads both turns itself.
        await workflow.execute_child_workflow(
            WORKFLOW_NAME,
            turn,
            id=replay_id,
            result_type=RawValue,
            static_summary=visibility.replay_summary(target.turn, request.model or target.agent),
            search_attributes=TypedSearchAttributes(attributes),
            priority=self.task_priority,
        )

    async def _judge(
        self, judge_id: str, row: EvaluatedTurn, prompt: str, request: EvaluationInput
    ) -> EvaluatedTurn:
        judge = request.judge_agent
        assert judge is not None
        turn = TurnInput(
            agent=judge,
            messages=[Message.user(prompt)],
            structured_output=JUDGE_SCHEMA if self._plan.judge_structured else None,
            priority=EVALUATION_PRIORITY,
        )
        try:
            result = await workflow.execute_child_workflow(
                WORKFLOW_NAME,
                turn,
                id=judge_id,
                result_type=TurnResult,
                static_summary=visibility.clip(f"judge {row.replay}"),
                search_attributes=TypedSearchAttributes(
                    list(visibility.start_search_attributes(judge, self._plan.search_attributes))
                ),
                priority=self.task_priority,
            )
            answer = result.final.text if result.final is not None else ""
            verdict = read_judgement(answer, result.structured)
        except (ChildWorkflowError, ValueError) as err:
            why = _why(err) if isinstance(err, ChildWorkflowError) else str(err)
            return row.model_copy(update={"judge_error": clip(why, 500)})
        return row.model_copy(update={"score": verdict.score, "reason": verdict.reason})


def _why(err: FailureError) -> str:
    """The innermost failure's message: why a child turn failed, in the worker's words."""
    cause: BaseException = err
    while isinstance(cause, FailureError) and cause.cause is not None:
        cause = cause.cause
    message = cause.message if isinstance(cause, FailureError) else str(cause)
    return clip(message, 500)
