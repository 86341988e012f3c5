"""What a tool call answers its MCP server's elicitation and sampling requests with: the
answers the workflow recorded on earlier runs of the call, in order, or, for a request it has
none for, a suspension (``ToolCallOutcome.needs_input``; see
``turnkeep.contract.server_requests``).

The ``call_tool`` activity opens a ``RequestBook`` for its call and sets it as the current one
(``CURRENT_BOOK``) while the call runs; the MCP source's handlers find it there. On a
2026-07-28 connection the server's requests come back as the call's own ``InputRequiredResult``
and the SDK answers them in the calling task, so the book is the call's; on an older
connection they arrive as requests of their own, which do not say which call they belong to,
so the source runs one call at a time for such a server (``McpSource``)."""

from __future__ import annotations

import hashlib
import json
from contextvars import ContextVar
from typing import Any

import mcp_types

from turnkeep.config.settings import McpElicitationSettings, McpSamplingSettings
from turnkeep.contract.server_requests import (
    MAX_SERVER_REQUESTS,
    SamplingRequest,
    ServerAnswer,
    ServerRequest,
    ServerRequestKind,
    sampling_messages,
)


class Suspended(Exception):
    """Raised by a handler for a request the call has no answer for: the call ends and the
    activity reports ``needs_input``."""


class RequestBook:
    """One run of one tool call: the answers it may give, and what it could not answer."""

    def __init__(
        self,
        server: str,
        answers: list[ServerAnswer],
        elicitation: McpElicitationSettings | None,
        sampling: McpSamplingSettings | None,
    ) -> None:
        self.server = server
        self._unused = list(answers)
        self._elicitation = elicitation.mode if elicitation else "none"
        self._sampling = sampling is not None and sampling.enabled
        self._asked = 0
        self.needed: ServerRequest | None = None
        self.declined: list[ServerRequest] = []

    def elicit(self, params: mcp_types.ElicitRequestParams) -> mcp_types.ElicitResult:
        """The answer to an ``elicitation/create``; raises ``Suspended`` when a person must
        answer first."""
        data = _params(params)
        request = ServerRequest(
            kind="elicitation",
            digest=request_digest("elicitation/create", data),
            server=self.server,
            message=params.message,
            requested_schema=data.get("requestedSchema"),
        )
        if not isinstance(params, mcp_types.ElicitRequestFormParams):
            return self._decline(request, "decline", "URL-mode elicitation is not supported")
        if self._elicitation == "auto-cancel":
            return self._decline(request, "cancel", "elicitation mode is auto-cancel")
        if self._elicitation != "forms":
            return self._decline(request, "decline", "elicitation is not enabled for this server")
        answer = self._answer(request)
        return mcp_types.ElicitResult.model_validate(answer.result or {"action": "cancel"})

    def sample(self, params: mcp_types.CreateMessageRequestParams) -> mcp_types.CreateMessageResult:
        """The answer to a ``sampling/createMessage``; raises ``Suspended`` when the model (or a
        person) must answer first, ``RuntimeError`` when it was refused."""
        data = _params(params)
        request = ServerRequest(
            kind="sampling",
            digest=request_digest("sampling/createMessage", data),
            server=self.server,
            sampling=SamplingRequest(
                messages=sampling_messages(data.get("messages") or []),
                system_prompt=params.system_prompt,
                max_tokens=params.max_tokens,
                temperature=params.temperature,
            ),
        )
        if not self._sampling:
            reason = "sampling is not enabled for this server"
            self.declined.append(request.model_copy(update={"reason": reason}))
            raise RuntimeError(reason)
        answer = self._answer(request)
        if answer.error is not None or answer.result is None:
            raise RuntimeError(answer.error or "sampling refused")
        return mcp_types.CreateMessageResult.model_validate(answer.result)

    def _answer(self, request: ServerRequest) -> ServerAnswer:
        self._asked += 1
        if self._asked > MAX_SERVER_REQUESTS:
            raise RuntimeError(
                f"more than {MAX_SERVER_REQUESTS} requests in one tool call; not answered"
            )
        for i, answer in enumerate(self._unused):
            if answer.kind == request.kind and answer.digest == request.digest:
                del self._unused[i]
                return answer
        if self.needed is None:
            self.needed = request
        raise Suspended(request.kind)

    def _decline(self, request: ServerRequest, action: str, reason: str) -> mcp_types.ElicitResult:
        self.declined.append(request.model_copy(update={"reason": reason}))
        return mcp_types.ElicitResult.model_validate({"action": action})


def request_digest(method: ServerRequestKind | str, params: dict[str, Any]) -> str:
    """sha256 of a request's method and params (its ``_meta`` left out): the same request made
    again on a re-run has the same digest."""
    body = {k: v for k, v in params.items() if k != "_meta"}
    text = json.dumps({"method": method, "params": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8", errors="replace")).hexdigest()


def _params(params: Any) -> dict[str, Any]:
    data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    return data if isinstance(data, dict) else {}


# The book of the tool call running in the current task, if it may be asked anything.
CURRENT_BOOK: ContextVar[RequestBook | None] = ContextVar("turnkeep_request_book", default=None)
