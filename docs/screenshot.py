"""Take the README's pictures of the Web UI (not a test)::

    .venv/bin/python -m docs.screenshot [--only turn|approval|team] [--out-dir docs]

On a fresh embedded dev server, runs the bundled `demo` agent (examples/turnkeep.yaml) offline
on the passthrough model, with every payload encrypted, and looks at it in headless Chromium at
1400x900, signed in to turnkeep's codec server the way an operator does:

- ``web-ui-turn.png``: a prompt that asks for three tools; the finished turn's Event History
  (Compact view: one row per activity, with its summary): decrypted input, result and
  summaries.
- ``web-ui-awaiting-approval.png``: the demo agent with ``approval`` on
  ``toolbox__convert_*``, and a prompt that asks for a conversion and a calculation at once:
  the calculation runs, the conversion waits. The running turn's User Metadata tab (its current
  details list the call awaiting approval, and since when) above its Search Attributes tab
  (``TurnkeepStatus`` is ``AwaitingApproval``), two views of one page put together.
- ``web-ui-team.png``: an agent (``lead``) that has the demo agent as a tool and calls it twice
  at once; the finished parent turn's Event History (Compact view): its model calls and the two
  child workflows, each the demo agent's own turn.

- ``web-page.png``: the gateway's web page (``turnkeep.doors.web``), mid-chat with the demo
  agent (``approval`` on ``toolbox__convert_*``), its model the fake model API scripted to
  answer a first question, then to ask for a conversion and a calculation at once: the
  calculation runs, the conversion waits with its reason filled in; the whole page.

Needs /usr/bin/chromium (`make test` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

from playwright.async_api import BrowserContext, Page, expect

from tests.web_ui import (
    VIEWPORT,
    chromium,
    encryption_config,
    event_summaries,
    expect_shown,
    open_compact_history,
    send_credentials_to_codec_server,
    shown,
    sign_in_to_codec_server,
    web_ui_with_codec,
)
from turnkeep.client.connection import connect
from turnkeep.client.turns import TurnHandle, start_turn
from turnkeep.config.files import load_settings
from turnkeep.config.settings import (
    AgentSettings,
    ApprovalSettings,
    EncryptionSettings,
    GatewaySettings,
    ProviderSettings,
    Settings,
    StreamingSettings,
)
from turnkeep.contract.turn_io import TurnInput
from turnkeep.devserver.embedded import EmbeddedServer
from turnkeep.doors.gateway import gateway_app
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.testing.fake_api import FakeModelApi, Reply
from turnkeep.worker.build import build_worker, build_workers
from turnkeep.workflows import visibility

REPO = Path(__file__).resolve().parent.parent
QUESTION = "Three quick ones: a marathon in km, 451 °F in °C, and the word count of our motto."
CALLS = [
    ("toolbox__calculate", {"expression": "26.2 * 1.609344"}),
    ("toolbox__convert_units", {"value": 451, "from_unit": "fahrenheit", "to_unit": "celsius"}),
    ("toolbox__word_stats", {"text": "The workflow history is the checkpoint."}),
]
PROMPT = "\n".join([QUESTION, *(f"***CALL_TOOL {name} {json.dumps(args)}" for name, args in CALLS)])

# The approval picture: one call of the batch gated, the other not.
GATED = "toolbox__convert_*"
APPROVAL_QUESTION = "Convert 451 °F to °C, and work out a marathon in km."
APPROVAL_CALLS = [
    ("toolbox__convert_units", {"value": 451, "from_unit": "fahrenheit", "to_unit": "celsius"}),
    ("toolbox__calculate", {"expression": "26.2 * 1.609344"}),
]
APPROVAL_PROMPT = "\n".join(
    [APPROVAL_QUESTION, *(f"***CALL_TOOL {name} {json.dumps(a)}" for name, a in APPROVAL_CALLS)]
)
# The team picture: the demo agent called as a tool, twice in one answer.
TEAM_QUESTION = "Ask the demo agent two things at once: a marathon in km, and our motto's words."
TEAM_CALLS = [
    {"message": f"***CALL_TOOL {name} {json.dumps(arguments)}"}
    for name, arguments in (CALLS[0], CALLS[2])
]
TEAM_PROMPT = "\n".join(
    [TEAM_QUESTION, *(f"***CALL_TOOL agent__demo {json.dumps(call)}" for call in TEAM_CALLS)]
)

# Seconds to wait for the turn to reach its approval wait (a loaded machine is slow).
WAIT_SECONDS = 120.0


def demo_settings(token: str, *, approval: ApprovalSettings | None = None) -> Settings:
    """The bundled demo config, offline, every payload encrypted (codec server with ``token``),
    and optionally the demo agent's approval rules."""
    # The demo config picks a real model when a provider key is set; the picture must not
    # depend on one.
    os.environ["TURNKEEP_MODEL"] = "passthrough"
    # The demo's tool server is started as `python demo_tools.py`: this venv's python, as
    # `make demo` has it.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    demo = load_settings(REPO / "examples" / "turnkeep.yaml")
    encryption = EncryptionSettings.model_validate(encryption_config(token))
    update: dict[str, object] = {"encryption": encryption}
    if approval is not None:
        agent = demo.agents["demo"].model_copy(update={"approval": approval})
        update["agents"] = {**demo.agents, "demo": agent}
    return demo.model_copy(update=update)


async def picture_of_finished_turn(
    settings: Settings, token: str, turn_input: TurnInput, out: Path, scroll_to: str | None
) -> None:
    """Run ``turn_input`` to its end on ``settings``' workers, then picture its Event History
    (Compact view, oldest first) from the tabs down, with the Input panel scrolled to
    ``scroll_to`` when given."""
    assert settings.encryption is not None
    with tempfile.TemporaryDirectory(prefix="turnkeep-screenshot-") as tmp:
        async with web_ui_with_codec(settings.encryption) as server:
            client = await connect(server.address, server.namespace, settings=settings)
            async with build_workers(client, settings):
                turn = await start_turn(client, turn_input)
                await turn.result()
            url = server.workflow_url(turn.workflow_id, turn.handle.first_execution_run_id)
            assert url is not None and server.codec_endpoint is not None
            summaries = await event_summaries(client, turn.handle)
            async with chromium(Path(tmp) / "profile") as browser:
                page = await browser.new_page()
                await sign_in_to_codec_server(page, server.codec_endpoint, token)
                await send_credentials_to_codec_server(page, server)
                await open_compact_history(page, url)
                await expect_shown(page, summaries)
                # Oldest first, so the rows read as the turn went.
                await page.get_by_role("button", name="Descending").click()
                await expect_shown(page, ["Ascending"])
                if scroll_to is not None:
                    await expect_shown(page, [scroll_to], exact=False)
                    await shown(page, scroll_to, exact=False).evaluate(
                        "line => line.scrollIntoView({block: 'center'})"
                    )
                # Start the picture at the tabs so the input and the rows both fit; keep the
                # pointer off the rows (it would draw a tooltip).
                await page.get_by_role("tablist", name="workflow detail").evaluate(
                    "tabs => tabs.scrollIntoView({block: 'start'})"
                )
                await page.mouse.move(VIEWPORT["width"] * 0.6, 100)  # between the panels
                await page.screenshot(path=out)
    print(f"wrote {out}")


async def take(out: Path) -> None:
    token = secrets.token_urlsafe(24)
    turn_input = TurnInput(agent="demo", messages=[PROMPT])
    await picture_of_finished_turn(demo_settings(token), token, turn_input, out, QUESTION)


async def awaiting_approval(turn: TurnHandle) -> str:
    """Once ``turn`` waits for a decision and says so in ``TurnkeepStatus``: the waiting call's
    id."""
    deadline = asyncio.get_running_loop().time() + WAIT_SECONDS
    while True:
        pending = await turn.pending_approvals()
        described = await turn.handle.describe()
        if pending and described.typed_search_attributes.get(visibility.STATUS) == (
            visibility.TurnStatus.AWAITING_APPROVAL.value
        ):
            return pending[0].call_id
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"{turn.workflow_id} did not await approval in {WAIT_SECONDS:g} s")
        await asyncio.sleep(0.2)


async def open_tab(page: Page, name: str) -> None:
    """One of the workflow page's tabs (User Metadata, Search Attributes...)."""
    await page.get_by_role("tab", name=name).click()


async def take_approval(out: Path) -> None:
    token = secrets.token_urlsafe(24)
    settings = demo_settings(token, approval=ApprovalSettings(tools=[GATED]))
    assert settings.encryption is not None
    with tempfile.TemporaryDirectory(prefix="turnkeep-screenshot-") as tmp:
        async with web_ui_with_codec(settings.encryption) as server:
            client = await connect(server.address, server.namespace, settings=settings)
            # The worker stays up while the picture is taken: the Web UI asks it for the
            # running turn's current details.
            async with build_worker(client, settings):
                turn = await start_turn(client, TurnInput(agent="demo", messages=[APPROVAL_PROMPT]))
                call_id = await awaiting_approval(turn)
                url = server.workflow_url(turn.workflow_id, turn.handle.first_execution_run_id)
                assert url is not None and server.codec_endpoint is not None
                async with chromium(Path(tmp) / "profile") as browser:
                    page = await browser.new_page()
                    await sign_in_to_codec_server(page, server.codec_endpoint, token)
                    await send_credentials_to_codec_server(page, server)
                    await page.goto(url)
                    await open_tab(page, "User Metadata")
                    # The tab draws the summary and the current details (markdown) in iframes
                    # of their own: the summary is the decrypted prompt, the details name the
                    # call that waits.
                    summary = page.frame_locator("iframe").first
                    details_frame = page.frame_locator("iframe").last
                    await expect(
                        summary.get_by_text(APPROVAL_QUESTION, exact=False)
                    ).to_be_visible()
                    await expect(details_frame.get_by_text("awaiting approval")).to_be_visible()
                    waiting = details_frame.get_by_text(call_id, exact=True)
                    await expect(waiting).to_be_visible()
                    await waiting.scroll_into_view_if_needed()
                    await page.mouse.move(VIEWPORT["width"] - 5, VIEWPORT["height"] - 5)
                    box = await waiting.bounding_box()
                    assert box is not None
                    details = await page.screenshot(
                        clip={"x": 0, "y": 0, "width": VIEWPORT["width"], "height": box["y"] + 60}
                    )
                    await open_tab(page, "Search Attributes")
                    await expect_shown(page, ['"AwaitingApproval"'], exact=False)
                    heading = page.get_by_role("heading", name="Search Attributes", exact=True)
                    last = shown(page, '"TurnkeepTokens"', exact=False)
                    top, bottom = await heading.bounding_box(), await last.bounding_box()
                    assert top is not None and bottom is not None
                    # The page's content only (the navigation is in the picture above).
                    left = top["x"] - 16
                    attributes = await page.screenshot(
                        clip={
                            "x": left,
                            "y": top["y"] - 16,
                            "width": VIEWPORT["width"] - left,
                            "height": bottom["y"] + bottom["height"] + 56 - top["y"],
                        }
                    )
                    await _stack(browser, [(details, 0), (attributes, left)], out)
    print(f"wrote {out}")


async def take_team(out: Path) -> None:
    token = secrets.token_urlsafe(24)
    demo = demo_settings(token)
    lead = AgentSettings(
        model="passthrough", agents=["demo"], description="Hands work to the demo agent."
    )
    settings = demo.model_copy(update={"agents": {**demo.agents, "lead": lead}})
    turn_input = TurnInput(agent="lead", messages=[TEAM_PROMPT])
    await picture_of_finished_turn(settings, token, turn_input, out, None)


# The web page picture: a first exchange, then a batch of two calls, one of them gated.
PAGE_FIRST = "Hi! What can you help me with today?"
PAGE_FIRST_ANSWER = (
    "Hello! I can do arithmetic, convert units, count words and tell the time, using the "
    "toolbox. Anything that changes units waits for your approval first."
)
PAGE_QUESTION = "Convert 451 °F to °C, and work out how long a marathon is in km."
PAGE_TEXT = "I'll convert the temperature and work out the marathon distance at the same time."


async def take_page(out: Path) -> None:
    key = secrets.token_urlsafe(24)
    demo = demo_settings(key)
    with FakeModelApi() as fake:
        fake.script(
            Reply.text(PAGE_FIRST_ANSWER),
            Reply.tool_calls(
                ("call_convert", APPROVAL_CALLS[0][0], APPROVAL_CALLS[0][1]),
                ("call_marathon", APPROVAL_CALLS[1][0], APPROVAL_CALLS[1][1]),
                text=PAGE_TEXT,
            ),
            api="openai",
        )
        agent = demo.agents["demo"].model_copy(
            update={
                "model": "openai.demo-model",
                "description": "The toolbox demo: arithmetic, units, text statistics, time.",
                "approval": ApprovalSettings(tools=[GATED]),
            }
        )
        async with EmbeddedServer() as server:
            settings = demo.model_copy(
                update={
                    "agents": {"demo": agent},
                    "encryption": None,
                    "openai": fake_openai(fake),
                    "streaming": StreamingSettings.model_validate({"listen": "127.0.0.1:0"}),
                    "gateway": GatewaySettings.model_validate(
                        {
                            "keys": {"docs": {"key": key, "agents": ["*"], "decide": True}},
                            "web_ui": server.ui_url,
                        }
                    ),
                }
            )
            client = await connect(server.address, server.namespace, settings=settings)
            app = gateway_app(client, settings)
            gateway = AsgiServer(app, name="gateway")
            port = await gateway.start(bind("127.0.0.1", 0))
            try:
                # Workers as `turnkeep worker` runs them: the gateway starts sessions on the
                # agent's own queue.
                async with (
                    build_workers(client, settings),
                    chromium(Path(tempfile.mkdtemp(prefix="turnkeep-screenshot-"))) as browser,
                ):
                    page = await browser.new_page()
                    await page.goto(http_url("127.0.0.1", port) + "/")
                    await page.get_by_role("textbox", name="API key").fill(key)
                    await page.get_by_role("button", name="Save").click()
                    await page.get_by_role("button", name="New chat").click()
                    box = page.get_by_label("Message", exact=True)
                    await box.fill(PAGE_FIRST)
                    await box.press("Enter")
                    answers = page.locator("#transcript .message.assistant")
                    await expect(answers).to_have_count(1, timeout=WAIT_SECONDS * 1000)
                    await box.fill(PAGE_QUESTION)
                    await box.press("Enter")
                    waiting = page.get_by_role("region", name="Waiting for your approval")
                    await expect(waiting).to_be_visible(timeout=WAIT_SECONDS * 1000)
                    await waiting.get_by_label("Reason (optional)").fill("Checked: Fahrenheit.")
                    # The approval can show before the turn's messages do: wait for those.
                    await expect(answers).to_have_count(2, timeout=WAIT_SECONDS * 1000)
                    await expect(page.locator("#transcript .sending")).to_have_count(0)
                    await page.evaluate("document.activeElement.blur()")
                    await page.mouse.move(5, 5)
                    await page.screenshot(path=out, full_page=True)
                    await app.state.gateway.hub.aclose()
            finally:
                await gateway.stop()
    print(f"wrote {out}")


def fake_openai(fake: FakeModelApi) -> ProviderSettings:
    return ProviderSettings.model_validate(
        {"api_key": "sk-docs-0123456789", "base_url": fake.base_url_openai}
    )


async def _stack(browser: BrowserContext, pictures: list[tuple[bytes, float]], out: Path) -> None:
    """``pictures`` (each with its left offset) one above the other, a rule between them,
    saved as one PNG: drawn by the browser itself, so no imaging library is needed."""
    images = "<hr>".join(
        f'<img style="margin-left:{left:.0f}px" '
        f'src="data:image/png;base64,{base64.b64encode(picture).decode()}">'
        for picture, left in pictures
    )
    page = await browser.new_page()
    await page.set_content(
        "<style>body{margin:0;background:#fff}img{display:block}"
        "hr{margin:0;border:0;border-top:2px solid #c9ced6}</style>" + images
    )
    await page.locator("img").last.wait_for()
    await page.screenshot(path=out, full_page=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only", choices=["turn", "approval", "team", "page"], help="one picture only"
    )
    parser.add_argument("--out-dir", type=Path, default=REPO / "docs")
    args = parser.parse_args()
    if args.only in (None, "turn"):
        asyncio.run(take(args.out_dir / "web-ui-turn.png"))
    if args.only in (None, "approval"):
        asyncio.run(take_approval(args.out_dir / "web-ui-awaiting-approval.png"))
    if args.only in (None, "team"):
        asyncio.run(take_team(args.out_dir / "web-ui-team.png"))
    if args.only in (None, "page"):
        asyncio.run(take_page(args.out_dir / "web-page.png"))


if __name__ == "__main__":
    main()
