"""What an operator sees in the Temporal Web UI, checked in a real headless Chromium: a finished
turn's Event History shows each activity's summary, and with turnkeep's codec server the
encrypted prompt reads as plain text, for a browser signed in with the codec server's token
and for no other; a turn awaiting approval names the waiting call in its current details and
says `AwaitingApproval` in its search attributes."""

from __future__ import annotations

import base64
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.async_api import Page, expect

from tests.conftest import Harness, eventually, history_text, make_settings
from tests.web_ui import (
    chromium,
    encryption_config,
    event_summaries,
    expect_shown,
    open_compact_history,
    send_credentials_to_codec_server,
    sign_in_to_codec_server,
    web_ui_with_codec,
)
from turnkeep.client.connection import connect
from turnkeep.config.settings import ApprovalSettings, Settings
from turnkeep.devserver.embedded import ServerInfo
from turnkeep.worker.build import build_worker
from turnkeep.workflows import visibility

# Its own server with the Web UI, and Chromium.
pytestmark = [pytest.mark.asyncio, pytest.mark.server, pytest.mark.slow]

PROMPT = "Add the two invoice totals for Ms. Quillfeather, please."
TOKEN = secrets.token_urlsafe(24)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@dataclass(frozen=True)
class Stack:
    server: ServerInfo
    settings: Settings


@dataclass(frozen=True)
class FinishedTurn:
    url: str  # the Web UI page of the turn's (only) run
    call_id: str  # the id of its one tool call
    summaries: list[str]  # its events' summaries, read from the history
    input_ciphertext: str  # its input payload as stored (base64), which is what a UI can show


@pytest.fixture(scope="module")
async def stack(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """Workers that encrypt every payload, and a dev server (for this module only: the shared
    one runs headless) whose Web UI decrypts them through turnkeep's codec server."""
    settings = make_settings(
        tmp_path_factory.mktemp("turn"),
        agents={"test": {"model": "passthrough", "servers": ["local"]}},
        encryption=encryption_config(TOKEN),
    )
    assert settings.encryption is not None
    async with web_ui_with_codec(settings.encryption) as server:
        yield Stack(server, settings)


@pytest.fixture(scope="module")
async def finished_turn(stack: Stack) -> FinishedTurn:
    """One real turn: the passthrough model asks for a tool, the tool runs, the model answers."""
    client = await connect(stack.server.address, stack.server.namespace, settings=stack.settings)
    task_queue = f"browser-{uuid.uuid4().hex[:10]}"
    worker = build_worker(
        client, stack.settings, function_tools={"local": [add]}, task_queue=task_queue
    )
    async with worker:
        turn = await Harness(client, stack.settings, task_queue).start(
            f'{PROMPT}\n***CALL_TOOL local__add {{"a": 1200, "b": 34}}'
        )
        result = await turn.result()
    assert result.final is not None and result.final.text == "1234"
    [call_id] = [cid for m in result.messages for cid in m.tool_calls or {}]
    # Without the codec the history holds no prompt: whatever shows it in the UI decrypted it.
    history = await turn.handle.fetch_history()
    assert PROMPT not in history_text(history)
    [stored_input] = history.events[0].workflow_execution_started_event_attributes.input.payloads
    url = stack.server.workflow_url(turn.workflow_id, turn.handle.first_execution_run_id)
    assert url is not None
    summaries = await event_summaries(client, turn.handle)
    return FinishedTurn(url, call_id, summaries, base64.b64encode(stored_input.data).decode())


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    """A page in a fresh browser profile: no sign-in or UI setting carries over between tests."""
    async with chromium(tmp_path / "profile") as context:
        yield await context.new_page()


async def test_signed_in_operator_sees_summaries_and_prompt(
    stack: Stack, finished_turn: FinishedTurn, page: Page, tmp_path: Path
) -> None:
    summaries = finished_turn.summaries
    # What the workflow wrote (``turnkeep.workflows.visibility``); the page is then checked for
    # exactly that. Summaries are payloads too, so they are encrypted and need the codec server.
    assert "llm #1 · passthrough" in summaries, summaries
    # Its call runs, so the `tool …` row tells that outcome: no row of its own.
    assert "llm #1 · passthrough → toolUse(1)" not in summaries, summaries
    assert f"tool local__add · {finished_turn.call_id}" in summaries, summaries
    assert "llm #2 · passthrough → endTurn" in summaries, summaries
    assert stack.server.codec_endpoint is not None

    await sign_in_to_codec_server(page, stack.server.codec_endpoint, TOKEN)
    await send_credentials_to_codec_server(page, stack.server)
    await open_compact_history(page, finished_turn.url)
    await expect_shown(page, summaries)
    # The turn's input, decrypted, in the Input panel (a line of its JSON: `"text": "Add …`).
    await expect_shown(page, [PROMPT], exact=False)

    screenshot = tmp_path / "history.png"
    await page.screenshot(path=screenshot)
    assert screenshot.read_bytes().startswith(b"\x89PNG")


async def test_without_the_token_the_prompt_stays_encrypted(
    stack: Stack, finished_turn: FinishedTurn, page: Page
) -> None:
    # Everything an operator sets up, except signing in: the codec server refuses to decode.
    await send_credentials_to_codec_server(page, stack.server)
    await open_compact_history(page, finished_turn.url)
    await expect_shown(page, ["Codec Server could not connect"])
    # The history has loaded (a Compact row per activity, by type: type names are not
    # encrypted), and the Input panel shows the stored ciphertext where the prompt would be.
    await expect_shown(page, ["prepare_turn", "llm_step", "call_tool"])
    await expect_shown(page, [finished_turn.input_ciphertext], exact=False)
    await expect(page.get_by_text(PROMPT)).to_have_count(0)
    for summary in finished_turn.summaries:
        await expect(page.get_by_text(summary, exact=True)).to_have_count(0)


async def test_operator_sees_a_call_awaiting_approval(stack: Stack, page: Page) -> None:
    gated = stack.settings.agents["test"].model_copy(
        update={"approval": ApprovalSettings(tools=["local__add"])}
    )
    settings = stack.settings.model_copy(update={"agents": {"gated": gated}})
    client = await connect(stack.server.address, stack.server.namespace, settings=settings)
    task_queue = f"browser-{uuid.uuid4().hex[:10]}"
    worker = build_worker(client, settings, function_tools={"local": [add]}, task_queue=task_queue)
    # The worker runs while the page is open: the Web UI asks it for the current details.
    async with worker:
        turn = await Harness(client, settings, task_queue).start(
            '***CALL_TOOL local__add {"a": 1, "b": 2}', agent="gated"
        )
        [pending] = await eventually(turn.pending_approvals, "the call awaits approval")

        async def awaiting() -> bool:
            described = await turn.handle.describe()
            return described.typed_search_attributes.get(visibility.STATUS) == "AwaitingApproval"

        await eventually(awaiting, "TurnkeepStatus is AwaitingApproval")
        url = stack.server.workflow_url(turn.workflow_id, turn.handle.first_execution_run_id)
        assert url is not None and stack.server.codec_endpoint is not None

        await sign_in_to_codec_server(page, stack.server.codec_endpoint, TOKEN)
        await send_credentials_to_codec_server(page, stack.server)
        await page.goto(url)
        await page.get_by_role("tab", name="User Metadata").click()
        # The current details are markdown, drawn in an iframe of their own (the last).
        details = page.frame_locator("iframe").last
        await expect(details.get_by_text("awaiting approval")).to_be_visible()
        await expect(details.get_by_text(pending.call_id, exact=True)).to_be_visible()
        await page.get_by_role("tab", name="Search Attributes").click()
        await expect_shown(page, ['"TurnkeepStatus": "AwaitingApproval"'], exact=False)
        await turn.cancel()  # nothing left running on the module's server
