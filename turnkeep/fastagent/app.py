"""fast-agent's decorator form, as a thin collector of ``turnkeep.Agent``s: a fast-agent
``agent.py`` keeps its ``fast = FastAgent(...)`` and ``@fast.agent(...)`` lines with one import
changed, and a worker serves the agents it declares::

    from turnkeep.fastagent.app import FastAgent, RequestParams

    fast = FastAgent("researcher")

    @fast.agent(
        name="researcher",
        instruction="Answer from the web, citing sources.",
        servers=["fetch"],
        model="sonnet",
        request_params=RequestParams(maxTokens=4096, max_iterations=20),
    )
    async def main() -> None: ...

    async with fast.workers(client):  # or Worker(..., plugins=[fast.plugin()]) of your own
        ...

The decorated function is returned unchanged: turnkeep runs the agent's turns on a worker
rather than in the function, so ``fast.run()`` and the interactive console have no
counterpart; start turns with ``turnkeep.start_turn`` or ``turnkeep run``. fast-agent's
workflow agents (``chain``, ``parallel``, ``router``, ``evaluator_optimizer``, ``maker``,
``orchestrator``, ``iterative_planner``) are declared by their decorators too, each step a
child turn; custom agent classes are refused with a message, not collected wrongly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from turnkeep.config.agents import Agent, Tool
from turnkeep.config.settings import Settings
from turnkeep.fastagent.request_params import RequestParams

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["FastAgent", "RequestParams"]

F = TypeVar("F", bound=Callable[..., Any])

# fast-agent's default instruction, without its `{{serverInstructions}}`-style templates, which
# turnkeep does not expand.
DEFAULT_INSTRUCTION = "You are a helpful AI Agent."

# `@fast.agent` arguments turnkeep has no counterpart for, with their "off" value: accepted at
# it, refused otherwise.
_UNSUPPORTED: dict[str, Any] = {
    "resources": None,
    "prompts": None,
    "skills": None,
    "save_trajectory": False,
    "human_input": False,
    "shell": False,
    "cwd": None,
    "subagents": None,
    "subagent_model": None,
    "harness_tools": False,
    "elicitation_handler": None,
    "api_key": None,  # keys live in the worker's configuration only
    "history_source": None,
    "history_merge_target": None,
    "child_timeout_sec": None,
    "max_display_instances": None,
}


class FastAgent:
    """fast-agent's application object, collecting the agents its decorators declare.
    ``config_path`` is the configuration file, as ``turnkeep worker --config`` takes it
    (default: ``./turnkeep.yaml``, else fast-agent's own files, found as fast-agent finds
    them); fast-agent's other constructor arguments steer its command line and console and
    are accepted and ignored."""

    def __init__(self, name: str = "fast-agent", config_path: str | Path | None = None, **_: Any):
        self.name = name
        self.config_path = Path(config_path) if config_path is not None else None
        # Agent arguments, built into Agents when asked for: `@fast.tool`s registered after
        # an agent still reach it, as in fast-agent.
        self._declared: dict[str, tuple[dict[str, Any], bool]] = {}
        self._tools: list[Tool] = []
        self._client_tools: list[Tool] = []

    @property
    def agents(self) -> list[Agent]:
        """The agents declared so far; those without ``function_tools`` get the ``@fast.tool``
        functions, as in fast-agent."""
        return [
            Agent(**arguments)
            if explicit
            else Agent(**{**arguments, "tools": self._tools, "client_tools": self._client_tools})
            for arguments, explicit in self._declared.values()
        ]

    def tool(
        self,
        function: F | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        client_side: bool = False,
    ) -> Any:
        """``@fast.tool``: a Python function every agent without ``function_tools`` gets. The
        model sees it by its ``__name__`` and docstring (``name``/``description`` overrides are
        not supported). With ``client_side=True`` the function is never called: the model sees
        it as ``client__<name>``, and a client submits each call's result (its return type, when
        an object, is the output schema the result must match)."""
        if name is not None or description is not None:
            raise ValueError("@fast.tool(name=..., description=...) is not supported by turnkeep")

        def register(fn: F) -> F:
            (self._client_tools if client_side else self._tools).append(fn)
            return fn

        return register(function) if function is not None else register

    def agent(
        self,
        name: str = "default",
        instruction_or_kwarg: str | Path | None = None,
        *,
        instruction: str | Path = DEFAULT_INSTRUCTION,
        servers: Sequence[str] | None = None,
        tools: dict[str, list[str]] | None = None,
        function_tools: Sequence[Tool] | None = None,
        model: str | None = None,
        use_history: bool = True,
        request_params: RequestParams | None = None,
        default: bool = False,
        agents: Sequence[str] | None = None,
        max_parallel: int | None = None,
        description: str | None = None,
        **unsupported: Any,
    ) -> Callable[[F], F]:
        """``@fast.agent(...)``: an agent with fast-agent's arguments and meanings. ``tools``
        is fast-agent's filter (server -> tool names); ``function_tools`` are Python
        functions; an ``instruction`` given as a ``Path`` is read from that file; ``agents``
        are offered to the model as tools (``agent__<name>``), each call running that agent's
        turn as a child workflow, at most ``max_parallel`` at once. ``default`` has no meaning
        here (a turn names its agent)."""
        for key, value in unsupported.items():
            if key not in _UNSUPPORTED:
                raise TypeError(f"@fast.agent() got an unexpected argument {key!r}")
            if value != _UNSUPPORTED[key]:
                raise ValueError(f"@fast.agent({key}=...) is not supported by turnkeep")
        text = instruction_or_kwarg if instruction_or_kwarg is not None else instruction
        if isinstance(text, Path):
            text = text.read_text(encoding="utf-8")
        options: dict[str, Any] = {}
        if not use_history:  # the default, True, leaves request_params' say
            options["use_history"] = False
        if model is not None:
            options["model"] = model
        arguments: dict[str, Any] = dict(
            name=name,
            instruction=text,
            servers=list(servers or []),
            tools=list(function_tools or []),
            tool_filter=tools,
            request_params=request_params,
            agents=list(agents or []),
            max_parallel=max_parallel,
            description=description,
            **options,
        )
        return self._declare(arguments, explicit_tools=function_tools is not None)

    def chain(
        self,
        name: str,
        *,
        sequence: Sequence[str],
        instruction: str | Path | None = None,
        cumulative: bool = False,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.chain(...)``: the agents of ``sequence`` one after another, each a child
        turn given the previous one's answer (``cumulative``: every earlier answer)."""
        arguments = dict(name=name, type="chain", sequence=list(sequence), cumulative=cumulative)
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def parallel(
        self,
        name: str,
        *,
        fan_out: Sequence[str],
        fan_in: str | None = None,
        instruction: str | Path | None = None,
        include_request: bool = True,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.parallel(...)``: the agents of ``fan_out`` at once, each a child turn, and
        their answers to ``fan_in`` (without one, the answers are the result)."""
        arguments = dict(
            name=name,
            type="parallel",
            fan_out=list(fan_out),
            fan_in=fan_in,
            include_request=include_request,
        )
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def router(
        self,
        name: str,
        *,
        agents: Sequence[str],
        instruction: str | Path | None = None,
        model: str | None = None,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.router(...)``: the router's model picks one of ``agents`` for each message,
        and that agent's turn (a child turn) answers. ``instruction``, when given, is the
        routing prompt's template, with ``{context}`` where the agents' cards go."""
        arguments: dict[str, Any] = dict(name=name, type="router", agents=list(agents))
        if model is not None:
            arguments["model"] = model
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def evaluator_optimizer(
        self,
        name: str,
        *,
        generator: str,
        evaluator: str,
        min_rating: str = "GOOD",
        max_refinements: int = 3,
        refinement_instruction: str | None = None,
        instruction: str | Path | None = None,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.evaluator_optimizer(...)``: ``generator`` answers and ``evaluator`` rates
        the answer, refining until ``min_rating`` or ``max_refinements``, each a child turn."""
        arguments: dict[str, Any] = dict(
            name=name,
            type="evaluator_optimizer",
            generator=generator,
            evaluator=evaluator,
            min_rating=min_rating,
            max_refinements=max_refinements,
            refinement_instruction=refinement_instruction,
        )
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def maker(
        self,
        name: str,
        *,
        worker: str,
        k: int = 3,
        max_samples: int = 50,
        match_strategy: str = "exact",
        red_flag_max_length: int | None = None,
        instruction: str | Path | None = None,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.maker(...)``: MAKER's first-to-ahead-by-``k`` vote over ``worker``'s
        answers, each sample a child turn."""
        arguments: dict[str, Any] = dict(
            name=name,
            type="maker",
            worker=worker,
            k=k,
            max_samples=max_samples,
            match_strategy=match_strategy,
            red_flag_max_length=red_flag_max_length,
        )
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def orchestrator(
        self,
        name: str,
        *,
        agents: Sequence[str],
        instruction: str | Path | None = None,
        model: str | None = None,
        plan_type: str = "full",
        plan_iterations: int = 5,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.orchestrator(...)``: the planner's model plans one step at a time, tasks for
        ``agents`` (each a child turn), at most ``plan_iterations`` steps; then it answers."""
        return self._planner(
            name, "orchestrator", agents, instruction, model, plan_iterations, plan_type
        )

    def iterative_planner(
        self,
        name: str,
        *,
        agents: Sequence[str],
        instruction: str | Path | None = None,
        model: str | None = None,
        plan_iterations: int = -1,
        default: bool = False,
    ) -> Callable[[F], F]:
        """``@fast.iterative_planner(...)``: as ``orchestrator``, with fast-agent's iterative
        planning prompt; by default until the planner says the objective is met."""
        return self._planner(name, "iterative_planner", agents, instruction, model, plan_iterations)

    def _planner(
        self,
        name: str,
        kind: str,
        agents: Sequence[str],
        instruction: str | Path | None,
        model: str | None,
        plan_iterations: int,
        plan_type: str = "full",
    ) -> Callable[[F], F]:
        arguments: dict[str, Any] = dict(
            name=name,
            type=kind,
            agents=list(agents),
            plan_iterations=plan_iterations,
            plan_type=plan_type,
        )
        if model is not None:
            arguments["model"] = model
        return self._declare(_with_instruction(arguments, instruction), explicit_tools=True)

    def _declare(self, arguments: dict[str, Any], *, explicit_tools: bool) -> Callable[[F], F]:
        Agent(**arguments)  # its errors now, at the decorator
        name = arguments["name"]
        if name in self._declared:
            raise ValueError(f"agent {name!r} is declared twice")
        self._declared[name] = (arguments, explicit_tools)

        def register(function: F) -> F:
            return function

        return register

    def settings(self) -> Settings:
        """The worker's configuration, loaded as ``turnkeep worker`` loads it."""
        from turnkeep.config.files import load_settings

        return load_settings(self.config_path)

    def plugin(self, settings: Settings | None = None, **options: Any) -> Any:
        """A ``TurnkeepPlugin`` serving these agents, from ``settings`` (default:
        ``self.settings()``); ``options`` go to ``TurnkeepPlugin``."""
        from turnkeep.worker.plugin import TurnkeepPlugin

        return TurnkeepPlugin(settings or self.settings(), agents=self.agents, **options)

    def workers(self, client: Client, settings: Settings | None = None, **options: Any) -> Any:
        """The workers ``turnkeep worker`` runs for these agents (``build_workers``): on the
        task queue and on each agent's own queue, where ``turnkeep.start_turn`` starts their
        turns. Run them with ``async with``; ``options`` go to ``build_workers``."""
        from turnkeep.worker.build import build_workers

        return build_workers(client, settings or self.settings(), agents=self.agents, **options)

    # fast-agent's workflows and runtime, which turnkeep does not have.

    def _refuse(self, what: str) -> NoReturn:
        raise NotImplementedError(
            f"turnkeep does not implement fast-agent's {what}; see docs/fast-agent.md"
        )

    def custom(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._refuse("custom agent classes")

    def run(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise NotImplementedError(
            "turnkeep runs agents on a worker, not in fast.run(): serve them with "
            "`async with fast.workers(client): ...` and start turns with "
            "turnkeep.start_turn or `turnkeep run`"
        )


def _with_instruction(arguments: dict[str, Any], instruction: str | Path | None) -> dict[str, Any]:
    if isinstance(instruction, Path):
        instruction = instruction.read_text(encoding="utf-8")
    return {**arguments, "instruction": instruction} if instruction is not None else arguments
