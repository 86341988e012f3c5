"""The activities of an evaluation from history (``EvaluationWorkflow``): ``list_evaluation_turns``
finds the recorded turns to replay, ``score_replay`` sets a replay beside its source and runs
the function judge on the pair.

Any client may start an evaluation with any request, or schedule these in a workflow of its
own: each runs only for an ``EvaluationWorkflow``, re-checks its request against the worker's
config (agents, judges), lists only completed turns of the worker's own agents whatever the
query says, and compares only replays the calling evaluation started. A function judge is one
the worker's config lists under ``judges``: a client names it, never imports it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.client import (
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.activities.heartbeat import heartbeating
from turnkeep.config.catalog import AgentCatalog
from turnkeep.contract.evaluation_io import (
    EVALUATION_REFUSED,
    EVALUATION_WORKFLOW,
    LIST_EVALUATION_TURNS,
    MAX_EVALUATION_TURNS,
    ROW_TEXT_CHARS,
    SCORE_REPLAY,
    EvaluatedTurn,
    EvaluationInput,
    EvaluationPair,
    EvaluationPlan,
    EvaluationTarget,
    Judgement,
    ScoredPair,
    ScoreRequest,
    ToolUse,
    clip,
    judge_prompt,
)
from turnkeep.contract.replay_io import call_key, recorded_calls
from turnkeep.contract.turn_io import WORKFLOW_NAME, TurnResult
from turnkeep.errors import config_error, known, require_workflow
from turnkeep.observability.search_attributes import present_search_attributes
from turnkeep.support.describe import described
from turnkeep.workflows import visibility

# A function judge: the pair in, a Judgement (or a score, or a dict of one) out; sync or async.
Judge = Callable[[EvaluationPair], Any]

# Listing stops after reading this many executions, matched or not, however few it kept: a
# query matching mostly replays or other workers' turns cannot keep the activity reading.
_SCAN_LIMIT = 20 * MAX_EVALUATION_TURNS


class EvaluationActivities:
    def __init__(self, agents: AgentCatalog, judges: Mapping[str, Judge]) -> None:
        self._agents = agents
        self._judges = dict(judges)

    @activity.defn(name=LIST_EVALUATION_TURNS)
    async def list_evaluation_turns(self, request: EvaluationInput) -> EvaluationPlan:
        _require_evaluation()
        self._check(request)
        client = activity.client()
        present = await present_search_attributes(client)
        # The caller's query narrows the listing; the worker's own conditions bound it (and
        # each execution is checked again below, whatever the query's text did to them).
        query = f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Completed'"
        if request.query.strip():
            query += f" AND ({request.query})"
        targets: list[EvaluationTarget] = []
        skipped = 0
        parents: dict[str, str | None] = {}
        try:
            async for execution in client.list_workflows(query, limit=_SCAN_LIMIT):
                source_agent = await self._source_agent(execution, parents)
                if source_agent is None:
                    skipped += 1
                    continue
                agent = request.agent or source_agent
                targets.append(EvaluationTarget(turn=execution.id, agent=agent))
                if len(targets) >= request.limit:
                    break
        except RPCError as err:
            if err.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
            raise _refused(
                f"the server refused the query {request.query!r}: {err.message}"
            ) from None
        judge = request.judge_agent
        return EvaluationPlan(
            turns=targets,
            skipped=skipped,
            search_attributes=present,
            judge_structured=judge is not None
            and "structured_output" in self._agents[judge].overrides,
        )

    @activity.defn(name=SCORE_REPLAY)
    async def score_replay(self, request: ScoreRequest) -> ScoredPair:
        _require_evaluation()
        # A judge may take its time: the beats tell Temporal soon when the worker running it
        # died, so another worker scores the pair without waiting out the whole timeout.
        return await heartbeating(self._score(request))

    async def _score(self, request: ScoreRequest) -> ScoredPair:
        if request.judge_function is not None:
            self._judge(request.judge_function)
        client = activity.client()
        replay = client.get_workflow_handle(request.replay, result_type=TurnResult)
        replay_described = await _describe(replay)
        if replay_described.parent_id != activity.info().workflow_id:
            raise _refused(f"{request.replay!r} is not a replay this evaluation started")
        source = client.get_workflow_handle(request.source, result_type=TurnResult)
        source_described = await _describe(source)
        agent = source_described.typed_search_attributes.get(visibility.AGENT)
        if agent is None or agent not in self._agents:
            raise _refused(f"{request.source!r} is not a turn of an agent this worker serves")
        replayed, recorded = await replay.result(), await source.result()
        pair = _pair(request, agent, recorded, replayed)
        row = _row(pair, recorded, replayed, source_described, replay_described)
        if request.judge_function is not None:
            row = await self._scored(row, request.judge_function, pair)
        return ScoredPair(
            row=row, judge_prompt=judge_prompt(pair) if request.judge_prompt else None
        )

    def _check(self, request: EvaluationInput) -> None:
        if request.agent is not None:
            self._agents.agent(request.agent)  # an unknown agent is refused, naming the known
        if request.judge_agent is not None and request.judge_agent not in self._agents:
            raise _refused(
                f"judge {request.judge_agent!r} is not an agent of this worker's config "
                f"(agents: {known(self._agents)})"
            )
        if request.judge_function is not None:
            self._judge(request.judge_function)

    def _judge(self, path: str) -> Judge:
        judge = self._judges.get(path)
        if judge is None:
            raise _refused(
                f"judge {path!r} is not listed under `judges` in the worker's config "
                f"(judges: {known(self._judges)}): a worker runs only the functions its own "
                "config names"
            )
        return judge

    async def _scored(self, row: EvaluatedTurn, path: str, pair: EvaluationPair) -> EvaluatedTurn:
        """``row`` with the function judge's verdict, or with why it has none: a judge that
        raises or answers nonsense fails its row's score, not the evaluation."""
        try:
            answer = self._judge(path)(pair)
            if inspect.isawaitable(answer):
                answer = await answer
            verdict = as_judgement(answer)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the worker owner's code: any failure is the row's
            why = clip(f"{type(err).__name__}: {err}", ROW_TEXT_CHARS)
            return row.model_copy(update={"judge_error": why})
        return row.model_copy(update={"score": verdict.score, "reason": verdict.reason})

    async def _source_agent(
        self, execution: WorkflowExecution, parents: dict[str, str | None]
    ) -> str | None:
        """The agent of a listed turn worth replaying, or None: not a completed turn, a turn of
        an agent this worker does not serve, a replay, or a turn an evaluation ran."""
        if (
            execution.workflow_type != WORKFLOW_NAME
            or execution.status != WorkflowExecutionStatus.COMPLETED
        ):
            return None
        attributes = execution.typed_search_attributes
        agent = attributes.get(visibility.AGENT)
        if agent is None or agent not in self._agents:
            return None
        if attributes.get(visibility.REPLAY_OF) is not None:
            return None
        parent = execution.parent_id
        if parent is not None:
            if parent not in parents:
                parents[parent] = await _workflow_type(parent)
            if parents[parent] == EVALUATION_WORKFLOW:  # its replays and judges
                return None
        return agent


def as_judgement(answer: Any) -> Judgement:
    """A function judge's answer as a ``Judgement``: one already, a number (the score), a
    (score, reason) pair, or a dict with a ``score``."""
    if isinstance(answer, Judgement):
        return answer
    if isinstance(answer, bool):
        return Judgement(score=1.0 if answer else 0.0)
    if isinstance(answer, int | float):
        return Judgement(score=float(answer))
    if isinstance(answer, tuple) and len(answer) == 2:
        return Judgement(score=answer[0], reason=str(answer[1]))
    try:
        return Judgement.model_validate(answer)
    except ValidationError:
        raise ValueError(
            f"a judge returns a Judgement, a score from 0 to 1 or (score, reason), not "
            f"{clip(repr(answer), 200)}"
        ) from None


def _pair(
    request: ScoreRequest, agent: str, recorded: TurnResult, replayed: TurnResult
) -> EvaluationPair:
    prompt = next(
        (m.text for m in reversed(recorded.messages) if m.role == "user" and not m.tool_results),
        "",
    )
    return EvaluationPair(
        source_turn=request.source,
        replay_turn=request.replay,
        agent=agent,
        prompt=prompt,
        source_final=recorded.final.text if recorded.final is not None else None,
        replay_final=replayed.final.text if replayed.final is not None else None,
        source_calls=_uses(recorded),
        replay_calls=_uses(replayed),
        source_stop_reason=recorded.stop_reason.value,
        replay_stop_reason=replayed.stop_reason.value,
    )


def _uses(result: TurnResult) -> list[ToolUse]:
    return [ToolUse(name=c.name, arguments=c.arguments) for c in recorded_calls(result.messages)]


def _row(
    pair: EvaluationPair,
    recorded: TurnResult,
    replayed: TurnResult,
    source: WorkflowExecutionDescription,
    replay: WorkflowExecutionDescription,
) -> EvaluatedTurn:
    made = Counter(call_key(u.name, u.arguments) for u in pair.source_calls)
    remade = Counter(call_key(u.name, u.arguments) for u in pair.replay_calls)
    recorded_cost, replayed_cost = _cost(recorded), _cost(replayed)
    return EvaluatedTurn(
        source=pair.source_turn,
        replay=pair.replay_turn,
        agent=pair.agent,
        same_final=pair.source_final == pair.replay_final,
        source_final=_cut(pair.source_final),
        replay_final=_cut(pair.replay_final),
        source_stop_reason=pair.source_stop_reason,
        replay_stop_reason=pair.replay_stop_reason,
        source_iterations=recorded.iterations,
        replay_iterations=replayed.iterations,
        same_calls=(made & remade).total(),
        new_calls=(remade - made).total(),
        missing_calls=(made - remade).total(),
        source_tokens=sum(u.tokens for u in recorded.usage.values()),
        replay_tokens=sum(u.tokens for u in replayed.usage.values()),
        source_cost_usd=recorded_cost,
        replay_cost_usd=replayed_cost,
        source_ms=_duration_ms(source),
        replay_ms=_duration_ms(replay),
    )


def _cut(text: str | None) -> str | None:
    return None if text is None else clip(text, ROW_TEXT_CHARS)


def _cost(result: TurnResult) -> float | None:
    costs = [u.cost_usd for u in result.usage.values()]
    return None if None in costs else sum(c for c in costs if c is not None)


def _duration_ms(described: WorkflowExecutionDescription) -> float | None:
    started, closed = described.start_time, described.close_time
    return None if closed is None else (closed - started).total_seconds() * 1000


async def _describe(handle: WorkflowHandle[Any, TurnResult]) -> WorkflowExecutionDescription:
    found = await described(handle)
    if found is None:
        raise _refused(f"no turn with workflow id {handle.id!r}")
    if found.workflow_type != WORKFLOW_NAME:
        raise _refused(f"{handle.id!r} is a {found.workflow_type} workflow, not a turn")
    if found.status != WorkflowExecutionStatus.COMPLETED:
        raise _refused(f"turn {handle.id!r} did not complete")
    return found


async def _workflow_type(workflow_id: str) -> str | None:
    found = await described(activity.client().get_workflow_handle(workflow_id))
    return None if found is None else found.workflow_type


def _require_evaluation() -> None:
    require_workflow()
    if activity.info().workflow_type != EVALUATION_WORKFLOW:
        raise _refused(f"only an {EVALUATION_WORKFLOW} runs this activity")


def _refused(message: str) -> BaseException:
    return config_error(EVALUATION_REFUSED, f"evaluation refused: {message}")
