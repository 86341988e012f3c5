"""``turnkeep --log-format json worker``: every line on stderr is a JSON object, the lines about
a turn carry its workflow and run ids, the activity lines their activity id and attempt, and
no secret from the configuration reaches the log (``turnkeep.observability.logs``)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from tests.conftest import write_script
from tests.worker_process import REPO, write_config
from turnkeep.client.turns import start_turn
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.observability.logs import TextFormatter

SECRET = "sk-ant-test-" + uuid.uuid4().hex  # a provider key the log must never show
WITHIN = 120.0

pytestmark = pytest.mark.slow


async def test_json_lines_carry_the_turn_and_the_call(
    temporal: ServerInfo, client: Client, tmp_path: Path
) -> None:
    task_queue = f"test-logs-{uuid.uuid4().hex[:10]}"
    record, release = tmp_path / "record.jsonl", tmp_path / "release"
    release.touch()  # the gated tool returns at once
    call = {
        "name": "gate__hold",
        "arguments": {"tag": "t", "record": str(record), "release": str(release)},
    }
    script = write_script(tmp_path / "script.json", {"tool_calls": {"c1": call}}, "all done")
    config = write_config(
        tmp_path / "turnkeep.yaml",
        {
            "task_queue": task_queue,
            "function_tools": {"gate": ["tests.gated_tool:hold"]},
            "anthropic": {"api_key": SECRET},
            "agents": {"test": {"servers": ["gate"], "model": "playback", "playback": str(script)}},
        },
    )
    stderr_path = tmp_path / "stderr.log"
    argv = [sys.executable, "-m", "turnkeep.cli", "--log-format", "json", "worker"]
    argv += ["--config", str(config), "--address", temporal.address]
    argv += ["--namespace", temporal.namespace]
    with stderr_path.open("wb") as stderr:
        worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not waited on here
            argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        turn = TurnInput.model_validate({"agent": "test", "messages": ["go"]})
        handle = await start_turn(client, turn, task_queue=task_queue)
        result = await asyncio.wait_for(handle.result(), WITHIN)
        assert result.final is not None and result.final.text == "all done"
    finally:
        worker.terminate()  # a graceful stop: its shutdown lines are JSON too
        code = await asyncio.to_thread(worker.wait, WITHIN)
    text = stderr_path.read_text()
    assert code == 0, text

    lines = [json.loads(line) for line in text.splitlines()]  # every line parses
    assert lines
    for line in lines:
        assert {"timestamp", "level", "logger", "message"} <= set(line), line
    turn_lines = [line for line in lines if line.get("workflow_id") == handle.workflow_id]
    assert any(line["message"].startswith("turn started") for line in turn_lines)
    assert any(line["message"].startswith("turn ended") for line in turn_lines)
    for line in turn_lines:
        assert line["run_id"], line
        # The SDK's dict suffix is left off: the ids are keys of their own.
        assert "{'" not in line["message"], line
    # turnkeep's own activity lines: one per model call and one per tool call.
    own = [line for line in turn_lines if line["logger"] == "temporalio.activity"]
    calls = [line for line in own if line.get("activity_type") == "call_tool"]
    models = [line for line in own if line.get("activity_type") == "llm_step"]
    assert [(c["call_id"], c["attempt"], c["tool"]) for c in calls] == [
        (
            "c1",
            1,
            "gate__hold",
        )
    ]
    assert len(models) == 2
    assert all(m["activity_id"] and m["attempt"] == 1 for m in [*calls, *models])
    # A plain logger's line inside the tool call names the call too.
    (holding,) = [line for line in lines if line["message"] == "holding t"]
    assert holding["logger"] == "tests.gated_tool"
    assert holding["workflow_id"] == handle.workflow_id
    assert (holding["activity_type"], holding["attempt"]) == ("call_tool", 1)
    assert holding["activity_id"] == calls[0]["activity_id"]
    assert any(line["message"].startswith("worker stopped") for line in lines)
    assert SECRET not in text


async def test_text_lines_carry_context_as_key_value() -> None:
    """A service's text line: one line, its context as key=value (quoted when it has spaces),
    a logged exception as its type and message, not a traceback; for a person, the message
    alone."""
    try:
        raise ValueError("no such file\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "temporalio.activity",
            logging.WARNING,
            __file__,
            1,
            "Completing activity as failed",
            None,
            sys.exc_info(),
        )
    record.temporal_activity = {
        "activity_id": "2",
        "activity_type": "list_tools",
        "attempt": 1,
        "workflow_id": "turn one",
        "heartbeat_details": ["not", "allowed"],
    }
    record.call_id = "call_1_1"
    line = TextFormatter(with_context=True).format(record)
    assert line == (
        'warning: Completing activity as failed workflow_id="turn one" activity_id=2 '
        'activity_type=list_tools attempt=1 call_id=call_1_1 error="ValueError: no such file"'
    )
    assert TextFormatter(with_context=False).format(record) == (
        "warning: Completing activity as failed"
    )
