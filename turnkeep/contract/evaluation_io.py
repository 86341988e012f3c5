"""What an evaluation from history (``EvaluationWorkflow``, ``turnkeep replay --query``) and its
activities exchange, and what it reports: many recorded turns replayed at once, each pair of
source and replay compared, and scored by an optional judge.

The judge's prompt and the reading of its answer are pure functions here, so the workflow and
the activities agree on them and tests need no server."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from turnkeep.contract.compact import Compact
from turnkeep.contract.turn_io import NAME_MAX_CHARS

EVALUATION_WORKFLOW = "EvaluationWorkflow"
LIST_EVALUATION_TURNS = "list_evaluation_turns"
SCORE_REPLAY = "score_replay"

# The error type of an evaluation the worker refuses (an unknown judge, a bad query).
EVALUATION_REFUSED = "EvaluationRefused"

# At most this many turns per evaluation, whatever --limit says: each turn costs the
# evaluation's history about a dozen events and its report a row, and both must stay well
# inside Temporal's limits on one workflow (its history's events, a payload's 2 MB).
MAX_EVALUATION_TURNS = 500
# Replays in flight at once, at most.
MAX_CONCURRENCY = 32
# A row keeps this much of each final answer; the judge sees more (``JUDGE_TEXT_CHARS``).
ROW_TEXT_CHARS = 500
JUDGE_TEXT_CHARS = 8_000
QUERY_MAX_CHARS = 4_000

# What an agent judge is asked to answer with, as a structured-output schema when its agent
# allows one, and in words otherwise.
JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "reason": {"type": "string"},
    },
    "required": ["score", "reason"],
    "additionalProperties": False,
}


class EvaluationInput(Compact):
    """Input of ``EvaluationWorkflow``: which turns (a visibility query, bounded), replayed how
    (as ``turnkeep.replay_turn`` takes it), and judged by whom."""

    model_config = ConfigDict(extra="forbid")

    # A Temporal visibility query over the recorded turns (`TurnkeepAgent = 'support'`); empty:
    # every completed turn. The worker lists only completed turns of its own agents whatever
    # it says, and leaves replays out.
    query: str = Field(default="", max_length=QUERY_MAX_CHARS)
    model: str | None = Field(default=None, min_length=1, max_length=NAME_MAX_CHARS)
    agent: str | None = Field(default=None, min_length=1, max_length=NAME_MAX_CHARS)
    instruction: str | None = Field(default=None, max_length=200_000)
    # An agent of the worker's config, or a `package.module:function` its `judges` list.
    judge: str | None = Field(default=None, min_length=1, max_length=1000)
    limit: int = Field(default=100, ge=1, le=MAX_EVALUATION_TURNS)
    concurrency: int = Field(default=4, ge=1, le=MAX_CONCURRENCY)

    @property
    def judge_function(self) -> str | None:
        """The judge's import path, when it is a function (agent names have no colon)."""
        return self.judge if self.judge is not None and ":" in self.judge else None

    @property
    def judge_agent(self) -> str | None:
        return self.judge if self.judge is not None and ":" not in self.judge else None


class EvaluationTarget(Compact):
    """One recorded turn to replay, as the listing activity found it."""

    turn: str  # the source turn's workflow id
    agent: str  # the replay's agent: --agent, else the source's


class EvaluationPlan(Compact):
    """What ``list_evaluation_turns`` answers: the turns, and what the workflow needs to know
    of the worker's config and the server's search attributes to start their replays."""

    turns: list[EvaluationTarget] = Field(default_factory=list)
    # How many completed turns the query matched that the worker left out (replays, turns of
    # agents it does not serve, an evaluation's own turns).
    skipped: int = 0
    # Turnkeep's search attributes registered on the server (a start naming another fails).
    search_attributes: list[str] = Field(default_factory=list)
    # The agent judge lets a turn ask for structured output (its `overrides`).
    judge_structured: bool = False


class ScoreRequest(Compact):
    """Compare a replay (a child turn of the calling evaluation) with its source, and run the
    function judge on the pair when one is named."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(min_length=1, max_length=5 * NAME_MAX_CHARS)
    replay: str = Field(min_length=1, max_length=5 * NAME_MAX_CHARS)
    judge_function: str | None = Field(default=None, max_length=1000)
    # Build the prompt for an agent judge.
    judge_prompt: bool = False


class Judgement(BaseModel):
    """A judge's verdict on a pair: a score from 0 (the replay is useless) to 1 (as good as or
    better than the recorded answer), and why."""

    score: float = Field(ge=0.0, le=1.0)
    reason: str = ""

    @field_validator("reason", mode="before")
    @classmethod
    def _clip_reason(cls, value: Any) -> Any:
        return clip(value, ROW_TEXT_CHARS) if isinstance(value, str) else value


class ToolUse(BaseModel):
    """A tool call of a turn, by name and arguments (results are the source's either way)."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class EvaluationPair(BaseModel):
    """What a function judge is given: one recorded turn and its replay."""

    source_turn: str
    replay_turn: str
    agent: str
    prompt: str  # the text of the last user message the source turn was given
    source_final: str | None
    replay_final: str | None
    source_calls: list[ToolUse] = Field(default_factory=list)
    replay_calls: list[ToolUse] = Field(default_factory=list)
    source_stop_reason: str
    replay_stop_reason: str


class EvaluatedTurn(Compact):
    """One row of an evaluation: a recorded turn beside its replay."""

    source: str
    replay: str
    agent: str
    status: Literal["replayed", "failed"] = "replayed"
    error: str | None = None  # why the replay failed
    same_final: bool | None = None
    source_final: str | None = None  # cut to ROW_TEXT_CHARS
    replay_final: str | None = None
    source_stop_reason: str | None = None
    replay_stop_reason: str | None = None
    source_iterations: int | None = None
    replay_iterations: int | None = None
    # Tool calls by name and arguments: made by both, only by the replay, only by the source.
    same_calls: int = 0
    new_calls: int = 0
    missing_calls: int = 0
    source_tokens: int = 0
    replay_tokens: int = 0
    source_cost_usd: float | None = None  # None: unknown (some model has no price)
    replay_cost_usd: float | None = None
    source_ms: float | None = None
    replay_ms: float | None = None
    score: float | None = None
    reason: str | None = None
    judge_error: str | None = None  # the judge failed: the row has no score


class ScoredPair(Compact):
    """What ``score_replay`` answers: the row, and the agent judge's prompt when asked."""

    row: EvaluatedTurn
    judge_prompt: str | None = None


class EvaluationSummary(BaseModel):
    """The evaluation's totals; ``done`` grows while it runs."""

    turns: int = 0  # listed for replay
    done: int = 0
    replayed: int = 0
    failed: int = 0
    skipped: int = 0  # matched the query but left out (see EvaluationPlan.skipped)
    same_final: int = 0
    scored: int = 0
    judge_errors: int = 0
    mean_score: float | None = None
    source_tokens: int = 0
    replay_tokens: int = 0
    source_cost_usd: float | None = None
    replay_cost_usd: float | None = None

    @classmethod
    def of(cls, rows: list[EvaluatedTurn], *, turns: int, skipped: int) -> EvaluationSummary:
        replayed = [r for r in rows if r.status == "replayed"]
        scores = [r.score for r in rows if r.score is not None]
        return cls(
            turns=turns,
            done=len(rows),
            replayed=len(replayed),
            failed=len(rows) - len(replayed),
            skipped=skipped,
            same_final=sum(1 for r in replayed if r.same_final),
            scored=len(scores),
            judge_errors=sum(1 for r in rows if r.judge_error is not None),
            mean_score=sum(scores) / len(scores) if scores else None,
            source_tokens=sum(r.source_tokens for r in replayed),
            replay_tokens=sum(r.replay_tokens for r in replayed),
            source_cost_usd=_total(r.source_cost_usd for r in replayed),
            replay_cost_usd=_total(r.replay_cost_usd for r in replayed),
        )


class EvaluationReport(BaseModel):
    """An evaluation's outcome (``EvaluationWorkflow``'s result, and its ``report`` query while
    it runs): what was asked, the totals and one row per turn, in the order listed."""

    evaluation_id: str
    query: str
    model: str | None = None
    agent: str | None = None
    judge: str | None = None
    finished: bool = False
    summary: EvaluationSummary = Field(default_factory=EvaluationSummary)
    rows: list[EvaluatedTurn] = Field(default_factory=list)


def _total(values: Any) -> float | None:
    costs = list(values)
    return None if not costs or None in costs else float(sum(costs))


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def judge_prompt(pair: EvaluationPair) -> str:
    """What an agent judge is asked about ``pair``."""

    def calls(uses: list[ToolUse]) -> str:
        names = [f"{u.name}({json.dumps(u.arguments, sort_keys=True)})" for u in uses]
        return clip("; ".join(names) or "(none)", JUDGE_TEXT_CHARS // 4)

    return "\n".join(
        [
            "You are judging a replay of a recorded agent turn. The same request was answered",
            "twice: once as recorded (the reference) and once by the replay (another model or",
            "prompt, with the tools answered from the recording). Score the replay's answer from",
            "0 (wrong or useless) to 1 (as good as the reference, or better) and say why in one",
            'sentence. Answer with JSON only: {"score": <number 0..1>, "reason": "<why>"}.',
            "",
            "## Request",
            clip(pair.prompt, JUDGE_TEXT_CHARS),
            "",
            f"## Reference answer (stop reason {pair.source_stop_reason})",
            clip(pair.source_final or "(no answer)", JUDGE_TEXT_CHARS),
            f"Tool calls: {calls(pair.source_calls)}",
            "",
            f"## Replay answer (stop reason {pair.replay_stop_reason})",
            clip(pair.replay_final or "(no answer)", JUDGE_TEXT_CHARS),
            f"Tool calls: {calls(pair.replay_calls)}",
        ]
    )


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)
_SCORE_WORD = re.compile(r"score\W{0,3}([01](?:\.\d+)?)", re.IGNORECASE)


def read_judgement(answer: str, structured: Any = None) -> Judgement:
    """The judge agent's ``answer`` (or its parsed structured output) as a ``Judgement``;
    ``ValueError`` saying what it answered when it holds no score from 0 to 1."""
    candidates: list[Any] = [structured] if isinstance(structured, dict) else []
    found = _JSON_OBJECT.search(answer)
    if found is not None:
        with contextlib.suppress(ValueError):
            candidates.append(json.loads(found.group(0)))
    for candidate in candidates:
        if isinstance(candidate, dict) and "score" in candidate:
            try:
                return Judgement.model_validate(
                    {"score": candidate["score"], "reason": str(candidate.get("reason", ""))}
                )
            except ValueError:
                continue
    word = _SCORE_WORD.search(answer)
    if word is not None and 0.0 <= float(word.group(1)) <= 1.0:
        return Judgement(score=float(word.group(1)), reason=answer.strip())
    raise ValueError(f"the judge's answer holds no score from 0 to 1: {clip(answer, 200)!r}")
