"""The gateway's OpenAPI document, built from the API's pydantic models (``models``): what
``/openapi.json`` serves and docs/serving/openapi.json holds (a test keeps the two equal)."""

from __future__ import annotations

import copy
import functools
import json
import sys
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from turnkeep.contract.approval import DecisionRecord
from turnkeep.contract.rewind import Rewind
from turnkeep.doors.gateway import models as m

TITLE = "turnkeep gateway"
VERSION = "1"
_REF = "#/components/schemas/{model}"

_EVENTS = """Server-sent events, until `end`:
- `message` (`MessageData`; `id:` is its index, so `Last-Event-ID` resumes after it)
- `text` (`TextData`): live text of the model call in flight
- `tool_call` (`ToolCallData`)
- `restarted` (`RestartedData`): a model call retried, its live text starts over
- `approval` (`ApprovalData`): the calls now waiting (`[]` once none)
- `end` (`EndData`), then the stream closes.
`?after=N` (or `Last-Event-ID: N`) starts after message N."""

_MODELS: tuple[type[BaseModel], ...] = (
    m.ErrorBody,
    m.AgentList,
    m.StartTurn,
    m.TurnStarted,
    m.TurnState,
    m.TurnRef,
    m.ApprovalList,
    m.DecideCall,
    DecisionRecord,
    m.OpenSession,
    m.SessionOpened,
    m.SessionState,
    m.SendMessage,
    m.MessageSent,
    m.SessionRef,
    m.RewindSession,
    Rewind,
    m.Fork,
    m.Forked,
    m.MessageData,
    m.TextData,
    m.ToolCallData,
    m.RestartedData,
    m.ApprovalData,
    m.EndData,
)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _json(model: type[BaseModel], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref(model)}}}


def _errors(*statuses: int) -> dict[str, Any]:
    meaning = {
        400: "malformed JSON or parameter, or a query parameter the route does not read",
        401: "no key, or a wrong one",
        403: "the key is not scoped to the agent, or may not decide",
        404: "no such agent, turn or session",
        409: "not possible in the workflow's state",
        413: "the body is over the gateway's limit",
        422: "the body does not fit the schema",
        429: "over the key's rate limit",
        503: "the gateway serves as many streams as it may",
        504: "no worker answered",
    }
    # Every route may be given a query parameter it does not read (400), a bad key (401) and
    # more requests than the key's rate allows (429).
    return {str(s): _json(m.ErrorBody, meaning[s]) for s in sorted({400, 401, 429, *statuses})}


def _op(
    summary: str,
    ok: int,
    answer: dict[str, Any],
    *errors: int,
    body: type[BaseModel] | None = None,
    params: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {str(ok): answer, **_errors(*errors)}}
    if body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": _ref(body)}},
        }
    if params:
        op["parameters"] = params
    return op


def _path(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


# A message index as `?after=` and `Last-Event-ID` take it.
_INDEX = {"type": "integer", "minimum": -1, "maximum": m.MAX_INDEX}
_RESUME = [
    {
        "name": "after",
        "in": "query",
        "required": False,
        "schema": _INDEX,
        "description": "Start after this message index.",
    },
    {
        "name": "Last-Event-ID",
        "in": "header",
        "required": False,
        "schema": _INDEX,
        "description": "The id of the last message event received: start after it.",
    },
]


def _event(name: str, data: type[BaseModel]) -> dict[str, Any]:
    """One kind of event as a client's parser reads it (OpenAPI 3.2's ``itemSchema`` of an
    event stream): its name, its ``data`` (a JSON text of ``data``'s schema), and ``id``, which
    only a `message` event sets (the ones after it carry it on, as event streams do)."""
    event: dict[str, Any] = {
        "type": "object",
        "properties": {
            "event": {"const": name},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": _ref(data),
            },
            "id": {"type": "string", "pattern": "^[0-9]+$"},
        },
        "required": ["event", "data", "id"] if name == "message" else ["event", "data"],
        "additionalProperties": False,
    }
    return event


_SSE = {
    "description": _EVENTS,
    "content": {
        "text/event-stream": {
            "itemSchema": {
                "oneOf": [
                    _event("message", m.MessageData),
                    _event("text", m.TextData),
                    _event("tool_call", m.ToolCallData),
                    _event("restarted", m.RestartedData),
                    _event("approval", m.ApprovalData),
                    _event("end", m.EndData),
                ]
            }
        }
    },
}


def _discriminators_required(node: Any, schemas: dict[str, Any]) -> None:
    """Marks each discriminator's property required in the schemas it maps to. pydantic gives
    such a property (a content block's ``type``) a default, so it lists it as optional; but a
    union picks its member by it, and refuses a value without it."""
    if isinstance(node, dict):
        discriminator = node.get("discriminator")
        if isinstance(discriminator, dict):
            name = discriminator["propertyName"]
            for ref in discriminator.get("mapping", {}).values():
                target = schemas[ref.rsplit("/", 1)[-1]]
                required = target.setdefault("required", [])
                if name not in required:
                    required.insert(0, name)
        for value in node.values():
            _discriminators_required(value, schemas)
    elif isinstance(node, list):
        for value in node:
            _discriminators_required(value, schemas)


def _fork_op(source: dict[str, Any]) -> dict[str, Any]:
    return _op(
        "Fork: a new session from the first messages of this one",
        201,
        _json(m.Forked, "the fork, started"),
        400,
        403,
        404,
        409,
        413,
        422,
        504,
        body=m.Fork,
        params=[source],
    )


@functools.cache
def _document() -> dict[str, Any]:
    _, schemas = models_json_schema(
        [(model, "serialization") for model in _MODELS], ref_template=_REF
    )
    defs = schemas.get("$defs", {})
    _discriminators_required(defs, defs)
    turn, session, call = _path("turn_id"), _path("session_id"), _path("call_id")
    paths: dict[str, Any] = {
        "/api/agents": {
            "get": _op("The agents this key may use", 200, _json(m.AgentList, "agents"))
        },
        "/api/turns": {
            "post": _op(
                "Start a turn",
                201,
                _json(m.TurnStarted, "started"),
                400,
                403,
                404,
                413,
                422,
                body=m.StartTurn,
            )
        },
        "/api/turns/{turn_id}": {
            "get": _op(
                "A turn's status, and its result once completed",
                200,
                _json(m.TurnState, "the turn"),
                403,
                404,
                params=[turn],
            )
        },
        "/api/turns/{turn_id}/events": {
            "get": _op("Follow a turn", 200, _SSE, 400, 403, 404, 503, params=[turn, *_RESUME])
        },
        "/api/turns/{turn_id}/cancel": {
            "post": _op(
                "Cancel a turn", 202, _json(m.TurnRef, "cancelling"), 403, 404, 409, params=[turn]
            )
        },
        "/api/turns/{turn_id}/approvals": {
            "get": _op(
                "The turn's calls waiting for a decision",
                200,
                _json(m.ApprovalList, "waiting calls"),
                403,
                404,
                504,
                params=[turn],
            )
        },
        "/api/turns/{turn_id}/approvals/{call_id}": {
            "post": _op(
                "Approve or deny a waiting call",
                200,
                _json(DecisionRecord, "the decision as the turn records it"),
                400,
                403,
                404,
                409,
                413,
                422,
                504,
                body=m.DecideCall,
                params=[turn, call],
            )
        },
        "/api/approvals": {
            "get": _op(
                "Every waiting call this key may see", 200, _json(m.ApprovalList, "waiting calls")
            )
        },
        "/api/sessions": {
            "post": _op(
                "Open a session",
                201,
                _json(m.SessionOpened, "opened"),
                400,
                403,
                404,
                413,
                422,
                body=m.OpenSession,
            )
        },
        "/api/sessions/{session_id}": {
            "get": _op(
                "A session and its whole transcript",
                200,
                _json(m.SessionState, "the session"),
                403,
                404,
                504,
                params=[session],
            )
        },
        "/api/sessions/{session_id}/messages": {
            "post": _op(
                "Send a message: the turn that answers it",
                202,
                _json(m.MessageSent, "sent"),
                400,
                403,
                404,
                409,
                413,
                422,
                504,
                body=m.SendMessage,
                params=[session],
            )
        },
        "/api/sessions/{session_id}/events": {
            "get": _op(
                "Follow a session", 200, _SSE, 400, 403, 404, 503, params=[session, *_RESUME]
            )
        },
        "/api/turns/{turn_id}/fork": {"post": _fork_op(turn)},
        "/api/sessions/{session_id}/fork": {"post": _fork_op(session)},
        "/api/sessions/{session_id}/close": {
            "post": _op(
                "Close a session (what is queued is answered first)",
                202,
                _json(m.SessionRef, "closing"),
                403,
                404,
                409,
                504,
                params=[session],
            )
        },
        "/api/sessions/{session_id}/rewind": {
            "post": _op(
                "Rewind a session: its next turn sees the conversation as it was after a turn",
                200,
                _json(Rewind, "rewound: who, when, from which turn to which"),
                403,
                404,
                409,
                413,
                422,
                504,
                body=m.RewindSession,
                params=[session],
            )
        },
    }
    return {
        # 3.2: the first version that describes an event stream's events (`itemSchema`).
        "openapi": "3.2.0",
        "info": {"title": TITLE, "version": VERSION},
        "paths": paths,
        "components": {
            "schemas": defs,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def openapi_document() -> dict[str, Any]:
    """The document (a fresh copy: callers may change theirs)."""
    return copy.deepcopy(_document())


def render() -> str:
    """The document as docs/serving/openapi.json holds it."""
    return json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":  # python -m turnkeep.doors.gateway.openapi > docs/serving/openapi.json
    sys.stdout.write(render())
