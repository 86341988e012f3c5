"""An agent's A2A card: what a client reads before it calls (its description, never its
instruction; one skill; the JSON-RPC endpoint; streaming; bearer authentication). Built once per
agent; the routes set the endpoint's URL on each request for it."""

from __future__ import annotations

import hashlib
import json
from email.utils import formatdate, parsedate_to_datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnkeep.config.settings import Settings

# How long a client or cache may keep a card before asking again (it changes only when the
# gateway restarts with other settings; a revalidation by ETag is cheap).
CARD_MAX_AGE = 300


def agent_card(name: str, settings: Settings, url: str, *, bearer: bool = True) -> AgentCard:
    """The card of agent ``name``: its description (never its instruction), one skill, the
    JSON-RPC endpoint at ``url``, streaming, and bearer authentication."""
    options = settings.agents[name]
    description = options.description or f"The turnkeep agent {name}."
    modes = ["text/plain", "application/json"]
    card = AgentCard(
        name=name,
        description=description,
        version=_version(),
        supported_interfaces=[
            AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0")
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=modes,
        default_output_modes=modes,
        skills=[
            AgentSkill(
                id=name,
                name=name,
                description=description,
                tags=["turnkeep", *options.servers, *(f"agent:{a}" for a in options.agents)],
            )
        ],
    )
    if bearer:
        card.security_schemes["bearer"].CopyFrom(
            SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="an API key of the gateway"
                )
            )
        )
        card.security_requirements.append(SecurityRequirement(schemes={"bearer": StringList()}))
    return card


def _version() -> str:
    try:
        return version("turnkeep")
    except PackageNotFoundError:
        return "0"


def cached_card(request: Request, card: dict[str, Any], modified: float) -> Response:
    """The card as JSON with HTTP caching headers (A2A's card caching): ``Cache-Control``,
    an ``ETag`` of its content, ``Last-Modified``; a 304 for a client whose copy is current."""
    body = json.dumps(card, separators=(",", ":"), sort_keys=True).encode()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {
        "cache-control": f"public, max-age={CARD_MAX_AGE}",
        "etag": etag,
        "last-modified": formatdate(modified, usegmt=True),
    }
    if _unchanged(request, etag, modified):
        return Response(status_code=304, headers=headers)
    return JSONResponse(card, headers=headers)


def _unchanged(request: Request, etag: str, modified: float) -> bool:
    """Whether the client's copy is current: its If-None-Match (which wins when given), or
    its If-Modified-Since."""
    match = request.headers.get("if-none-match")
    if match is not None:
        tags = {tag.strip().removeprefix("W/") for tag in match.split(",")}
        return "*" in tags or etag in tags
    since = request.headers.get("if-modified-since")
    if since:
        try:
            return int(modified) <= parsedate_to_datetime(since).timestamp()
        except (TypeError, ValueError):
            return False
    return False
