"""An agent's A2A card: what a client reads before it calls (its description, never its
instruction; one skill; the JSON-RPC endpoint; streaming; bearer authentication). Built once per
agent; the routes set the endpoint's URL on each request for it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

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

from turnkeep.config.settings import Settings


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
