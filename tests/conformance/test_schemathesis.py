"""Schemathesis, every check, against the gateway's own OpenAPI document (``/openapi.json``):
the document must describe exactly what the gateway accepts and answers. The gateway runs on
the real dev server with a real worker (the offline ``passthrough`` model), so the turns and
sessions Schemathesis starts run; some of its cases name a turn and a session that exist, the
others ids that do not."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import HarnessFactory, eventually
from turnkeep.doors.gateway import gateway_app
from turnkeep.support.asgi import AsgiServer, bind, http_url

pytestmark = [pytest.mark.asyncio, pytest.mark.conformance]

KEY = "st-admin-key-0123456789abcdef"
AGENT = "test"
# Examples per operation and phase, and one seed: a lean run that finds the same cases each time.
EXAMPLES = 25
SEED = 43
# A stream left open (a session's) is read until this many events or the request's timeout.
STREAM_EVENTS = 4
REQUEST_SECONDS = 5


def config(turn_id: str, session_id: str, reports: Path) -> str:
    """Schemathesis's config: half of the generated agents, turn ids and session ids are real
    ones, so that cases reach a running worker and not only the gateway's 404s."""
    dictionaries = {"agents": AGENT, "turns": turn_id, "sessions": session_id}
    lines = [f'[dictionaries.{name}]\nvalues = ["{value}"]' for name, value in dictionaries.items()]
    lines.append(
        "[parameters]\n"
        '"body.agent" = { dictionary = "agents", probability = 0.5 }\n'
        '"path.turn_id" = { dictionary = "turns", probability = 0.5 }\n'
        '"path.session_id" = { dictionary = "sessions", probability = 0.5 }'
    )
    lines.append(f'[reports]\ndirectory = "{reports}"')
    return "\n".join(lines) + "\n"


async def schemathesis(url: str, toml: Path, reports: Path) -> tuple[int, str, dict[str, Any]]:
    """Run `st` (its CLI: the stable interface) on the document at ``url``; its exit code, its
    output and its JSON report."""
    st = Path(sys.executable).parent / "st"
    process = await asyncio.create_subprocess_exec(
        str(st),
        "--config-file",
        str(toml),
        "run",
        url,
        "--checks",
        "all",
        "--header",
        f"Authorization: Bearer {KEY}",
        "--max-examples",
        str(EXAMPLES),
        "--seed",
        str(SEED),
        "--workers",
        "1",
        "--request-timeout",
        str(REQUEST_SECONDS),
        "--generation-database",
        "none",
        "--no-color",
        "--report",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    report = json.loads(next(reports.glob("*.json")).read_text(encoding="utf-8"))
    return process.returncode or 0, out.decode(errors="replace"), report


async def test_schemathesis_finds_nothing_against_the_gateway(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    agents = {AGENT: {"model": "passthrough", "description": "echoes"}}
    async with harness(agents=agents) as h:
        settings = h.settings.model_copy(
            update={
                "gateway": type(h.settings.gateway).model_validate(
                    {
                        "keys": {"st": {"key": KEY, "agents": ["*"], "decide": True}},
                        # Schemathesis sends its cases as fast as the gateway answers.
                        "rate_limit": {"per_second": 10_000, "burst": 10_000},
                    }
                )
            }
        )
        app = gateway_app(h.client, settings, task_queue=h.task_queue, a2a=False, mcp=False)
        server = AsgiServer(app, name="gateway")
        port = await server.start(bind("127.0.0.1", 0))
        base = http_url("127.0.0.1", port)
        auth = {"authorization": f"Bearer {KEY}"}
        try:
            async with httpx2.AsyncClient(base_url=base, headers=auth, trust_env=False) as http:
                turn_id = (
                    await http.post("/api/turns", json={"agent": AGENT, "prompt": "hello"})
                ).json()["turn_id"]
                session_id = (await http.post("/api/sessions", json={"agent": AGENT})).json()[
                    "session_id"
                ]
                sent = await http.post(f"/api/sessions/{session_id}/messages", json={"text": "hi"})
                assert sent.status_code == 202, sent.text
                # Closed, so that its stream ends as the turn's does (an open one never would).
                closed = await http.post(f"/api/sessions/{session_id}/close")
                assert closed.status_code == 202, closed.text

                async def ended(path: str) -> bool:
                    state = (await http.get(path)).json()
                    return state.get("status") == "completed" or state.get("open") is False

                await eventually(lambda: ended(f"/api/turns/{turn_id}"), "the turn ended")
                await eventually(lambda: ended(f"/api/sessions/{session_id}"), "it closed")
            reports = tmp_path / "reports"
            toml = tmp_path / "schemathesis.toml"
            toml.write_text(config(turn_id, session_id, reports), encoding="utf-8")
            code, output, report = await schemathesis(f"{base}/openapi.json", toml, reports)
        finally:
            await app.state.gateway.hub.aclose()
            await server.stop()
    print(output)
    print(json.dumps(report.get("summary", report), indent=1)[:4000])
    assert code == 0, output
