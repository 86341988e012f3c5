"""Evaluations from history (``turnkeep.evaluate``, ``turnkeep replay --query``): recorded turns
replayed in a batch by ``EvaluationWorkflow``, each pair compared and judged, on a real dev
server with the offline models; the worker's checks on what a client asks."""

from __future__ import annotations

import asyncio
import csv
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from tests.conftest import HarnessFactory, turnkeep, write_script
from tests.crafted_workflow import CraftedWorkflow
from tests.test_activity_checks import application_error
from tests.test_priority import scheduled
from turnkeep.activities.evaluation import as_judgement
from turnkeep.client.evaluations import (
    EvaluationError,
    evaluate,
    evaluation_id,
    evaluation_input,
    write_report,
)
from turnkeep.contract.evaluation_io import (
    EVALUATION_REFUSED,
    EVALUATION_WORKFLOW,
    LIST_EVALUATION_TURNS,
    SCORE_REPLAY,
    EvaluationInput,
    EvaluationPair,
    EvaluationReport,
    Judgement,
    read_judgement,
)
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.testing import EvaluationFailedError, assert_replays
from turnkeep.testing.environment import eventually

CALLS: list[str] = []


def count(label: str) -> str:
    """Counts its calls: a replay must make none."""
    CALLS.append(label)
    return f"counted {label}"


TOOLS = {"local": [count]}


def same_answer(pair: EvaluationPair) -> Judgement:
    """A function judge: full marks for the recorded answer."""
    same = pair.source_final == pair.replay_final
    return Judgement(score=1.0 if same else 0.0, reason="same" if same else "differs")


async def broken_judge(pair: EvaluationPair) -> float:
    raise RuntimeError("the judge fell over")


JUDGE = f"{__name__}:same_answer"
BROKEN = f"{__name__}:broken_judge"


def _agent() -> str:
    # Every test lists turns by its own agent's name: the server is shared.
    return f"ev-{uuid.uuid4().hex[:8]}"


def _config(agent: str, **extra: Any) -> dict[str, Any]:
    return {
        "agents": {
            agent: {"model": "passthrough", "servers": ["local"], "models": ["playback"]},
            **extra.pop("agents", {}),
        },
        "judges": [JUDGE, BROKEN],
        **extra,
    }


async def _recorded(h: Any, agent: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        turn = await h.start(
            f"***CALL_TOOL local__count {json.dumps({'label': str(i)})}", agent=agent
        )
        await turn.result()
        ids.append(turn.workflow_id)
    return ids


async def _listed(client: Client, agent: str, n: int) -> None:
    """Visibility catches up with the recorded turns."""

    async def seen() -> bool:
        query = f"TurnkeepAgent = '{agent}' AND ExecutionStatus = 'Completed'"
        return (await client.count_workflows(query)).count >= n

    await eventually(seen, "visibility lists the recorded turns")


async def test_an_evaluation_replays_each_recorded_turn_without_running_tools(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    agent = _agent()
    async with harness(TOOLS, **_config(agent)) as h:
        sources = await _recorded(h, agent, 3)
        await _listed(client, agent, 3)
        CALLS.clear()
        handle = await evaluate(
            client, f"TurnkeepAgent = '{agent}'", judge=JUDGE, task_queue=h.task_queue
        )
        report = await handle.report()
    assert CALLS == []  # every call was answered from the recording
    assert report.finished and report.summary.turns == 3 == report.summary.replayed
    assert sorted(r.source for r in report.rows) == sorted(sources)
    for row in report.rows:
        assert row.status == "replayed", row.error
        assert row.same_final, (row.source_final, row.replay_final, row.same_calls)
        assert row.same_calls == 1 and row.new_calls == row.missing_calls == 0
        assert row.score == 1.0 and row.reason == "same"
        assert row.replay.startswith(f"{handle.workflow_id}/replay-")
    assert report.summary.mean_score == 1.0 and report.summary.same_final == 3
    # An evaluation's work waits for people's: its own activities, its replays and theirs run
    # at the batch priority.
    assert {key for _, key, _ in await scheduled(client, handle.workflow_id)} == {5}
    assert {key for _, key, _ in await scheduled(client, report.rows[0].replay)} == {5}
    json_file, csv_file = tmp_path / "r.json", tmp_path / "r.csv"
    write_report(report, json_file)
    write_report(report, csv_file)
    assert EvaluationReport.model_validate_json(json_file.read_text()) == report
    rows = list(csv.DictReader(csv_file.open()))
    assert [r["source"] for r in rows] == [r.source for r in report.rows]
    assert rows[0]["score"] == "1.0"


@pytest.mark.parametrize(
    ("judge", "query", "said"),
    [
        ("tests.test_evaluations:count", "", "is not listed under `judges`"),
        ("no-such-agent", "", "is not an agent of this worker's config"),
        (None, "TurnkeepAgent = ", "the server refused the query"),
    ],
)
async def test_what_the_worker_refuses_fails_the_evaluation_with_its_reason(
    harness: HarnessFactory, client: Client, judge: str | None, query: str, said: str
) -> None:
    agent = _agent()
    async with harness(TOOLS, **_config(agent)) as h:
        handle = await evaluate(client, query, judge=judge, task_queue=h.task_queue)
        with pytest.raises(EvaluationError) as caught:
            await handle.report()
    assert said in str(caught.value)
    assert handle.workflow_id in str(caught.value)


def test_a_request_out_of_bounds_is_refused_before_anything_starts() -> None:
    with pytest.raises(EvaluationError, match="limit"):
        evaluation_input(limit=100_000)
    with pytest.raises(EvaluationError, match="concurrency"):
        evaluation_input(concurrency=0)
    with pytest.raises(ValueError):
        EvaluationInput.model_validate({"query": "", "command": "rm -rf /"})


def test_the_same_request_has_the_same_id_and_another_another() -> None:
    first = evaluation_input(query="TurnkeepAgent = 'a'", model="m")
    assert evaluation_id(first) == evaluation_id(
        evaluation_input(query="TurnkeepAgent = 'a'", model="m")
    )
    assert evaluation_id(first) != evaluation_id(evaluation_input(query="TurnkeepAgent = 'a'"))


def test_judges_answer_in_several_shapes() -> None:
    assert as_judgement(0.5) == Judgement(score=0.5)
    assert as_judgement(True).score == 1.0
    assert as_judgement((0.25, "meh")) == Judgement(score=0.25, reason="meh")
    assert as_judgement({"score": 1, "reason": "ok"}).reason == "ok"
    with pytest.raises(ValueError, match="a judge returns"):
        as_judgement("great")
    with pytest.raises(ValueError):
        as_judgement(1.5)


def test_an_agent_judges_answer_is_read_leniently() -> None:
    assert read_judgement('{"score": 0.8, "reason": "close"}') == Judgement(
        score=0.8, reason="close"
    )
    assert read_judgement('Sure! ```json\n{"score": 1, "reason": "same"}\n```').score == 1.0
    assert read_judgement("", structured={"score": 0, "reason": "wrong"}).score == 0.0
    assert read_judgement("Score: 0.7 because it is close").score == 0.7
    with pytest.raises(ValueError, match="holds no score"):
        read_judgement("I cannot judge this")
    with pytest.raises(ValueError, match="holds no score"):
        read_judgement('{"score": 7}')


@pytest.mark.parametrize("activity", [LIST_EVALUATION_TURNS, SCORE_REPLAY])
async def test_an_evaluations_activities_run_for_an_evaluation_only(
    harness: HarnessFactory, client: Client, activity: str
) -> None:
    """Any client can schedule them by name from a workflow of its own: refused, whatever the
    request claims."""
    agent = _agent()
    request = {"source": "x", "replay": "y", "judge_function": JUDGE}
    if activity == LIST_EVALUATION_TURNS:
        request = {"query": "", "judge": JUDGE}
    queue = f"crafted-{uuid.uuid4().hex[:10]}"
    async with (
        harness(TOOLS, **_config(agent)) as h,
        Worker(client, task_queue=queue, workflows=[CraftedWorkflow]),
    ):
        with pytest.raises(WorkflowFailureError) as caught:
            await client.execute_workflow(
                CraftedWorkflow.run,
                args=[activity, h.task_queue, request, None],
                id=f"crafted-{uuid.uuid4().hex[:8]}",
                task_queue=queue,
            )
    error = application_error(caught.value)
    assert error.non_retryable and error.type == EVALUATION_REFUSED
    assert f"only an {EVALUATION_WORKFLOW} runs this activity" in error.message


async def test_an_agent_judges_each_pair_and_another_model_answers_otherwise(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    agent = _agent()
    replies = write_script(tmp_path / "replies.json", "a different answer")
    verdict = write_script(tmp_path / "judge.json", '{"score": 0.25, "reason": "it differs"}')
    config = _config(
        agent,
        agents={"judge": {"model": "playback", "playback": str(verdict)}},
    )
    config["agents"][agent]["playback"] = str(replies)
    async with harness(TOOLS, **config) as h:
        sources = await _recorded(h, agent, 2)
        await _listed(client, agent, 2)
        query = f"TurnkeepAgent = '{agent}'"
        judged = await evaluate(
            client, query, model="playback", judge="judge", task_queue=h.task_queue
        )
        report = await judged.report()
        broken = await (
            await evaluate(client, query, judge=BROKEN, limit=1, task_queue=h.task_queue)
        ).report()
        # Again, over the same query: the replays and judges of the evaluations above are
        # turns of the agents too, but not recorded turns to evaluate.
        again = await (
            await evaluate(client, query, concurrency=1, task_queue=h.task_queue)
        ).report()
    assert [r.source for r in report.rows] == sources[::-1]  # newest first
    for row in report.rows:
        assert row.status == "replayed" and not row.same_final
        assert (
            row.replay_final == "a different answer"
            and row.source_final == f"counted {sources.index(row.source)}"
        )
        assert (row.same_calls, row.new_calls, row.missing_calls) == (0, 0, 1)
        assert row.score == 0.25 and row.reason == "it differs"
    assert report.summary.mean_score == 0.25 and report.summary.same_final == 0
    [row] = broken.rows
    assert row.score is None and row.judge_error == "RuntimeError: the judge fell over"
    assert broken.summary.judge_errors == 1
    assert sorted(r.source for r in again.rows) == sorted(sources)
    assert again.summary.skipped >= 3  # the replays of the first two evaluations at least


async def test_running_the_same_evaluation_again_attaches_to_it(
    harness: HarnessFactory, client: Client
) -> None:
    agent = _agent()
    async with harness(TOOLS, **_config(agent)) as h:
        await _recorded(h, agent, 1)
        await _listed(client, agent, 1)
        query = f"TurnkeepAgent = '{agent}'"
        first = await evaluate(client, query, task_queue=h.task_queue)
        done = await first.report()
        second = await evaluate(client, query, task_queue=h.task_queue)
        assert second.workflow_id == first.workflow_id
        assert await second.report() == done
        assert (await second.progress()).finished
        fresh = await evaluate(client, query, task_queue=h.task_queue, fresh=True)
        again = await fresh.report()
    assert fresh.workflow_id == first.workflow_id
    assert [r.source for r in again.rows] == [r.source for r in done.rows]
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{first.workflow_id}'")]
    assert len(runs) == 2


async def test_recorded_turns_as_a_regression_suite(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    agent = _agent()
    config = _config(agent)
    config["agents"][agent]["playback"] = str(write_script(tmp_path / "p.json", "changed"))
    async with harness(TOOLS, **config) as h:
        await _recorded(h, agent, 2)
        await _listed(client, agent, 2)
        query = f"TurnkeepAgent = '{agent}'"
        CALLS.clear()
        passed = await assert_replays(
            client, query, task_queue=h.task_queue, same_final=True, judge=JUDGE, min_score=1
        )
        with pytest.raises(EvaluationFailedError) as caught:
            await assert_replays(
                client, query, task_queue=h.task_queue, model="playback", same_final=True
            )
        with pytest.raises(EvaluationFailedError, match="matched 0 turn"):
            await assert_replays(client, "TurnkeepAgent = 'nobody'", task_queue=h.task_queue)
    assert CALLS == [] and passed.summary.replayed == 2
    failed = caught.value
    assert len(failed.failures) == 2 and "answered 'changed', recorded 'counted" in str(failed)


@pytest.mark.slow
async def test_the_cli_prints_the_table_and_writes_the_report(
    harness: HarnessFactory, client: Client, temporal: ServerInfo, tmp_path: Path
) -> None:
    agent = _agent()
    async with harness(TOOLS, **_config(agent)) as h:
        sources = await _recorded(h, agent, 2)
        await _listed(client, agent, 2)
        config = tmp_path / "turnkeep.yaml"
        config.write_text(json.dumps({"task_queue": h.task_queue, **_config(agent)}))
        query = f"TurnkeepAgent = '{agent}'"
        args = ["replay", "--query", query, "--judge", JUDGE, "--config", str(config)]
        ran = await asyncio.to_thread(
            turnkeep, *args, "--report", str(tmp_path / "out.csv"), temporal=temporal, cwd=tmp_path
        )
        assert ran.returncode == 0, ran.stderr
        assert "2 turns: 2 replayed, 0 failed, 2 with the same final answer" in ran.stdout
        assert "mean score 1.00 over 2 scored pairs" in ran.stdout
        assert all(source in ran.stdout for source in sources)
        rows = list(csv.DictReader((tmp_path / "out.csv").open()))
        assert sorted(r["source"] for r in rows) == sorted(sources)
        # The same command again attaches to the evaluation it started: no replay again.
        again = await asyncio.to_thread(turnkeep, *args, "--json", temporal=temporal, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        report = EvaluationReport.model_validate_json(again.stdout)
        assert sorted(r.replay for r in report.rows) == sorted(r["replay"] for r in rows)
    both = turnkeep("replay", "turn-x", "--query", "", temporal=temporal, cwd=tmp_path)
    assert both.returncode != 0 and "give a TURN or --query, not both" in both.stderr
    live = turnkeep("replay", "--query", "", "--live-tools", temporal=temporal, cwd=tmp_path)
    assert "an evaluation never runs tools live" in live.stderr


async def test_the_recorded_model_answers_a_replay_as_the_recording_did(
    harness: HarnessFactory, client: Client, tmp_path: Path
) -> None:
    """Where the model is unchanged, a regression runs on its recorded answers: no model and
    no tool is called, whatever the agent's model would say today."""
    agent = _agent()
    script = tmp_path / "answers.json"
    call = {"tool_calls": {"c1": {"name": "local__count", "arguments": {"label": "x"}}}}
    write_script(script, call, "as recorded")
    config = _config(agent)
    config["agents"][agent].update(model="playback", playback=str(script), models=["recorded"])
    async with harness(TOOLS, **config) as h:
        source = await h.run("go", agent=agent)
        assert source.final is not None and source.final.text == "as recorded"
        await _listed(client, agent, 1)
        write_script(script, "the model changed its mind")
        CALLS.clear()
        query = f"TurnkeepAgent = '{agent}'"
        report = await assert_replays(
            client, query, task_queue=h.task_queue, model="recorded", same_final=True
        )
        with pytest.raises(EvaluationFailedError, match="the model changed its mind"):
            await assert_replays(client, query, task_queue=h.task_queue, same_final=True)
        plain = await h.run("hello", agent=agent, model="recorded")
    assert CALLS == []
    [row] = report.rows
    assert (row.same_calls, row.new_calls, row.missing_calls) == (1, 0, 0)
    assert plain.stop_reason == "error" and plain.final is not None
    assert "answers only a replay" in plain.final.text


@pytest.mark.parametrize("bad", [{"query": "", "command": "rm -rf /"}, {"limit": 10**6}, "x"])
async def test_a_bad_start_fails_the_evaluation_at_once(
    harness: HarnessFactory, client: Client, bad: Any
) -> None:
    """Any client can start the workflow with anything: it fails, it does not hang."""
    async with harness(TOOLS, **_config(_agent())) as h:
        handle = await client.start_workflow(
            EVALUATION_WORKFLOW, bad, id=f"eval-bad-{uuid.uuid4().hex[:8]}", task_queue=h.task_queue
        )
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), 20)
