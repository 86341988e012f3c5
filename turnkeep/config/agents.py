"""Agents and MCP servers declared in Python: ``turnkeep.Agent`` and ``turnkeep.McpServer``.

They are the Python faces of a ``turnkeep.yaml``'s ``agents:`` and ``mcp.servers`` entries, with
Python callables where the YAML has import paths: an agent's ``tools`` may hold functions beside
server names, and its ``hooks`` functions beside hook names. ``declare`` merges them into a
worker's ``Settings`` (``TurnkeepPlugin`` does, for YAML and Python alike), so activities see
one configuration and re-check every request against it whichever way it was written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, model_validator

from turnkeep.config.settings import (
    AgentOptions,
    AgentSettings,
    ApprovalSettings,
    ClientToolSettings,
    McpServerSettings,
    Settings,
)
from turnkeep.contract.activity_io import HookPoint
from turnkeep.contract.approval import ApprovalPolicy
from turnkeep.fastagent.request_params import RequestParams

Tool = Callable[..., Any]
HookFunction = Callable[..., Any]


class Approval(ApprovalSettings):
    """A Python agent's ``approval``: the YAML's keys, with ``policy`` a registered policy's
    name or the policy function itself."""

    policy: str | ApprovalPolicy | None = None  # type: ignore[assignment]


class Agent(AgentOptions):
    """An agent, as an ``agents:`` entry of turnkeep.yaml has it (model, models, instruction,
    max_iterations, overrides, timeouts, compaction...), with:

    - ``tools``: MCP or function-tool server names (all of a server's tools, narrowed by
      ``tool_filter``), and Python functions, served in process by a function-tool server named
      after the agent, so the model sees them as ``<agent>__<function name>``;
    - ``tool_filter``: the YAML's ``tools:`` key, server -> tool name patterns;
    - ``hooks``: per hook point, hook names registered on the worker or functions, registered
      under their ``__name__``;
    - ``approval``: the YAML's ``approval`` (``Approval``, whose ``policy`` may be a function),
      or an approval policy function alone, which then decides on every tool call; a function
      is registered under its ``__name__``;
    - ``client_tools``: tools a client answers (``client__<name>``), as the YAML's
      ``client_tools`` entries (``ClientTool``) or Python functions, never called: their name,
      docstring, parameters and return type give the tool's spec and output schema;
    - fast-agent's names: ``servers`` (server names, added to ``tools``) and
      ``request_params`` (``turnkeep.RequestParams``), whose ``model``, ``maxTokens``,
      ``max_iterations``, ``parallel_tool_calls``, ``temperature`` and ``use_history`` set those
      options (``turnkeep.fastagent.request_params`` says what the other fields do).
    """

    name: str
    tools: list[str | Tool] = Field(default_factory=list)
    tool_filter: dict[str, list[str]] | None = None
    hooks: dict[HookPoint, list[str | HookFunction]] = Field(default_factory=dict)
    approval: Approval | ApprovalSettings | ApprovalPolicy | None = None  # type: ignore[assignment]
    client_tools: list[ClientToolSettings | Tool] = Field(default_factory=list)  # type: ignore[assignment]
    servers: list[str] = Field(default_factory=list)
    request_params: RequestParams | None = None

    @model_validator(mode="before")
    @classmethod
    def _fast_agent_names(cls, data: Any) -> Any:
        """``servers`` join ``tools``; ``request_params`` set the options they name, which must
        not also be given, differently, as arguments (one would silently win)."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        tools = list(data.get("tools") or [])
        data["tools"] = [*(s for s in data.get("servers") or [] if s not in tools), *tools]
        params = data.get("request_params")
        if isinstance(params, dict):
            params = data["request_params"] = RequestParams.model_validate(params)
        if isinstance(params, RequestParams):
            for option, value in params.agent_options().items():
                if option in data and data[option] != value:
                    raise ValueError(f"{option} differs between the argument and request_params")
                data[option] = value
        return data


class ClientTool(ClientToolSettings):
    """A tool a client answers, as a ``client_tools:`` entry has it: ``name``,
    ``description``, ``input_schema`` and ``output_schema`` (optional)."""


def client_tool(function: Tool) -> ClientToolSettings:
    """A client-side tool's spec from a Python function that is never called: its
    ``__name__``, docstring, parameters (the input schema) and return type (the output schema,
    when it is an object: a plain value is given as text), as FastMCP reads a function tool."""
    from fastmcp.tools import Tool as FastMcpTool

    tool = FastMcpTool.from_function(function)
    output = tool.output_schema
    if output is not None and output.get("x-fastmcp-wrap-result"):
        output = None
    return ClientToolSettings(
        name=tool.name,
        description=tool.description,
        input_schema=tool.parameters,
        output_schema=output,
    )


class McpServer(McpServerSettings):
    """An MCP server, as an ``mcp.servers`` entry has it: stdio (``command``, ``args``,
    ``env``, ``cwd``) or HTTP (``url``, ``headers``)."""

    name: str


@dataclass(frozen=True)
class Declared:
    """A worker's whole configuration: settings naming every agent and server, and the Python
    functions those name (function tools per server, hooks by name)."""

    settings: Settings
    function_tools: dict[str, list[Tool]] = field(default_factory=dict)
    hooks: dict[str, HookFunction] = field(default_factory=dict)
    approval_policies: dict[str, ApprovalPolicy] = field(default_factory=dict)


def declare(
    settings: Settings,
    agents: Sequence[Agent] = (),
    servers: Sequence[McpServer] = (),
    function_tools: Mapping[str, Sequence[Tool]] | None = None,
    hooks: Mapping[str, HookFunction] | None = None,
    approval_policies: Mapping[str, ApprovalPolicy] | None = None,
) -> Declared:
    """``settings`` with ``agents`` and ``servers`` added. A name given twice (an agent, a
    server, or two different functions under one hook or approval policy name) is refused:
    one would silently win."""
    tools = {name: list(fns) for name, fns in (function_tools or {}).items()}
    all_hooks = dict(hooks or {})
    policies = dict(approval_policies or {})
    mcp_servers = dict(settings.mcp.servers)
    for server in servers:
        _add(mcp_servers, server.name, _server_settings(server), "MCP server")
    agent_settings = dict(settings.agents)
    for agent in agents:
        functions = [tool for tool in agent.tools if not isinstance(tool, str)]
        if functions:
            # Its function-tool server is named after it: no other server may be.
            if agent.name in mcp_servers or agent.name in settings.function_tools:
                raise ValueError(
                    f"agent {agent.name!r} has Python tools, served as a function-tool server "
                    "of that name, but a server is already called so"
                )
            _add(tools, agent.name, functions, "function-tool server")
        names = [tool for tool in agent.tools if isinstance(tool, str)]
        options = agent.model_dump(
            include=set(AgentOptions.model_fields) - {"approval", "client_tools"}
        )
        _add(
            agent_settings,
            agent.name,
            AgentSettings(
                **options,
                approval=_approval(agent.approval, policies),
                client_tools=[
                    t if isinstance(t, ClientToolSettings) else client_tool(t)
                    for t in agent.client_tools
                ],
                servers=[*names, agent.name] if functions else names,
                tools=agent.tool_filter,
                hooks={
                    point: [_hook_name(hook, all_hooks) for hook in enabled]
                    for point, enabled in agent.hooks.items()
                },
            ),
            "agent",
        )
    return Declared(
        settings=settings.model_copy(
            update={
                "agents": agent_settings,
                "mcp": settings.mcp.model_copy(update={"servers": mcp_servers}),
            }
        ),
        function_tools=tools,
        hooks=all_hooks,
        approval_policies=policies,
    )


def _server_settings(server: McpServer) -> McpServerSettings:
    return McpServerSettings(**server.model_dump(include=set(McpServerSettings.model_fields)))


def _hook_name(hook: str | HookFunction, registered: dict[str, HookFunction]) -> str:
    """A hook's name; a function is registered under its ``__name__``."""
    return _function_name(hook, registered, "hook")


def _approval(
    approval: Approval | ApprovalSettings | ApprovalPolicy | None,
    registered: dict[str, ApprovalPolicy],
) -> ApprovalSettings | None:
    """An agent's approval as settings name it, its policy function (if any) registered."""
    if approval is None:
        return None
    if not isinstance(approval, ApprovalSettings):  # a policy function alone: every call
        approval = Approval(policy=approval)
    policy = approval.policy
    if policy is None or isinstance(policy, str):
        return ApprovalSettings(**approval.model_dump(exclude={"policy"}), policy=policy)
    name = _function_name(policy, registered, "approval policy")
    return ApprovalSettings(**approval.model_dump(exclude={"policy"}), policy=name)


def _function_name(function: str | Any, registered: dict[str, Any], what: str) -> str:
    """A registered function's name; a function is registered under its ``__name__``."""
    if isinstance(function, str):
        return function
    name = getattr(function, "__name__", "")
    if not name or name == "<lambda>":
        raise ValueError(f"{what} {function!r} needs a name: give it a def, not a lambda")
    if registered.setdefault(name, function) is not function:
        raise ValueError(f"two different {what}s are named {name!r}")
    return name


def _add(into: dict[str, Any], name: str, value: Any, what: str) -> None:
    if name in into:
        raise ValueError(f"{what} {name!r} is declared twice (in the settings or in Python)")
    into[name] = value
