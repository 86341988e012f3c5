"""Take docs/web-ui-turn.png, the README's picture of the Web UI (not a test).

    .venv/bin/python -m docs.screenshot [--out docs/web-ui-turn.png]

On a fresh embedded dev server, runs the bundled `demo` agent (examples/turnkeep.yaml) offline
on the passthrough model, with every payload encrypted and a prompt that asks for three tools.
Then, in headless Chromium at 1400x900, signs in to turnkeep's codec server the way an operator
does, opens the finished turn's Event History (Compact view: one row per activity, with its
summary) and saves what it shows: decrypted input, result and summaries. Needs
/usr/bin/chromium (`make test` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path

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
from turnkeep.settings import EncryptionSettings
from turnkeep.worker.build import build_worker
from turnkeep.worker.client import start_turn
from turnkeep.worker.config import load_settings
from turnkeep.worker.connection import connect
from turnkeep.workflows.turn_io import TurnInput

REPO = Path(__file__).resolve().parent.parent
QUESTION = "Three quick ones: a marathon in km, 451 °F in °C, and the word count of our motto."
CALLS = [
    ("toolbox__calculate", {"expression": "26.2 * 1.609344"}),
    ("toolbox__convert_units", {"value": 451, "from_unit": "fahrenheit", "to_unit": "celsius"}),
    ("toolbox__word_stats", {"text": "The workflow history is the checkpoint."}),
]
PROMPT = "\n".join([QUESTION, *(f"***CALL_TOOL {name} {json.dumps(args)}" for name, args in CALLS)])


async def take(out: Path) -> None:
    # The demo config picks a real model when a provider key is set; the picture must not
    # depend on one.
    os.environ["TURNKEEP_MODEL"] = "passthrough"
    # The demo's tool server is started as `python demo_tools.py`: this venv's python, as
    # `make demo` has it.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    token = secrets.token_urlsafe(24)
    demo = load_settings(REPO / "examples" / "turnkeep.yaml")
    encryption = EncryptionSettings.model_validate(encryption_config(token))
    settings = demo.model_copy(update={"encryption": encryption})
    with tempfile.TemporaryDirectory(prefix="turnkeep-screenshot-") as tmp:
        async with web_ui_with_codec(encryption) as server:
            client = await connect(server.address, server.namespace, settings=settings)
            async with build_worker(client, settings):
                turn = await start_turn(client, TurnInput(agent="demo", messages=[PROMPT]))
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
                await expect_shown(page, [QUESTION], exact=False)
                # Oldest first, so the rows read as the turn went.
                await page.get_by_role("button", name="Descending").click()
                await expect_shown(page, ["Ascending"])
                # Scroll the Input panel to the prompt, then start the picture at the tabs so
                # the input and the activity rows both fit; keep the pointer off the rows (it
                # would draw a tooltip).
                await shown(page, QUESTION, exact=False).evaluate(
                    "line => line.scrollIntoView({block: 'center'})"
                )
                await page.get_by_role("tablist", name="workflow detail").evaluate(
                    "tabs => tabs.scrollIntoView({block: 'start'})"
                )
                await page.mouse.move(VIEWPORT["width"] * 0.6, 100)  # between the panels
                await page.screenshot(path=out)
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "web-ui-turn.png")
    asyncio.run(take(parser.parse_args().out))


if __name__ == "__main__":
    main()
