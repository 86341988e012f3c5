"""The ``prepare_turn`` activity: check a turn against the worker's configuration and resolve
the agent's settings into a ``TurnPlan`` the workflow can follow without reading config."""

from __future__ import annotations

from temporalio import activity

from turnkeep.config.catalog import AgentCatalog
from turnkeep.config.settings import (
    FREE_OVERRIDES,
    AgentSettings,
    ContinueAsNewSettings,
    Settings,
    TimeoutSettings,
    VisibilitySettings,
)
from turnkeep.contract.activity_io import (
    CLIENT_TOOL_PREFIX,
    PAYLOAD_ENVELOPE_BYTES,
    PAYLOAD_LIMIT_BYTES,
    PREPARE_TURN,
    AgentTool,
    BudgetPlan,
    ClientTool,
    ClientToolsPlan,
    CompactionPlan,
    ContinueAsNewPlan,
    PrepareTurnRequest,
    TeamPlan,
    Timeouts,
    ToolSpec,
    TurnPlan,
    VisibilityPlan,
)
from turnkeep.contract.approval import ApprovalPlan
from turnkeep.contract.server_requests import ServerRequestPlan
from turnkeep.contract.turn_io import BudgetLimit, TurnOverrides, lowest_priority
from turnkeep.errors import config_error, known, require_workflow
from turnkeep.providers.registry import ModelCatalog
from turnkeep.workflows.teams.planner import planner_instruction
from turnkeep.workflows.teams.router import routing_instruction


class TurnSetupActivities:
    """``prepare_turn``, from the parts of the settings a plan is made of: the agents, the
    models they may use, and what the worker decides for every turn (continue-as-new, what a
    turn publishes)."""

    def __init__(
        self,
        agents: AgentCatalog,
        models: ModelCatalog,
        *,
        continue_as_new: ContinueAsNewPlan,
        visibility: VisibilitySettings,
        max_agent_depth: int = Settings.model_fields["max_agent_depth"].default,
    ) -> None:
        self._agents = agents
        self._max_agent_depth = max_agent_depth
        self._models = models
        self._continue_as_new = continue_as_new
        # Which search attributes turns may upsert: none until the worker has checked the
        # namespace at start (``turnkeep.observability.search_attributes``), which replaces
        # this before it polls.
        self.visibility = VisibilityPlan(
            search_attribute_interval=visibility.search_attribute_interval
        )
        # The task queues the workers serving these agents poll: the plugin adds each
        # worker's as it is built, before any of them polls (``child_queue``).
        self.worker_queues: set[str] = set()

    @activity.defn(name=PREPARE_TURN)
    async def prepare_turn(self, request: PrepareTurnRequest) -> TurnPlan:
        require_workflow()
        # The turn's own task queue: its activities run there unless a tool server says
        # otherwise, and this one was not told to.
        return self.plan(request, task_queue=activity.info().task_queue)

    def plan(self, request: PrepareTurnRequest, *, task_queue: str | None = None) -> TurnPlan:
        """The plan of a turn of ``request.agent`` on ``task_queue`` (None: on its agent's own
        queue, as ``turnkeep worker`` serves it), once its overrides are checked."""
        agent = self._agents.agent(request.agent)
        if request.depth > self._max_agent_depth:
            raise config_error(
                "AgentDepthExceeded",
                f"Agent {request.agent!r} was called as a tool {request.depth} agents deep, "
                f"past this worker's max_agent_depth ({self._max_agent_depth}).",
            )
        overrides = request.overrides
        # The turn's task priority: its agent's, lowered by its input (never raised), and its
        # tenant as the fairness key.
        scheduling = {
            "priority": lowest_priority(agent.priority, request.priority),
            "fairness_key": request.tenant,
        }
        if agent.type in ("chain", "parallel", "evaluator_optimizer", "maker"):
            team = self._team_plan(request.agent, agent, overrides, task_queue)
            return team.model_copy(update=scheduling)
        model = check_overrides(self._agents, self._models, request.agent, overrides)
        if agent.type in ("router", "orchestrator", "iterative_planner"):
            team = self._team_plan(request.agent, agent, overrides, task_queue, model=model)
            return team.model_copy(update=scheduling)

        def pick(name: str) -> object:
            value = getattr(overrides, name)
            return value if value is not None else getattr(agent, name, None)

        # The chain follows the turn's model: the agent's fallbacks, past the one it runs on.
        fallbacks = [m for m in agent.fallback_models if not self._models.is_allowed(model, [m])]
        budget = _budget(request.agent, agent, request.budget)
        if budget is not None and budget.unit == "usd":
            budget.input_usd_per_token = self._input_price(request.agent, [model, *fallbacks])

        return TurnPlan.model_validate(
            {
                "agent": request.agent,
                "model": model,
                "instruction": agent.instruction,
                **{name: pick(name) for name in TurnOverrides.model_fields if name != "model"},
                "has_tools": bool(agent.servers),
                "hooks": {point: names for point, names in agent.hooks.items() if names},
                "compaction": _compaction(agent, self._models.context_window(model)),
                "continue_as_new": self._continue_as_new,
                "visibility": self.visibility,
                "llm": _timeouts(agent.llm_timeouts),
                "tools": _timeouts(agent.tool_timeouts),
                "tool_task_queues": _tool_task_queues(self._agents, agent),
                "approval": _approval(agent),
                "server_requests": _server_requests(self._agents, agent),
                "agent_tools": [self._agent_tool(name, task_queue) for name in agent.agents],
                "max_parallel": agent.max_parallel,
                "budget": budget,
                "fallback_models": fallbacks,
                "fallback_after_attempts": agent.fallback_after_attempts,
                "client_tools": _client_tools(agent),
                **scheduling,
                "limits": self._limits([model, *fallbacks]),
            }
        )

    def _limits(self, models: list[str]) -> dict[str, str]:
        """The limit governing each of ``models`` (those with one)."""
        return {m: limit for m in models if (limit := self._models.limit_of(m)) is not None}

    def _input_price(self, name: str, models: list[str]) -> float:
        """The dearest input price (USD per token) of ``models``, for a dollar budget's
        estimates; a model with no price makes the budget unusable, which is said here."""
        prices = []
        for model in models:
            price = self._models.price(self._models.resolve(model))
            if price is None:
                raise config_error(
                    "BudgetNeedsPrice",
                    f"Agent {name!r} has a budget in USD, but model {model!r} has no price: "
                    "give it one in the config's `prices:` (USD per million tokens).",
                )
            prices.append(price.input_per_token)
        return max(prices)

    def _agent_tool(self, name: str, task_queue: str | None) -> AgentTool:
        """Agent ``name`` as a tool or a step of a turn on ``task_queue``, its turns started
        where a worker that has it polls (``child_queue``)."""
        return self._agents.agent_tool(name, self.child_queue(name, task_queue))

    def child_queue(self, agent: str, task_queue: str | None) -> str:
        """Where a turn on ``task_queue`` starts a turn of ``agent``: the agent's own queue
        when these workers poll it (``turnkeep worker``, ``build_workers``), which only
        workers that have the agent poll, however many configs share the worker's queue.
        Otherwise (the plugin on an application's own ``Worker``, on its one queue) the
        parent's queue: the worker running this polls it, and has the agent, or it would not
        have started (``AgentCatalog.team_problems``)."""
        own = self._agents.task_queue_of(agent)
        return own if task_queue is None or own in self.worker_queues else task_queue

    def _team_plan(
        self,
        name: str,
        agent: AgentSettings,
        overrides: TurnOverrides,
        task_queue: str | None,
        *,
        model: str | None = None,
    ) -> TurnPlan:
        """The plan of a workflow agent's turn: its steps, each another agent's child turn.
        Only a router and a planner call a model of their own (``model``, to choose, to
        plan), and a turn may set nothing else of it."""
        if overrides.given() - {"model"} or (overrides.model and model is None):
            raise config_error(
                "OverrideNotAllowed",
                f"Agent {name!r} is a {agent.type} of other agents: a turn of it cannot set "
                f"{', '.join(sorted(overrides.given()))} (set them on the agents it runs).",
            )
        steps = {
            "chain": agent.sequence,
            "parallel": agent.fan_out,
            "evaluator_optimizer": [agent.generator or "", agent.evaluator or ""],
            "maker": [agent.worker or ""],
        }.get(agent.type, agent.agents)
        team = TeamPlan(
            kind=agent.type,
            steps=[self._agent_tool(step, task_queue) for step in steps],
            fan_in=self._agent_tool(agent.fan_in, task_queue) if agent.fan_in else None,
            cumulative=agent.cumulative,
            include_request=agent.include_request,
            min_rating=agent.min_rating,
            max_refinements=agent.max_refinements,
            refinement_instruction=agent.refinement_instruction,
            k=agent.k,
            max_samples=agent.max_samples,
            match_strategy=agent.match_strategy,
            red_flag_max_length=agent.red_flag_max_length,
            plan_iterations=agent.plan_iterations,
        )
        instruction = agent.instruction
        if agent.type == "router":
            instruction = routing_instruction(team.steps, agent.instruction)
        elif agent.type in ("orchestrator", "iterative_planner"):
            instruction = planner_instruction(team.steps, agent.type, agent.instruction)
        return TurnPlan(
            agent=name,
            model=model or agent.type,
            instruction=instruction,
            max_iterations=0,
            # Its steps see only the turn's new messages, but a session keeps the exchange.
            use_history=True,
            parallel_tool_calls=True,
            has_tools=False,
            llm=_timeouts(agent.llm_timeouts),
            tools=_timeouts(agent.tool_timeouts),
            continue_as_new=self._continue_as_new,
            visibility=self.visibility,
            team=team,
            limits=self._limits([model]) if model else {},
        )


def check_overrides(
    agents: AgentCatalog, models: ModelCatalog, name: str, overrides: TurnOverrides
) -> str:
    """The model a turn (or one model call) of agent ``name`` runs on, once ``overrides`` are
    checked against the agent: a model from ``allowed_models``; any of ``FREE_OVERRIDES``; and
    the agent's bounds (``BOUNDED_OVERRIDES``) kept to, unless the agent lists the setting in
    ``overrides``. The model activities hold each call to this same rule."""
    agent = agents.agent(name)
    allowed = models.allowed_models(agent)
    model = overrides.model or allowed[0]
    # By what the strings name: `sonnet` is `anthropic.claude-sonnet-5`, and a reasoning
    # setting is part of the model (``turnkeep.fastagent.model_strings``).
    if not models.is_allowed(model, allowed):
        raise config_error(
            "ModelNotAllowed",
            f"Agent {name!r} does not let a turn use model {model!r} "
            f"(it allows: {known(set(allowed))}).",
        )
    # An unknown model string, or one whose provider the config leaves unusable (generic with
    # no server), fails the turn here, before any model call.
    models.check(model)
    # None: no bound. parallel_tool_calls is bounded by the agent's own: on only if it is.
    bounds: dict[str, int | None] = {
        "max_iterations": agent.max_iterations,
        "max_tokens": models.max_tokens_limit(agent, model),
        "parallel_tool_calls": agent.parallel_tool_calls,
    }
    beyond = sorted(
        field
        for field in overrides.given() - FREE_OVERRIDES - {"model"} - set(agent.overrides)
        # A setting neither free nor bounded here (new, and not yet placed) is refused.
        if field not in bounds
        or ((bound := bounds[field]) is not None and getattr(overrides, field) > bound)
    )
    if beyond:
        raise config_error(
            "OverrideNotAllowed",
            f"Agent {name!r} does not let a turn set "
            f"{', '.join(_past(field, bounds.get(field)) for field in beyond)} (a turn may lower a "
            "limit and turn parallel_tool_calls off; the agent's `overrides`, which let it go "
            f"further, list: {known(agent.overrides)}).",
        )
    return model


def _past(field: str, bound: int | None) -> str:
    if field == "parallel_tool_calls":
        return "parallel_tool_calls on"
    return f"{field} above {bound}" if bound is not None else field


def _timeouts(t: TimeoutSettings) -> Timeouts:
    return Timeouts(
        start_to_close=t.start_to_close, heartbeat=t.heartbeat, max_attempts=t.max_attempts
    )


def continue_as_new_plan(config: ContinueAsNewSettings, *, storage_on: bool) -> ContinueAsNewPlan:
    """Every turn's continue-as-new thresholds. ``storage_on``: whether ``payload_storage``
    puts large payloads in external storage."""
    return ContinueAsNewPlan(
        history_bytes=config.history_bytes,
        history_events=config.history_events,
        when_suggested=config.when_suggested,
        # Without external storage the new run's input (turn and carried state) is recorded
        # inline and must fit under Temporal's payload limit, with room for its envelope.
        max_carried_bytes=None if storage_on else PAYLOAD_LIMIT_BYTES - PAYLOAD_ENVELOPE_BYTES,
    )


def _tool_task_queues(agents: AgentCatalog, agent: AgentSettings) -> dict[str, str | None]:
    """Where each of the agent's servers is called, when any is called elsewhere than on the
    turn's own task queue (None: there); empty when none is, so the turn's tool activities
    are scheduled as they always were."""
    queues = {server: agents.tool_task_queue(agent, server) for server in agent.servers}
    return queues if any(queues.values()) else {}


def _budget(name: str, agent: AgentSettings, asked: BudgetLimit | None) -> BudgetPlan | None:
    """The turn's budget: the agent's, or the turn's own (``TurnInput.budget``), which may
    lower it, never raise it (a turn of an agent with no budget may set one)."""
    rules = agent.budget
    if rules is None and asked is None:
        return None
    if rules is None:
        assert asked is not None
        return BudgetPlan(unit=asked.unit, limit=asked.amount)
    unit = "tokens" if rules.tokens is not None else "usd"
    limit = float(rules.tokens if rules.tokens is not None else rules.usd or 0.0)
    if asked is not None:
        if asked.unit != unit or asked.amount > limit:
            raise config_error(
                "OverrideNotAllowed",
                f"Agent {name!r} has a budget of {limit:g} {unit}: a turn may lower it, not set "
                f"{asked.amount:g} {asked.unit}.",
            )
        limit = asked.amount
    return BudgetPlan(
        unit=unit,
        limit=limit,
        per=rules.per,
        on_exceeded=rules.on_exceeded,
        max_raise=rules.max_raise,
        timeout=rules.timeout,
    )


def _server_requests(agents: AgentCatalog, agent: AgentSettings) -> dict[str, ServerRequestPlan]:
    """How the turn answers each of the agent's servers that may ask a person or a model
    something during a tool call; the others are left out (their requests are declined)."""
    plans: dict[str, ServerRequestPlan] = {}
    for server, config in agents.asking_servers(agent).items():
        elicit = config.elicitation.mode if config.elicitation else "none"
        sampling = config.sampling if config.sampling and config.sampling.enabled else None
        plans[server] = ServerRequestPlan(
            elicitation=elicit,
            elicitation_timeout=config.elicitation.timeout if config.elicitation else None,
            sampling=sampling is not None,
            sampling_model=sampling.model if sampling else None,
            sampling_approval=sampling.approval if sampling else False,
        )
    return plans


def _approval(agent: AgentSettings) -> ApprovalPlan | None:
    rules = agent.approval
    if rules is None:
        return None
    return ApprovalPlan(
        tools=rules.tools, timeout=rules.timeout, on_timeout=rules.on_timeout, policy=rules.policy
    )


def _client_tools(agent: AgentSettings) -> ClientToolsPlan | None:
    if not agent.client_tools:
        return None
    tools = [
        ClientTool(
            spec=ToolSpec(
                name=CLIENT_TOOL_PREFIX + tool.name,
                description=tool.description,
                input_schema=tool.input_schema,
            ),
            output_schema=tool.output_schema,
        )
        for tool in agent.client_tools
    ]
    return ClientToolsPlan(tools=tools, timeout=agent.client_timeout)


def _compaction(agent: AgentSettings, model_window: int | None) -> CompactionPlan | None:
    settings = agent.compaction
    window = settings.context_window or model_window
    # An unknown window (generic.* with none configured) is no reason to compact at a guess.
    if not settings.enabled or window is None:
        return None
    return CompactionPlan(
        threshold_tokens=int(window * settings.threshold), keep_exchanges=settings.keep_exchanges
    )
