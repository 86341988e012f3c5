"""The ``prepare_turn`` activity: check a turn against the worker's configuration and resolve
the agent's settings into a ``TurnPlan`` the workflow can follow without reading config."""

from __future__ import annotations

from temporalio import activity

from activities.errors import config_error, known
from activities.models import context_window, default_model, resolve_model
from activities.settings import AgentSettings, Settings, TimeoutSettings
from workflows.activity_io import (
    PREPARE_TURN,
    TEMPORAL_PAYLOAD_LIMIT_BYTES,
    CompactionPlan,
    ContinueAsNewPlan,
    PrepareTurnRequest,
    Timeouts,
    TurnPlan,
    VisibilityPlan,
)
from workflows.turn_io import TurnOverrides


class TurnSetupActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        # Which search attributes turns may upsert: none until the worker has checked the
        # namespace at start (worker/search_attributes.py), which replaces this before it polls.
        self.visibility = VisibilityPlan(
            outcome_notes=True,
            outcome_timers=True,
            skip_told_outcomes=True,
            start_attributes=True,
            search_attribute_interval=settings.visibility.search_attribute_interval,
        )

    @activity.defn(name=PREPARE_TURN)
    async def prepare_turn(self, request: PrepareTurnRequest) -> TurnPlan:
        return plan_turn(self._settings, request, self.visibility)


def plan_turn(
    settings: Settings, request: PrepareTurnRequest, visibility: VisibilityPlan | None = None
) -> TurnPlan:
    agent = settings.agents.get(request.agent)
    if agent is None:
        raise config_error(
            "UnknownAgent",
            f"Unknown agent {request.agent!r}. This worker's agents: {known(settings.agents)}.",
        )
    overrides = request.overrides
    _check_overrides(request.agent, agent, overrides)
    model = overrides.model or agent.model or default_model(settings)
    resolve_model(model)  # an unknown model string fails the turn here, before any model call

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
            "compaction": _compaction(agent, model),
            "continue_as_new": _continue_as_new(settings),
            "visibility": visibility or VisibilityPlan(),
            "llm": _timeouts(agent.llm_timeouts),
            "tools": _timeouts(agent.tool_timeouts),
        }
    )


def _check_overrides(name: str, agent: AgentSettings, overrides: TurnOverrides) -> None:
    refused = overrides.given() - set(agent.overrides) - {"model"}
    if refused:
        raise config_error(
            "OverrideNotAllowed",
            f"Agent {name!r} does not let a turn set {', '.join(sorted(refused))} "
            f"(it allows: {known(agent.overrides)}).",
        )
    if overrides.model and overrides.model != agent.model and overrides.model not in agent.models:
        raise config_error(
            "OverrideNotAllowed",
            f"Agent {name!r} does not let a turn use model {overrides.model!r} "
            f"(it allows: {known(m for m in [agent.model, *agent.models] if m)}).",
        )


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
        max_carried_bytes=TEMPORAL_PAYLOAD_LIMIT_BYTES - 64 * 1024
        if settings.payload_storage.driver == "off"
        else None,
    )


def _compaction(agent: AgentSettings, model: str) -> CompactionPlan | None:
    settings = agent.compaction
    if not settings.enabled:
        return None
    window = settings.context_window or context_window(model)
    return CompactionPlan(
        threshold_tokens=int(window * settings.threshold), keep_exchanges=settings.keep_exchanges
    )
