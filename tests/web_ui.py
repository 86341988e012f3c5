"""The Temporal Web UI in a real headless Chromium, with turnkeep's codec server decrypting what
it shows, for ``tests.test_browser`` and the documentation's screenshot script.

The browser is Debian's `chromium` package (`make test` installs it when it is missing), driven
by Playwright. Playwright's own browser downloads (`playwright install`) are never used: the
system browser is what an operator on this machine would open.
"""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from playwright.async_api import BrowserContext, Locator, Page, async_playwright, expect
from temporalio.client import Client, WorkflowHandle

from turnkeep.config.settings import EncryptionSettings
from turnkeep.devserver.embedded import HOST, EmbeddedServer, ServerInfo, free_port
from turnkeep.payloads.codec_server import CodecServer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    # CI runs as root, where Chromium's sandbox cannot start.
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    # Chromium's own services (field trials, component updates, sync, QUIC probes) call out to
    # Google. On a closed network those connections are refused, and enough refusals slow the
    # browser down or make it drop the page's own loopback connections.
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
VIEWPORT = {"width": 1400, "height": 900}
# The UI is a single-page app that loads its bundle, then the workflow, then its history, then
# asks the codec server to decode it, each a round trip to a server that may be busy with other
# work: be patient, and never sleep.
UI_TIMEOUT_MS = 120_000


def encryption_config(token: str) -> dict[str, Any]:
    """turnkeep.yaml's ``encryption`` with a fresh random key, and the codec server on any free
    port with ``token``."""
    key = base64.b64encode(os.urandom(32)).decode()
    return {"current_key": "k1", "keys": {"k1": key}, "codec_server": {"token": token, "port": 0}}


@asynccontextmanager
async def web_ui_with_codec(encryption: EncryptionSettings) -> AsyncIterator[ServerInfo]:
    """A dev server whose Web UI decodes payloads with turnkeep's codec server (which lets in
    only that UI's origin, and only browsers signed in with the token)."""
    ui_port = free_port()
    async with (
        CodecServer(encryption, origins=[f"http://{HOST}:{ui_port}"]) as codec_url,
        EmbeddedServer(ui_port=ui_port, codec_endpoint=codec_url) as info,
    ):
        yield info


@asynccontextmanager
async def chromium(profile_dir: Path) -> AsyncIterator[BrowserContext]:
    """Headless Chromium with a fresh profile in ``profile_dir`` (created)."""
    _require_chromium()
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            profile_dir,
            executable_path=CHROMIUM,
            args=list(CHROMIUM_ARGS),
            headless=True,
            viewport={"width": VIEWPORT["width"], "height": VIEWPORT["height"]},
        )
        context.set_default_timeout(UI_TIMEOUT_MS)
        try:
            yield context
        finally:
            await context.close()


def _require_chromium() -> None:
    if not CHROMIUM.exists():
        raise RuntimeError(
            f"{CHROMIUM} is missing. `make test` installs it; by hand: "
            "`apt-get install -y --no-install-recommends chromium`."
        )


# -- what an operator does -------------------------------------------------------------------


async def sign_in_to_codec_server(page: Page, codec_url: str, token: str) -> None:
    """The codec server's sign-in page: the token in, a cookie for this browser out."""
    await page.goto(f"{codec_url}/login")
    await page.fill("input[name=token]", token)
    await page.click("button[type=submit]")
    await expect(page).to_have_title("Signed in")


async def send_credentials_to_codec_server(page: Page, server: ServerInfo) -> None:
    """The UI's codec server panel: the dev server can set the UI's codec endpoint but not
    "include cross-origin credentials", without which the browser keeps its sign-in to
    itself. So, as an operator would: this browser's own setting, the same endpoint, with
    credentials."""
    assert server.ui_url is not None and server.codec_endpoint is not None
    await page.goto(server.ui_url)
    await page.locator("[data-testid^=data-encoder-status]").click()
    await page.get_by_text("Use my browser setting and ignore Cluster-level setting.").click()
    await page.locator("[data-testid=data-encoder-endpoint-input]").fill(server.codec_endpoint)
    await page.get_by_text("Include cross-origin credentials").click()
    await page.get_by_role("button", name="Apply").click()


async def open_compact_history(page: Page, workflow_url: str) -> None:
    """A workflow's Event History in the Compact view: one row per activity, with its summary."""
    await page.goto(f"{workflow_url}/history")
    await page.get_by_role("button", name="Compact").click()


# -- what the page shows ---------------------------------------------------------------------


def shown(page: Page, text: str, *, exact: bool = True) -> Locator:
    """The first place ``text`` is visible on the page (hidden copies, e.g. in closed tabs, do
    not count)."""
    return page.get_by_text(text, exact=exact).filter(visible=True).first


async def expect_shown(page: Page, texts: Iterable[str], *, exact: bool = True) -> None:
    for text in texts:
        await expect(shown(page, text, exact=exact)).to_be_visible(timeout=UI_TIMEOUT_MS)


async def event_summaries(client: Client, handle: WorkflowHandle) -> list[str]:
    """The summaries the workflow gave its events (activities, and the timers that carry model
    calls' outcomes), in order, decoded by the client's data converter and so through its codec.
    The workflow's own summary, on its first event, is left out: the Event History does not
    list it."""
    summaries: list[str] = []
    async for event in handle.fetch_history_events():
        if event.HasField("workflow_execution_started_event_attributes"):
            continue
        if event.user_metadata.HasField("summary"):
            [summary] = await client.data_converter.decode([event.user_metadata.summary], [str])
            summaries.append(summary)
    return summaries
