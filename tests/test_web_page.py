"""The gateway's web page (issue #34) in a real headless Chromium, against the real dev server,
a real worker and the fake model API streaming its answers: a chat whose text appears while
the model writes it, calls waiting for approval decided on the page (one denied with a reason,
one approved with edited arguments) reaching the turn, and a reload resuming the chat."""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import pytest
from playwright.async_api import BrowserContext, Page, expect

from tests.conftest import Harness, HarnessFactory
from tests.web_ui import chromium
from turnkeep.client.turns import get_turn
from turnkeep.doors.gateway import gateway_app
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import FakeModelApi, Reply

# Chromium, a gateway and a worker per test.
pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

KEY = "web-page-key-0123456789abcdef"
WEB_UI = "http://temporal-ui.invalid"
# What the page waits for: a worker and the fake model answer in well under this.
TIMEOUT_MS = 30_000


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def config(fake: FakeModelApi) -> dict[str, Any]:
    return {
        "openai": {"api_key": "sk-test-0123456789", "base_url": fake.base_url_openai},
        "agents": {
            "adder": {
                "model": "openai.test-model",
                "servers": ["local"],
                "description": "Adds numbers, with your approval.",
                "approval": {"tools": ["local__add"]},
            }
        },
        "streaming": {"listen": "127.0.0.1:0"},
        "gateway": {
            "keys": {"browser": {"key": KEY, "agents": ["*"], "decide": True}},
            "web_ui": WEB_UI,
        },
    }


@pytest.fixture(scope="module")
async def browser(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[BrowserContext]:
    """One Chromium for the module; each test's gateway is a new origin, so a new key store."""
    async with chromium(tmp_path_factory.mktemp("profile")) as context:
        context.set_default_timeout(TIMEOUT_MS)
        yield context


@contextlib.asynccontextmanager
async def page_on_gateway(
    harness: HarnessFactory, fake: FakeModelApi, browser: BrowserContext
) -> AsyncIterator[tuple[Harness, Page]]:
    """A worker, the gateway over it on a free port, and a page open on it with the key
    given."""
    async with harness({"local": [add]}, **config(fake)) as h:
        app = gateway_app(h.client, h.settings, task_queue=h.task_queue)
        server = AsgiServer(app, name="gateway")
        port = await server.start(bind("127.0.0.1", 0))
        page = await browser.new_page()
        try:
            await page.goto(http_url("127.0.0.1", port) + "/")
            # Asked in a dialog; a key the gateway refuses is asked for again.
            dialog = page.get_by_role("dialog", name="API key")
            await expect(dialog).to_be_visible()
            await dialog.get_by_label("API key").fill("not-the-key-0123456789")
            await dialog.get_by_role("button", name="Save").click()
            await expect(page.get_by_role("alert")).to_contain_text("refused the API key")
            await expect(dialog).to_be_visible()
            await dialog.get_by_label("API key").fill(KEY)
            await dialog.get_by_role("button", name="Save").click()
            await expect(page.get_by_label("Agent")).to_have_value("adder")
            await expect(page.get_by_text("Adds numbers, with your approval.")).to_be_visible()
            yield h, page
        finally:
            await page.close()
            await app.state.gateway.hub.aclose()
            await server.stop()


async def new_chat(page: Page) -> None:
    await page.get_by_role("button", name="New chat").click()
    await expect(page).to_have_url(re.compile(r"/#session=[^&]+$"))
    await expect(page.get_by_role("heading", name="Chat with adder")).to_be_visible()


async def send(page: Page, text: str) -> None:
    box = page.get_by_label("Message", exact=True)
    await box.fill(text)
    await box.press("Enter")


def transcript(page: Page) -> Any:
    return page.get_by_role("list", name="Conversation")


def answers(page: Page) -> Any:
    """The agent's finished messages in the transcript."""
    return transcript(page).locator(".message.assistant")


def answer_texts(page: Page) -> Any:
    return answers(page).locator(".text")


async def test_live_text_appears_before_the_message_is_complete(
    harness: HarnessFactory, fake: FakeModelApi, browser: BrowserContext
) -> None:
    held = threading.Event()
    answer = "Counting sheep for you: one, two, three, and four."
    # Every word but the last is sent; the last waits until the page has shown the others.
    fake.script(Reply.text(answer, hold=held), api="openai")
    try:
        async with page_on_gateway(harness, fake, browser) as (_h, page):
            await new_chat(page)
            await send(page, "Count some sheep, please.")
            await expect(transcript(page)).to_contain_text("Count some sheep, please.")
            await expect(page.locator("#live-text")).to_contain_text("Counting sheep for you")
            # Live: the message itself has not arrived (the model is still writing).
            await expect(answers(page)).to_have_count(0)
            held.set()
            await expect(answers(page)).to_have_count(1)
            await expect(answers(page).locator(".text")).to_have_text(answer)
            await expect(page.locator("#live")).to_be_hidden()
            # The turn's heading links to its workflow in the Web UI.
            link = transcript(page).get_by_role("link", name="open in Temporal Web UI")
            turn_id = await transcript(page).locator(".turn-mark").get_attribute("data-turn-id")
            assert turn_id is not None
            await expect(link).to_have_attribute(
                "href", f"{WEB_UI}/namespaces/default/workflows/{quote(turn_id, safe='')}"
            )
            # Ending the chat closes the session: its stream ends, and the page says so.
            await page.get_by_role("button", name="End chat").click()
            await expect(page.get_by_role("status")).to_have_text("This chat has ended.")
            await expect(page.get_by_role("button", name="Send")).to_be_disabled()
    finally:
        held.set()


async def test_approvals_decided_on_the_page_reach_the_turn(
    harness: HarnessFactory, fake: FakeModelApi, browser: BrowserContext
) -> None:
    fake.script(
        Reply.tool_calls(
            ("call_deny", "local__add", {"a": 1, "b": 1}),
            ("call_edit", "local__add", {"a": 1, "b": 2}),
            text="Adding both pairs.",
        ),
        Reply.text("One was refused; the other came to 5."),
        api="openai",
    )
    async with page_on_gateway(harness, fake, browser) as (h, page):
        await new_chat(page)
        await send(page, "Add 1+1 and 1+2.")
        waiting = page.get_by_role("region", name="Waiting for your approval")
        denied = waiting.get_by_role("listitem").filter(has_text="call_deny")
        edited = waiting.get_by_role("listitem").filter(has_text="call_edit")
        # Each with the model's arguments.
        await expect(denied.locator(".arguments")).to_have_text('{"a":1,"b":1}')
        await expect(edited.locator(".arguments")).to_have_text('{"a":1,"b":2}')

        await denied.get_by_label("Reason (optional)").fill("one is enough")
        await denied.get_by_role("button", name="Deny").click()
        await expect(denied).to_have_count(0)

        await edited.get_by_role("button", name="Edit arguments").click()
        arguments = edited.get_by_label("Arguments (JSON object)")
        # Not an object: refused on the page, nothing sent.
        await arguments.fill("[2, 3]")
        await edited.get_by_role("button", name="Approve with these arguments").click()
        await expect(edited.get_by_role("alert")).to_have_text(
            "The arguments must be a JSON object."
        )
        await arguments.fill('{"a": 2, "b": 3}')
        await edited.get_by_role("button", name="Approve with these arguments").click()
        await expect(waiting).to_be_hidden()

        await expect(answers(page).last).to_contain_text("One was refused; the other came to 5.")
        results = transcript(page).locator(".tool-result")
        await expect(results).to_have_count(2)
        turn_id = await transcript(page).locator(".turn-mark").get_attribute("data-turn-id")
        assert turn_id is not None
        result = await get_turn(h.client, turn_id).result()

    # The turn ran the edited call, and the model was given its result and the denial.
    by_call = {d.call_id: d for d in result.decisions}
    assert by_call["call_deny"].decision == "deny"
    assert by_call["call_deny"].reason == "one is enough"
    assert by_call["call_edit"].decision == "approve"
    assert by_call["call_edit"].arguments == {"a": 2, "b": 3}
    assert by_call["call_edit"].original_arguments == {"a": 1, "b": 2}
    tool_answers = {
        m["tool_call_id"]: m["content"]
        for m in fake.requests_for("openai")[1].body["messages"]
        if m["role"] == "tool"
    }
    assert "5" in str(tool_answers["call_edit"])
    assert "one is enough" in str(tool_answers["call_deny"])


async def test_a_reload_resumes_the_chat(
    harness: HarnessFactory, fake: FakeModelApi, browser: BrowserContext
) -> None:
    """Reloaded while a call waits: the transcript so far and the waiting call come back, the
    call is approved from the reloaded page, and the chat goes on."""
    fake.script(
        Reply.tool_calls(("call_sum", "local__add", {"a": 2, "b": 2}), text="Adding them up."),
        Reply.text("The first answer: 4."),
        Reply.text("The second answer."),
        api="openai",
    )
    async with page_on_gateway(harness, fake, browser) as (_h, page):
        await new_chat(page)
        await send(page, "First question.")
        waiting = page.get_by_role("region", name="Waiting for your approval")
        await expect(waiting).to_contain_text("call_sum")
        await expect(answer_texts(page)).to_have_text(["Adding them up."])
        address = page.url

        await page.reload()
        # The key is kept: no dialog; the address names the session, whose transcript is shown.
        await expect(page.get_by_role("dialog", name="API key")).to_be_hidden()
        assert page.url == address
        await expect(transcript(page)).to_contain_text("First question.")
        await expect(answer_texts(page)).to_have_text(["Adding them up."])
        await waiting.get_by_role("button", name="Approve", exact=True).click()
        await expect(answer_texts(page)).to_have_text(["Adding them up.", "The first answer: 4."])

        await send(page, "Second question.")
        await expect(answer_texts(page)).to_have_text(
            ["Adding them up.", "The first answer: 4.", "The second answer."]
        )
    # The second turn was the same conversation: the model saw the first exchange.
    third = fake.requests_for("openai")[2].body["messages"]
    said = [str(m.get("content")) for m in third if m["role"] != "system"]
    assert "First question." in said[0] and "The first answer: 4." in said[3], said


async def test_fork_from_here_opens_a_chat_with_the_conversation_up_to_that_message(
    harness: HarnessFactory, fake: FakeModelApi, browser: BrowserContext
) -> None:
    fake.script(
        Reply.text("The first answer."),
        Reply.text("Another answer."),
        api="openai",
    )
    async with page_on_gateway(harness, fake, browser) as (_h, page):
        await new_chat(page)
        await send(page, "First question.")
        await expect(answer_texts(page)).to_have_text(["The first answer."])
        source = page.url
        await page.get_by_role("button", name="Fork from message 1").click()
        await expect(page).not_to_have_url(source)
        await expect(page).to_have_url(re.compile(r"/#session=[^&]+$"))
        # The fork holds the question, not the answer, and answers anew.
        await expect(transcript(page)).to_contain_text("First question.")
        await expect(answer_texts(page)).to_have_count(0)
        await send(page, "Answer again.")
        await expect(answer_texts(page)).to_have_text(["Another answer."])
    second = fake.requests_for("openai")[1].body["messages"]
    said = [str(m.get("content")) for m in second if m["role"] != "system"]
    assert "First question." in said[0] and "The first answer." not in " ".join(said), said
