"""The ``prepare_turn`` activity: check a turn against the worker's configuration and resolve
the agent's settings into a ``TurnPlan`` the workflow can follow without reading config."""

from __future__ import annotations

from temporalio import activity

from activities.errors import config_error, known
from activities.models import context_window, default_model, resolve_model
from activities.settings import AgentSettings, Settings, TimeoutSettings
from workflows.activity_io import (
    PREPARE_TURN,
    CompactionPlan,
    PrepareTurnRequest,
    Timeouts,
    TurnPlan,
)
from workflows.turn_io import TurnOverrides


class TurnSetupActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @activity.defn(name=PREPARE_TURN)
    async def prepare_turn(self, request: PrepareTurnRequest) -> TurnPlan:
        return plan_turn(self._settings, request)


def plan_turn(settings: Settings, request: PrepareTurnRequest) -> TurnPlan:
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


def _compaction(agent: AgentSettings, model: str) -> CompactionPlan | None:
    settings = agent.compaction
    if not settings.enabled:
        return None
    window = settings.context_window or context_window(model)
    return CompactionPlan(
        threshold_tokens=int(window * settings.threshold), keep_exchanges=settings.keep_exchanges
    )
