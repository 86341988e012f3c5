"""Schemathesis, with every check, against the gateway's own OpenAPI document (``/openapi.json``):
the document must describe exactly what the gateway accepts and answers. The gateway runs on
the real dev server with a real worker (the offline ``passthrough`` model), so the turns and
sessions Schemathesis starts run. Half of its cases name a turn, a session and a waiting call
that exist (a Schemathesis dictionary), the others ids that do not."""

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
# Examples per operation and phase, and one seed: a lean run that makes the same cases each time.
EXAMPLES = 25
SEED = 43
# A stream that stays open (a turn waiting for a decision) is read until this many events or
# the request's timeout; a completed turn's or a closed session's ends by itself.
STREAM_EVENTS = 3
REQUEST_SECONDS = 5


def look(name: str) -> str:
    """Reads ``name``."""
    return f"read {name}"


AGENTS = {
    AGENT: {
        "model": "passthrough",
        "description": "echoes, or calls the tool a prompt spells out",
        "servers": ["local"],
        "approval": {"tools": ["local__look"]},
    }
}
CALL = '***CALL_TOOL local__look {"name": "notes"}'
DECIDE = "/api/turns/{turn_id}/approvals/{call_id}"
REWIND = "/api/sessions/{session_id}/rewind"
CANCEL = "/api/turns/{turn_id}/cancel"


def config(real: dict[str, list[str]], routes: dict[str, dict[str, str]], reports: Path) -> str:
    """Schemathesis's config (TOML): the values of ``real`` (by parameter, `path.turn_id`)
    stand in for half of the values generated for their parameter; a route of ``routes``
    always takes its own (the decision route names the waiting call, so that some decision
    reaches it; a rewind, a session with a turn to go back before)."""
    # Top-level keys first, then the tables; no cache (it would outlive the test).
    lines = [f"max-stream-events = {STREAM_EVENTS}", "[cache]\nenabled = false"]
    words = {parameter: parameter.partition(".")[2] for parameter in real}
    for parameter, values in real.items():
        lines.append(f"[dictionaries.{words[parameter]}]\nvalues = {json.dumps(values)}")
    lines.append("[parameters]")
    for parameter, word in words.items():
        lines.append(f'"{parameter}" = {{ dictionary = "{word}", probability = 0.5 }}')
    lines.append(f'[reports]\ndirectory = "{reports}"')
    for path, parameters in routes.items():
        lines.append(f'[[operations]]\ninclude-path = "{path}"\n[operations.parameters]')
        lines += [f'"{parameter}" = {json.dumps(value)}' for parameter, value in parameters.items()]
    return "\n".join(lines) + "\n"


def report(directory: Path) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(next(directory.glob("*.json")).read_text(encoding="utf-8"))
    return found


async def schemathesis(url: str, cwd: Path, toml: Path) -> tuple[int, str, dict[str, Any]]:
    """Run `st` (its command line: the stable interface) on the document at ``url``: its exit
    code, its output and its JSON report. In ``cwd``: Hypothesis keeps its files there."""
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "st"),
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
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode(errors="replace"), report(cwd / "reports")


async def made(
    http: httpx2.AsyncClient,
) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """A completed turn, a turn with a call waiting for a decision, a closed session, and an
    open one with a turn ended: the real values Schemathesis's cases take (``config``), and
    three routes' own (the decision names the waiting call; a rewind, the open session, which
    can go back to before its turn; a cancel, a running turn of its own, since how many of
    its cases draw a real id otherwise turns on the whole document's shape)."""

    async def post(path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = await http.post(path, json=body)
        assert answer.status_code in (201, 202), answer.text
        result: dict[str, Any] = answer.json()
        return result

    done = (await post("/api/turns", {"agent": AGENT, "prompt": "hello"}))["turn_id"]
    waiting = (await post("/api/turns", {"agent": AGENT, "prompt": CALL}))["turn_id"]
    running = (await post("/api/turns", {"agent": AGENT, "prompt": CALL}))["turn_id"]
    session = (await post("/api/sessions", {"agent": AGENT}))["session_id"]
    await post(f"/api/sessions/{session}/messages", {"text": "hi"})
    # Closed, so that its stream ends as a completed turn's does.
    await post(f"/api/sessions/{session}/close")
    rewindable = (await post("/api/sessions", {"agent": AGENT}))["session_id"]
    await post(f"/api/sessions/{rewindable}/messages", {"text": "hi"})

    async def has(path: str, key: str, value: Any) -> bool:
        return bool((await http.get(path)).json().get(key) == value)

    async def calls() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = (await http.get(f"/api/turns/{waiting}/approvals")).json()[
            "approvals"
        ]
        return got

    await eventually(lambda: has(f"/api/turns/{done}", "status", "completed"), "it completed")
    await eventually(lambda: has(f"/api/sessions/{session}", "open", False), "it closed")
    call = (await eventually(calls, "the call waits"))[0]["call_id"]

    async def answered() -> bool:
        return len((await http.get(f"/api/sessions/{rewindable}")).json()["messages"]) == 2

    await eventually(answered, "its turn ended")
    real = {"body.agent": [AGENT], "path.turn_id": [done, waiting], "path.session_id": [session]}
    return real, {
        DECIDE: {"path.turn_id": waiting, "path.call_id": call},
        REWIND: {"path.session_id": rewindable},
        CANCEL: {"path.turn_id": running},
    }


async def test_schemathesis_finds_nothing_against_the_gateway(
    harness: HarnessFactory, tmp_path: Path
) -> None:
    async with harness({"local": [look]}, agents=AGENTS) as h:
        gateway = {
            "keys": {"st": {"key": KEY, "agents": ["*"], "decide": True}},
            # Schemathesis sends its cases as fast as the gateway answers them.
            "rate_limit": {"per_second": 10_000, "burst": 10_000},
        }
        settings = h.settings.model_copy(
            update={"gateway": type(h.settings.gateway).model_validate(gateway)}
        )
        app = gateway_app(h.client, settings, task_queue=h.task_queue, a2a=False, mcp=False)
        server = AsgiServer(app, name="gateway")
        base = http_url("127.0.0.1", await server.start(bind("127.0.0.1", 0)))
        try:
            async with httpx2.AsyncClient(
                base_url=base, headers={"authorization": f"Bearer {KEY}"}, trust_env=False
            ) as http:
                real, routes = await made(http)
            toml = tmp_path / "schemathesis.toml"
            toml.write_text(config(real, routes, tmp_path / "reports"), encoding="utf-8")
            code, output, run = await schemathesis(f"{base}/openapi.json", tmp_path, toml)
        finally:
            await app.state.gateway.hub.aclose()
            await server.stop()
    cases = run["test_cases"]
    print(f"schemathesis: {cases['generated']} cases, {cases['unique_failures']} unique failures")
    assert code == 0 and cases["unique_failures"] == 0 and not run["errors"], output
    operations = run["operations"]
    assert operations["tested"] == operations["total"] == 16, output
    # Every operation reached the worker's side, not only the gateway's 404s.
    assert run["warnings"]["missing_test_data"] == [], output
