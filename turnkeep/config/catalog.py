"""``AgentCatalog``: a worker's agents, the slice of its ``Settings`` that the activities check
requests against. An activity gets this rather than the whole configuration: it needs the
agent a request names (its servers, tool filter, hooks, approval rules, models) and where each
server's tools run, never the keys, storage or encryption beside them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from turnkeep.config.settings import AgentOptions, AgentSettings, McpServerSettings, Settings
from turnkeep.contract.activity_io import AGENT_TOOL_PREFIX, AgentTool, ToolSpec
from turnkeep.contract.turn_io import (
    DEFAULT_MAX_ITERATIONS,
    DEFAULT_TASK_QUEUE,
    agent_task_queue,
)
from turnkeep.errors import config_error, known

# fast-agent's input for an agent called as a tool.
AGENT_TOOL_SCHEMA = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "Message to send to the agent"}},
    "required": ["message"],
}


def called(agent: AgentOptions) -> list[str]:
    """The agents ``agent`` calls: as tools, or as the steps of a workflow agent."""
    single = [a for a in (agent.fan_in, agent.generator, agent.evaluator, agent.worker) if a]
    return [*agent.agents, *agent.sequence, *agent.fan_out, *single]


# The most iterations an agent called inline (`call: inline`) may make. Its whole loop is one
# step of its caller's history, which continues as new only between its own steps, so each
# iteration of it (a dozen events, two activities and their workflow tasks) stays in that
# history: at this bound even a batch of several such calls, from a caller at its
# continue-as-new threshold, is far from Temporal's hard limit of 51,200 events. It is the
# default, which an agent with a longer loop raises, and such an agent is a child's work.
INLINE_MAX_ITERATIONS = DEFAULT_MAX_ITERATIONS


def inline_conflicts(agent: AgentSettings, asking_servers: list[str]) -> list[str]:
    """What in ``agent``'s config the inline loop (``call: inline``) does not run: each of
    these needs a history, a person or a wait of the called agent's own."""
    conflicts = {
        f"type {agent.type} (a workflow agent's steps are child turns)": agent.type != "agent",
        "hooks": any(agent.hooks.values()),
        "approval": agent.approval is not None,
        "client_tools": bool(agent.client_tools),
        "agents (agent tools)": bool(agent.agents),
        "budget": agent.budget is not None,
        "fallback_models": bool(agent.fallback_models),
        f"servers that ask (elicitation forms or sampling): {asking_servers}": bool(asking_servers),
        f"max_iterations {agent.max_iterations} (at most {INLINE_MAX_ITERATIONS} inline)": (
            agent.max_iterations > INLINE_MAX_ITERATIONS
        ),
    }
    return [what for what, present in conflicts.items() if present]


class AgentCatalog(Mapping[str, AgentSettings]):
    """The worker's agents by name (YAML and Python ones alike, once ``declare`` has merged
    them), and the ``mcp.servers`` entries' task queues."""

    def __init__(
        self,
        agents: Mapping[str, AgentSettings],
        servers: Mapping[str, McpServerSettings] | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
    ) -> None:
        self._agents = agents
        self._servers: Mapping[str, McpServerSettings] = servers or {}
        # The worker's task queue, to name an agent's own queue in a refusal.
        self._task_queue = task_queue

    @classmethod
    def of(cls, settings: Settings) -> AgentCatalog:
        return cls(settings.agents, settings.mcp.servers, settings.task_queue)

    def __getitem__(self, name: str) -> AgentSettings:
        return self._agents[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._agents)

    def __len__(self) -> int:
        return len(self._agents)

    def agent(self, name: str) -> AgentSettings:
        """The agent a request names: every activity looks its agent up here, so a request
        naming an agent this worker doesn't configure is refused wherever it comes from."""
        agent = self._agents.get(name)
        if agent is None:
            raise config_error(
                "UnknownAgent",
                f"Unknown agent {name!r}. This worker's agents: {known(self._agents)}. Turns of "
                f"agent {name!r} run on task queue {self.task_queue_of(name)!r}, which only "
                "workers with that agent poll: start them there (turnkeep's clients and command "
                "line do).",
            )
        return agent

    def task_queue_of(self, agent: str) -> str:
        """Agent ``agent``'s own task queue, under the worker's (``agent_task_queue``)."""
        return agent_task_queue(self._task_queue, agent)

    def server(self, name: str) -> McpServerSettings | None:
        """The ``mcp.servers`` entry ``name`` (None: a server of another tool-source kind)."""
        return self._servers.get(name)

    def tool_task_queue(self, agent: AgentSettings, server: str) -> str | None:
        """The task queue ``agent``'s calls to ``server`` run on (None: the turn's own)."""
        config = self._servers.get(server)
        return (config.task_queue if config else None) or agent.task_queue

    def asking_servers(self, agent: AgentSettings) -> dict[str, McpServerSettings]:
        """``agent``'s servers that may ask a person (elicitation ``forms``) or a model
        (sampling) something during a tool call, with their entries."""
        return {
            name: config
            for name in agent.servers
            if (config := self._servers.get(name)) is not None
            and (
                (config.elicitation is not None and config.elicitation.mode == "forms")
                or (config.sampling is not None and config.sampling.enabled)
            )
        }

    def unknown_servers(self, servers: set[str]) -> dict[str, list[str]]:
        """Per agent, the servers it names that are not among ``servers``."""
        return {
            name: missing
            for name, agent in self._agents.items()
            if (missing := [s for s in agent.servers if s not in servers])
        }

    def agent_tool(self, name: str, task_queue: str | None = None) -> AgentTool:
        """Agent ``name`` as another agent's tool, as fast-agent offers it: ``agent__<name>``,
        described by its description (or instruction), taking a message; its turns start on
        ``task_queue`` (default: the agent's own queue)."""
        agent = self.agent(name)
        spec = ToolSpec(
            name=AGENT_TOOL_PREFIX + name,
            description=agent.description or agent.instruction,
            input_schema=AGENT_TOOL_SCHEMA,
        )
        return AgentTool(
            spec=spec,
            agent=name,
            task_queue=task_queue or self.task_queue_of(name),
            inline=agent.call == "inline",
        )

    def team_problems(self) -> list[str]:
        """What is wrong with the agents that agents call (as tools, or as steps of a workflow
        agent): one this worker lacks, or a circle (an agent that reaches itself)."""
        problems = [
            f"agent {name!r} calls agent(s) {missing}, which are not in this "
            f"worker's agents (known: {known(self._agents)}). A worker runs the turns of the "
            "agents its agents call, on its own task queue or on theirs: declare them in this "
            "worker's config too"
            for name, agent in self._agents.items()
            if (missing := [a for a in called(agent) if a not in self._agents])
        ]
        for name in self._agents:
            circle = self._circle(name, [name])
            # Reported from its first member in name order, so each circle once.
            if circle is not None and circle[0] == min(circle):
                problems.append(f"agents call each other in a circle: {' -> '.join(circle)}")
        return problems

    def inline_problems(self) -> list[str]:
        """The agents whose ``call: inline`` asks for what the inline loop does not run: refused
        when the worker starts, not found out at a call (``inline_agent.refusal`` stays as the
        guard of a worker whose config differs from the caller's)."""
        return [
            f"agent {name!r} says `call: inline` but has {', '.join(conflicts)}: an agent "
            "called inline runs a plain loop of model and tool calls inside its caller's "
            "workflow; remove those, or call it as a child turn (`call: child`, the default)"
            for name, agent in self._agents.items()
            if agent.call == "inline"
            and (conflicts := inline_conflicts(agent, list(self.asking_servers(agent))))
        ]

    def _circle(self, start: str, path: list[str]) -> list[str] | None:
        """A path of agent-tool calls from ``start`` (``path`` so far) back to it, if any."""
        for child in called(self._agents[path[-1]]):
            if child == start:
                return [*path, child]
            if child in self._agents and child not in path:
                found = self._circle(start, [*path, child])
                if found is not None:
                    return found
        return None

    def unknown_hooks(self, hooks: set[str]) -> dict[str, list[str]]:
        """Per agent, the hooks it enables that are not among ``hooks``."""
        return {
            name: missing
            for name, agent in self._agents.items()
            if (missing := sorted({h for hs in agent.hooks.values() for h in hs} - hooks))
        }

    def approval_policies(self) -> dict[str, str]:
        """Each approval policy an agent names, with (the last) agent naming it."""
        return {
            agent.approval.policy: name
            for name, agent in self._agents.items()
            if agent.approval is not None and agent.approval.policy is not None
        }
