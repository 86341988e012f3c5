"""Which workflow a request names, and whether its key may touch it: the workflow must exist,
be of the kind the route serves (a turn, a session) and belong to an agent the key is scoped
to, read from the workflow itself (its ``TurnkeepAgent`` search attribute, else its start
input), never from the request."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.forks import agent_of as start_agent
from turnkeep.config.settings import Settings
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME
from turnkeep.doors.gateway.auth import ApiKey
from turnkeep.doors.gateway.errors import ApiError
from turnkeep.workflows import visibility
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

Kind = Literal["turn", "session"]
_TYPES: dict[Kind, str] = {"turn": WORKFLOW_NAME, "session": SESSION_WORKFLOW_NAME}
# Workflow ids whose agent is remembered (it never changes): a watcher's reconnect or a page's
# polling costs one describe, not a history read too.
_AGENTS_KEPT = 10_000
# How old a workflow's description a stream's check may take (``Access.workflow``).
RECENT_SECONDS = 2.0


@dataclass(frozen=True)
class Found:
    workflow_id: str
    agent: str
    description: WorkflowExecutionDescription

    @property
    def running(self) -> bool:
        return self.description.status == WorkflowExecutionStatus.RUNNING


class Access:
    """The checks every route that names a turn or a session makes first."""

    def __init__(self, client: Client, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self._agents: OrderedDict[str, str] = OrderedDict()
        self._recent: OrderedDict[tuple[Kind, str], tuple[float, Found]] = OrderedDict()

    def agent(self, key: ApiKey, name: str) -> None:
        """An agent a request names, to start something with: 404 when the config has no
        such agent, 403 when the key is not scoped to it."""
        if name not in self.settings.agents:
            raise ApiError(404, f"no agent named {name!r}")
        if not key.may_use(name):
            raise ApiError(403, f"this key may not use agent {name!r}")

    async def workflow(
        self, key: ApiKey, kind: Kind, workflow_id: str, *, recent: bool = False
    ) -> Found:
        """The turn or session ``workflow_id``: 404 when there is none (or the id names a
        workflow of another kind), 403 when it is an agent's the key is not scoped to.

        ``recent``: a description up to ``RECENT_SECONDS`` old will do (for a stream, whose
        feed follows the workflow anyway): a thousand watchers connecting at once then cost
        Temporal one describe, not a thousand. The key's scope is checked every time."""
        if not workflow_id or len(workflow_id) > 1000:
            raise ApiError(404, f"no {kind} {workflow_id!r}")
        found = self._recent.get((kind, workflow_id)) if recent else None
        if found is None or time.monotonic() - found[0] > RECENT_SECONDS:
            found = (time.monotonic(), await self._describe(kind, workflow_id))
            self._recent[(kind, workflow_id)] = found
            self._recent.move_to_end((kind, workflow_id))
            while len(self._recent) > _AGENTS_KEPT:
                self._recent.popitem(last=False)
        if not key.may_use(found[1].agent):
            raise ApiError(403, f"this key may not use the agent of {kind} {workflow_id!r}")
        return found[1]

    async def _describe(self, kind: Kind, workflow_id: str) -> Found:
        handle = self.client.get_workflow_handle(workflow_id)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise ApiError(404, f"no {kind} {workflow_id!r}") from None
            raise
        if described.workflow_type != _TYPES[kind]:
            raise ApiError(404, f"no {kind} {workflow_id!r}")
        agent = await self.agent_of(kind, described)
        if agent is None:
            raise ApiError(403, f"{kind} {workflow_id!r} names no agent this gateway serves")
        return Found(workflow_id=workflow_id, agent=agent, description=described)

    async def agent_of(self, kind: Kind, described: WorkflowExecutionDescription) -> str | None:
        """The agent a turn or session is of: its `TurnkeepAgent` search attribute, else the
        agent its start input named; None when neither names one."""
        agent = described.typed_search_attributes.get(visibility.AGENT)
        if agent:
            return agent
        known = self._agents.get(described.id)
        if known is not None:
            return known
        # A namespace without turnkeep's search attributes: the agent its start input named.
        found = await start_agent(self.client, described)
        if found is not None:
            self._agents[described.id] = found
            while len(self._agents) > _AGENTS_KEPT:
                self._agents.popitem(last=False)
        return found
