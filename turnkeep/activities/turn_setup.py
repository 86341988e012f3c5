"""The ``prepare_turn`` activity: check a turn against the worker's configuration and resolve
the agent's settings into a ``TurnPlan`` the workflow can follow without reading config."""

from __future__ import annotations

from temporalio import activity

from turnkeep.config.settings import AgentSettings, Settings, TimeoutSettings
from turnkeep.errors import config_error, known, require_workflow
from turnkeep.providers.registry import (
    ProviderRegistry,
    allowed_models,
    installed_providers,
    is_allowed,
    max_tokens_limit,
)
from turnkeep.workflows.activity_io import (
    PAYLOAD_ENVELOPE_BYTES,
    PAYLOAD_LIMIT_BYTES,
    PREPARE_TURN,
    CompactionPlan,
    ContinueAsNewPlan,
    PrepareTurnRequest,
    Timeouts,
    TurnPlan,
    VisibilityPlan,
)
from turnkeep.workflows.approval import ApprovalPlan
from turnkeep.workflows.turn_io import TurnOverrides


class TurnSetupActivities:
    def __init__(self, settings: Settings, providers: ProviderRegistry | None = None) -> None:
        self._settings = settings
        self._providers = providers or installed_providers()
        # Which search attributes turns may upsert: none until the worker has checked the
        # namespace at start (turnkeep/worker/search_attributes.py), which replaces this before
        # it polls.
        self.visibility = VisibilityPlan(
            search_attribute_interval=settings.visibility.search_attribute_interval
        )

    @activity.defn(name=PREPARE_TURN)
    async def prepare_turn(self, request: PrepareTurnRequest) -> TurnPlan:
        require_workflow()
        return plan_turn(self._settings, request, self.visibility, self._providers)


def plan_turn(
    settings: Settings,
    request: PrepareTurnRequest,
    visibility: VisibilityPlan | None = None,
    providers: ProviderRegistry | None = None,
) -> TurnPlan:
    providers = providers or installed_providers()
    agent = settings.agent(request.agent)
    overrides = request.overrides
    model = check_overrides(settings, request.agent, overrides, providers)

    def pick(name: str) -> object:
        value = getattr(overrides, name)
        return value if value is not None else getattr(agent, name, None)

    return TurnPlan.model_validate(
        {
            "agent": request.agent,
            "model": model,
            "instruction": agent.instruction,
            **{name: pick(name) for name in TurnOverrides.model_fields if name != "model"},
            "has_tools": bool(agent.servers),
            "hooks": {point: names for point, names in agent.hooks.items() if names},
            "compaction": _compaction(agent, providers.context_window(model, settings)),
            "continue_as_new": _continue_as_new(settings),
            "visibility": visibility or VisibilityPlan(),
            "llm": _timeouts(agent.llm_timeouts),
            "tools": _timeouts(agent.tool_timeouts),
            "tool_task_queues": _tool_task_queues(settings, agent),
            "approval": _approval(agent),
        }
    )


def check_overrides(
    settings: Settings,
    name: str,
    overrides: TurnOverrides,
    providers: ProviderRegistry | None = None,
) -> str:
    """The model a turn (or one model call) of agent ``name`` runs on, once ``overrides`` are
    checked against the agent: a model from ``allowed_models``, only the overrides the agent
    lists, and always lower (never higher) ``max_iterations`` and ``max_tokens``. The model
    activities hold each call to this same rule."""
    providers = providers or installed_providers()
    agent = settings.agent(name)
    allowed = allowed_models(settings, agent, providers)
    model = overrides.model or allowed[0]
    # By what the strings name: `sonnet` is `anthropic.claude-sonnet-5`, and a reasoning
    # setting is part of the model (turnkeep/activities/model_strings.py).
    if not is_allowed(model, allowed, providers):
        raise config_error(
            "ModelNotAllowed",
            f"Agent {name!r} does not let a turn use model {model!r} "
            f"(it allows: {known(set(allowed))}).",
        )
    # An unknown model string, or one whose provider the config leaves unusable (generic with
    # no server), fails the turn here, before any model call.
    providers.check(settings, model)
    limits = {
        "max_iterations": agent.max_iterations,
        "max_tokens": max_tokens_limit(agent, model, providers),
    }
    lowered = {
        field
        for field, limit in limits.items()
        if (value := getattr(overrides, field)) is not None and (limit is None or value <= limit)
    }
    refused = overrides.given() - set(agent.overrides) - {"model"} - lowered
    if refused:
        bounds = ", ".join(
            f"{field} (to at most {limit})" if limit is not None else field
            for field, limit in limits.items()
        )
        raise config_error(
            "OverrideNotAllowed",
            f"Agent {name!r} does not let a turn set {', '.join(sorted(refused))} "
            f"(it allows: {known(agent.overrides)}; a turn may always lower {bounds}).",
        )
    return model


def _timeouts(t: TimeoutSettings) -> Timeouts:
    return Timeouts(
        start_to_close=t.start_to_close, heartbeat=t.heartbeat, max_attempts=t.max_attempts
    )


def _continue_as_new(settings: Settings) -> ContinueAsNewPlan:
    config = settings.continue_as_new
    return ContinueAsNewPlan(
        history_bytes=config.history_bytes,
        history_events=config.history_events,
        when_suggested=config.when_suggested,
        # Without external storage the new run's input (turn and carried state) is recorded
        # inline and must fit under Temporal's payload limit, with room for its envelope.
        max_carried_bytes=PAYLOAD_LIMIT_BYTES - PAYLOAD_ENVELOPE_BYTES
        if settings.payload_storage.driver == "off"
        else None,
    )


def _tool_task_queues(settings: Settings, agent: AgentSettings) -> dict[str, str | None]:
    """Where each of the agent's servers is called, when any is called elsewhere than on the
    turn's own task queue (None: there); empty when none is, so the turn's tool activities
    are scheduled as they always were."""
    queues = {server: settings.tool_task_queue(agent, server) for server in agent.servers}
    return queues if any(queues.values()) else {}


def _approval(agent: AgentSettings) -> ApprovalPlan | None:
    rules = agent.approval
    if rules is None:
        return None
    return ApprovalPlan(
        tools=rules.tools, timeout=rules.timeout, on_timeout=rules.on_timeout, policy=rules.policy
    )


def _compaction(agent: AgentSettings, model_window: int | None) -> CompactionPlan | None:
    settings = agent.compaction
    window = settings.context_window or model_window
    # An unknown window (generic.* with none configured) is no reason to compact at a guess.
    if not settings.enabled or window is None:
        return None
    return CompactionPlan(
        threshold_tokens=int(window * settings.threshold), keep_exchanges=settings.keep_exchanges
    )
