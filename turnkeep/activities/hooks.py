"""The ``run_hook`` activity: fast-agent's ToolRunner hooks, as named Python callables.

A hook is registered on the worker by name (``hooks:`` in turnkeep.yaml as import paths, or
``build_worker(hooks=...)``) and enabled per agent and hook point. It receives a
``HookContext`` and returns a ``HookChange`` (or None, or a dict of one): messages to append,
messages to replace the turn's delta with, or a stop reason that ends the turn. It runs as an
activity, so it may do I/O, and it is retried like one.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from temporalio import activity

from turnkeep.config.catalog import AgentCatalog
from turnkeep.contract.activity_io import RUN_HOOK, HookChange, HookContext, HookRequest
from turnkeep.errors import config_error, known, require_workflow

Hook = Callable[[HookContext], "HookChange | dict[str, Any] | Awaitable[Any] | None"]
"""A hook: sync (run in a thread) or async, returning a HookChange, a dict of one, or None."""


class HookActivities:
    def __init__(self, agents: AgentCatalog, hooks: Mapping[str, Hook]) -> None:
        self._agents = agents
        self._hooks = dict(hooks)

    @activity.defn(name=RUN_HOOK)
    async def run_hook(self, request: HookRequest) -> HookChange:
        require_workflow()
        point, name = request.context.hook_point, request.context.agent
        # A hook may do anything its code does: run only what the named agent enables there.
        enabled = self._agents.agent(name).hooks.get(point, [])
        if request.hook not in enabled:
            raise config_error(
                "HookNotEnabled",
                f"Agent {name!r} does not run hook {request.hook!r} at {point} "
                f"(it enables there: {known(enabled)}).",
            )
        hook = self._hooks.get(request.hook)
        if hook is None:
            raise config_error(
                "UnknownHook",
                f"Hook {request.hook!r} is not registered on this worker "
                f"(registered: {known(self._hooks)}).",
            )
        if inspect.iscoroutinefunction(hook):
            answer = await hook(request.context)
        else:
            # A plain function may block (file or network I/O): keep it off the event loop
            # that every other activity on this worker shares.
            answer = await asyncio.to_thread(hook, request.context)
        return HookChange.model_validate(answer or {})
