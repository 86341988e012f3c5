"""The ``list_tools`` and ``call_tool`` activities: an agent's tools under one namespace,
``server__tool``, served by the worker's tool sources (``ToolServers``)."""

from __future__ import annotations

import asyncio
import json
import time
from fnmatch import fnmatchcase
from typing import Any

import mcp.types
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from turnkeep.activities.heartbeat import heartbeating
from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.settings import AgentSettings
from turnkeep.contract.activity_io import (
    CALL_TOOL,
    LIST_TOOLS,
    TOOL_SEPARATOR,
    ToolCallOutcome,
    ToolCallRequest,
    ToolCatalog,
    ToolSpec,
    ToolsRequest,
)
from turnkeep.contract.messages import CallToolResult, TextContent
from turnkeep.errors import require_workflow
from turnkeep.tools.registry import ToolServers
from turnkeep.tools.server_requests import CURRENT_BOOK, RequestBook
from turnkeep.tools.source import ServerConnectionError, ServerUnavailable

# Retryable: the pool has dropped the broken connection and the next attempt opens a new one.
# Deliberately not "ServerUnavailable", which the workflow treats as a configuration error.
CONNECTION_ERROR_TYPE = "McpConnectionError"
# Sent with every tools/call in the request's `_meta`: the same for every attempt of one model
# tool call (workflow id / call id), so a tool with side effects can de-duplicate a retried call.
IDEMPOTENCY_KEY_META = "turnkeep/idempotency_key"
# Where tool results are cut without payload storage, unless max_tool_result_bytes says
# otherwise: well under Temporal's 2 MB payload limit, with room for the rest of a step.
INLINE_TOOL_RESULT_BYTES = 256 * 1024


class ToolActivities:
    def __init__(
        self, agents: AgentCatalog, pool: ToolServers, *, max_result_bytes: int | None
    ) -> None:
        """``max_result_bytes``: where results are cut (``tool_result_limit``); None: never."""
        self._agents = agents
        self._pool = pool
        self._max_result_bytes = max_result_bytes

    @activity.defn(name=LIST_TOOLS)
    async def list_tools(self, req: ToolsRequest) -> ToolCatalog:
        require_workflow()
        agent = self._agents.agent(req.agent)
        servers = agent.servers if req.servers is None else req.servers
        for server in servers:
            self._check_server(req.agent, agent, server)
        # Servers start in parallel: several stdio servers each taking seconds to boot should
        # not add up. Failures are collected so one error names every server that is down.
        listings = await heartbeating(
            asyncio.gather(
                *(self._pool.list_tools(server) for server in servers),
                return_exceptions=True,
            ),
            "listing tools",
        )
        failures: list[tuple[str, BaseException]] = []
        specs: list[ToolSpec] = []
        for server, listing in zip(servers, listings, strict=True):
            if isinstance(listing, BaseException):
                failures.append((server, listing))
                continue
            specs += [
                _spec(server, tool) for tool in listing if tool_allowed(agent, server, tool.name)
            ]
        if failures:
            raise _list_failure(failures)
        return ToolCatalog(tools=specs)

    @activity.defn(name=CALL_TOOL)
    async def call_tool(self, req: ToolCallRequest) -> ToolCallOutcome:
        require_workflow()
        agent = self._agents.agent(req.agent)
        server, _, tool = req.name.partition(TOOL_SEPARATOR)
        # The workflow answers unknown tools itself; this guards against a crafted request
        # reaching a server or tool the agent was never given.
        if server not in agent.servers or not tool or not tool_allowed(agent, server, tool):
            raise ApplicationError(
                f"Tool {req.name!r} is not available to agent {req.agent!r}.",
                type="ToolNotAllowed",
                non_retryable=True,
            )
        self._check_server(req.agent, agent, server)
        info = activity.info()
        # A standalone activity (no workflow) is keyed by its own id, also stable across retries.
        owner = info.workflow_id or info.activity_id
        key = idempotency_key(f"{owner}/{req.scope}" if req.scope else owner, req.call_id)
        meta = {IDEMPOTENCY_KEY_META: key}
        # The source itself, not the pool's call_tool: one coroutine less on the hot path.
        source = self._pool.source(server)
        book = self._book(server, req)
        token = CURRENT_BOOK.set(book) if book is not None else None
        started = time.perf_counter()
        try:
            raw = await heartbeating(
                source.call_tool(tool, req.arguments, meta), f"tool {req.name}"
            )
            result = to_wire_result(raw)
        except (ServerUnavailable, ServerConnectionError) as err:
            # Without its causes: their texts may quote the server's command, URL or stderr.
            raise ApplicationError(str(err), type=CONNECTION_ERROR_TYPE) from None
        except MCPError as err:
            # The server answered with a JSON-RPC error (unknown tool, bad params...): an answer
            # retrying will not change, and one the model can act on.
            result = CallToolResult.error(f"Error: {err}")
        finally:
            if token is not None:
                CURRENT_BOOK.reset(token)
        duration_ms = (time.perf_counter() - started) * 1000
        if book is not None and (book.needed is not None or book.declined):
            activity.logger.info(
                "tool %s: %s",
                req.name,
                f"needs input ({book.needed.kind})" if book.needed else "declined a request",
                extra={"call_id": req.call_id, "tool": req.name},
            )
            if book.needed is not None:
                # Whatever the server's tool did with the suspension is set aside: the call
                # runs again once the workflow has the answer.
                return ToolCallOutcome(
                    result=CallToolResult(),
                    duration_ms=duration_ms,
                    needs_input=book.needed,
                    declined=book.declined,
                )
        # The activity logger adds the turn's and the activity's ids; never the arguments or
        # the result, which may hold anything.
        activity.logger.info(
            "tool %s: %s in %.0f ms",
            req.name,
            "error" if result.is_error else "ok",
            duration_ms,
            extra={"call_id": req.call_id, "tool": req.name},
        )
        if self._max_result_bytes is not None:
            result = truncate_result(result, self._max_result_bytes)
        declined = book.declined if book is not None else []
        return ToolCallOutcome(result=result, duration_ms=duration_ms, declined=declined)

    def _book(self, server: str, req: ToolCallRequest) -> RequestBook | None:
        """What the call may answer its server's requests with, if the server's config lets it
        ask anything (the worker's config, not the request, decides what may be answered)."""
        config = self._agents.server(server)
        if config is None or (config.elicitation is None and config.sampling is None):
            return None
        return RequestBook(server, req.answers, config.elicitation, config.sampling)

    def _check_server(self, name: str, agent: AgentSettings, server: str) -> None:
        """Refuse a server the agent lacks, or one the config puts on another task queue than
        this activity's: its tools run only on the workers meant to host it."""
        if server not in agent.servers:
            raise ApplicationError(
                f"Agent {name!r} has no tool server {server!r}.",
                type="ToolNotAllowed",
                non_retryable=True,
            )
        queue = self._agents.tool_task_queue(agent, server)
        if queue is not None and queue != activity.info().task_queue:
            raise ApplicationError(
                f"The tools of server {server!r} run on task queue {queue!r}, not here.",
                type="ToolWrongTaskQueue",
                non_retryable=True,
            )


def idempotency_key(workflow_id: str, call_id: str) -> str:
    """What a tool is told identifies this call: stable across retries and worker restarts."""
    return f"{workflow_id}/{call_id}"


def tool_allowed(agent: AgentSettings, server: str, tool: str) -> bool:
    """fast-agent's tool filter: a server with no entry offers all its tools."""
    patterns = (agent.tools or {}).get(server)
    return patterns is None or any(fnmatchcase(tool, p) for p in patterns)


def _spec(server: str, tool: mcp.types.Tool) -> ToolSpec:
    return ToolSpec(
        name=f"{server}{TOOL_SEPARATOR}{tool.name}",
        description=tool.description,
        input_schema=dict(tool.input_schema),
    )


def _list_failure(failures: list[tuple[str, BaseException]]) -> BaseException:
    """One error naming every server that failed. Retryable only if every failure may pass (a
    refused connection, a timeout): a server that cannot start, or answers the listing with an
    error, fails the turn at once. The pool's errors name a server and its transport only, and
    are raised without their causes, whose texts may quote its command, URL or stderr."""
    lines: list[str] = []
    retryable = True
    for server, err in failures:
        if isinstance(err, ServerUnavailable | ServerConnectionError):
            lines.append(str(err))
            retryable &= not isinstance(err, ServerUnavailable) or err.transient
        elif isinstance(err, MCPError):
            lines.append(f"MCP server {server!r} answered tools/list with an error: {err}")
            retryable = False
        else:
            # A bug or an unforeseen failure: Temporal's retry policy decides.
            return err
    if retryable:
        return ApplicationError("\n".join(lines), type=CONNECTION_ERROR_TYPE)
    return ApplicationError("\n".join(lines), type="ServerUnavailable", non_retryable=True)


def to_wire_result(raw: mcp.types.CallToolResult) -> CallToolResult:
    """The SDK's result as turnkeep's wire model, valid UTF-8 throughout."""
    # `resultType` is protocol plumbing (complete vs. input-required), not part of the answer.
    data = raw.model_dump(by_alias=True, mode="json", exclude_none=True, exclude={"result_type"})
    return CallToolResult.model_validate(_valid_utf8(data))


def _valid_utf8(value: Any) -> Any:
    # A lone surrogate (possible from an in-process function tool) would make the payload
    # converter fail on every retry; replace it instead.
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", errors="replace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_valid_utf8(k): _valid_utf8(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_valid_utf8(v) for v in value]
    return value


# --- truncation ------------------------------------------------------------------------------
# What a large result gets without external payload storage (or under an explicit cap). Kept
# apart and pure.


def tool_result_limit(max_tool_result_bytes: int | None, *, storage_on: bool) -> int | None:
    """How many bytes of a tool result the model is shown (``None``: all of them).

    ``max_tool_result_bytes`` (the setting) when set. Otherwise no limit with payload storage
    on: a result over the threshold goes to the store whole and the history holds a reference,
    so its size is no concern of Temporal's (the model's context window is the provider's to
    police, and its error says so). Without storage, ``INLINE_TOOL_RESULT_BYTES``."""
    if max_tool_result_bytes is not None:
        return max_tool_result_bytes
    return None if storage_on else INLINE_TOOL_RESULT_BYTES


def json_size(value: BaseModel | Any) -> int:
    """Bytes of ``value`` as compact UTF-8 JSON, as the payload converter would write it."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return len(text.encode("utf-8", errors="replace"))


def truncate_result(result: CallToolResult, max_bytes: int) -> CallToolResult:
    """``result`` if its JSON fits in ``max_bytes``; otherwise its text cut to fit, non-text
    blocks that do not fit (and ``structuredContent``) dropped, and a note saying so."""
    size = json_size(result)
    if size <= max_bytes:
        return result
    had_structured = result.structured_content is not None
    skeleton = result.model_copy(update={"content": [], "structured_content": None})
    if json_size(skeleton) > max_bytes:
        # Even the envelope (huge _meta?) is too big: keep only what the model needs.
        skeleton = CallToolResult(is_error=result.is_error)
    worst_note = _note(size, max_bytes, len(result.content), had_structured)
    # Each block after the first costs a comma; the note is always last.
    budget = max_bytes - json_size(skeleton) - json_size(TextContent(text=worst_note)) - 1
    kept: list[Any] = []
    dropped = 0
    for block in result.content:
        cost = json_size(block) + 1
        if cost <= budget:
            kept.append(block)
            budget -= cost
            continue
        if isinstance(block, TextContent):
            envelope = json_size(block.model_copy(update={"text": ""})) + 1
            text = _cut_text(block.text, budget - envelope)
            if text:
                kept.append(block.model_copy(update={"text": text}))
                budget -= envelope + _json_str_size(text)
                continue
        dropped += 1
    note = TextContent(text=_note(size, max_bytes, dropped, had_structured))
    return skeleton.model_copy(update={"content": [*kept, note]})


def _note(size: int, max_bytes: int, dropped_blocks: int, dropped_structured: bool) -> str:
    dropped = []
    if dropped_blocks:
        dropped.append(f"{dropped_blocks} content block{'s' if dropped_blocks != 1 else ''}")
    if dropped_structured:
        dropped.append("structuredContent")
    what = f"; dropped {' and '.join(dropped)}" if dropped else ""
    return f"[turnkeep: tool result truncated from {size:,} to {max_bytes:,} bytes{what}]"


def _json_str_size(text: str) -> int:
    """Bytes ``text`` takes inside a JSON string literal (escapes included, quotes not)."""
    return json_size(text) - 2


def _cut_text(text: str, max_bytes: int) -> str:
    """The longest prefix of ``text`` whose JSON-escaped UTF-8 fits in ``max_bytes``."""
    # A byte cut (never splitting a character; lone surrogates become '?') is an upper bound,
    # since escaping only adds bytes; then binary-search the prefix that fits once escaped.
    cut = text.encode("utf-8", errors="replace")[: max(max_bytes, 0)].decode("utf-8", "ignore")
    if _json_str_size(cut) <= max_bytes:
        return cut
    fits, too_long = 0, len(cut)
    while too_long - fits > 1:
        mid = (fits + too_long) // 2
        if _json_str_size(cut[:mid]) <= max_bytes:
            fits = mid
        else:
            too_long = mid
    return cut[:fits]
