"""What crosses the workflow/activity boundary. Names of activities live here too, so workflow
code can call them without importing the (I/O-heavy) modules that implement them."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from turnkeep.contract.approval import ApprovalPlan
from turnkeep.contract.compact import Compact
from turnkeep.contract.messages import CallToolResult, Message, StopReason
from turnkeep.contract.server_requests import (
    MAX_SERVER_REQUESTS,
    ServerAnswer,
    ServerRequest,
    ServerRequestPlan,
)
from turnkeep.contract.turn_io import (
    BudgetLimit,
    BudgetUnit,
    TaskPriority,
    TenantName,
    TurnOverrides,
    Usage,
)

PREPARE_TURN = "prepare_turn"
LIST_TOOLS = "list_tools"
LLM_STEP = "llm_step"
CALL_TOOL = "call_tool"
RUN_HOOK = "run_hook"
COMPACT_HISTORY = "compact_history"


class Timeouts(Compact):
    """How long one kind of activity may take, and how it is retried."""

    start_to_close: float  # seconds
    heartbeat: float | None = None
    max_attempts: int = 5
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 30.0


class PrepareTurnRequest(Compact):
    agent: str
    overrides: TurnOverrides
    depth: int = 0  # `TurnInput.depth`: checked against the worker's `max_agent_depth`
    budget: BudgetLimit | None = None  # `TurnInput.budget`: at most the agent's
    priority: TaskPriority | None = None  # `TurnInput.priority`: at most the agent's
    tenant: TenantName | None = None  # `TurnInput.tenant`: the turn's fairness key


class BudgetPlan(Compact):
    """The turn's budget (``workflows.waits.budget_raise`` checks it before each model call)."""

    unit: BudgetUnit
    limit: float  # in `unit`: the turn's, or the session's for a budget per session
    per: Literal["turn", "session"] = "turn"
    on_exceeded: Literal["ask", "stop"] = "ask"
    # The most a person may raise the budget to (None: no ceiling).
    max_raise: float | None = None
    timeout: float = 86400.0  # seconds a budget wait lasts; then the turn stops
    # USD per input token of the turn's models (the dearest), for a USD budget's estimate of
    # what the next call's input will cost; None: the estimate counts only what is spent.
    input_usd_per_token: float | None = None


class HookPoint(StrEnum):
    """fast-agent's ToolRunner hook points."""

    BEFORE_LLM_CALL = "before_llm_call"
    AFTER_LLM_CALL = "after_llm_call"
    BEFORE_TOOL_CALL = "before_tool_call"
    AFTER_TOOL_CALL = "after_tool_call"
    AFTER_TURN_COMPLETE = "after_turn_complete"


class CompactionPlan(Compact):
    threshold_tokens: int  # compact when the estimated context reaches this
    keep_exchanges: int  # assistant exchanges kept verbatim besides the pending one


# Temporal's default limit on one payload (the server's blob size error limit).
PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
# Room for what wraps a message or a tool result in a payload: a result, a carried state.
PAYLOAD_ENVELOPE_BYTES = 64 * 1024
# Well below Temporal's hard limits on one run's history (50 MB, 51,200 events) and under the
# levels at which it starts warning (10 MB, 10,240 events).
DEFAULT_CONTINUE_AS_NEW_BYTES = 8 * 1024 * 1024
DEFAULT_CONTINUE_AS_NEW_EVENTS = 8_000


class ContinueAsNewPlan(Compact):
    """When a run of the turn hands over to a fresh one (continue-as-new), between two steps."""

    # Continue once this run's history reaches either size; None leaves that measure out.
    history_bytes: int | None = DEFAULT_CONTINUE_AS_NEW_BYTES
    history_events: int | None = DEFAULT_CONTINUE_AS_NEW_EVENTS
    # Also when the Temporal server suggests it (its own limits, in its dynamic config).
    when_suggested: bool = True
    # Set when payload storage is off: the new run's input (the turn and the state carried
    # over) is then recorded inline, and one over Temporal's payload limit would fail every
    # attempt to continue; such a turn goes on in the same run instead. None: large payloads
    # go to external storage, so any size can be carried.
    max_carried_bytes: int | None = None


class VisibilityPlan(Compact):
    """What the turn publishes for operators beyond activity summaries
    (``turnkeep.workflows.visibility``): decided by the worker that prepared the turn and
    recorded with the plan, so the commands it implies replay identically."""

    # Turnkeep search attributes the namespace has registered (checked at worker start); only
    # these are upserted, as upserting an unknown one would fail the workflow task.
    search_attributes: list[str] = Field(default_factory=list)
    # Seconds of workflow time between two upserts in the middle of a turn (0: every answer).
    search_attribute_interval: float = 0.0


# Tools are named `server__tool` and split on the first separator.
TOOL_SEPARATOR = "__"


class ToolSpec(Compact):
    name: str  # namespaced: server__tool
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


# fast-agent's name for an agent offered as a tool: `agent__<name>`.
AGENT_TOOL_PREFIX = "agent__"


# A client-side tool's name: `client__<name>`. Its calls are answered by a client, never run on
# a worker, and the fixed prefix says so to the model's reader, the approval globs and any client
# (the CLI's prompt, the gateway) from the name alone, as `agent__` says an agent answers.
CLIENT_TOOL_PREFIX = "client__"


class ClientTool(Compact):
    """A client-side tool: offered to the model like any other (``spec``, named
    ``client__<name>``), its calls wait for a client to submit the result, which must match
    ``output_schema`` when there is one."""

    spec: ToolSpec
    output_schema: dict[str, Any] | None = None


class ClientToolsPlan(Compact):
    """An agent's client-side tools, and how long a call waits for its result."""

    tools: list[ClientTool]
    timeout: float  # seconds; then the call is denied, as an approval's timeout denies


# fast-agent's workflow agents, each run by a team of ``turnkeep.workflows.teams``: the kinds an
# agent's ``type`` may name besides a plain ``agent``.
TeamKind = Literal[
    "chain",
    "parallel",
    "router",
    "evaluator_optimizer",
    "maker",
    "orchestrator",
    "iterative_planner",
]


class AgentTool(Compact):
    """An agent that another agent's model may call as a tool: a call runs its turn as a child
    workflow, on ``task_queue``, where a worker that has the agent polls (the agent's own queue
    under ``build_workers``, else the calling turn's)."""

    spec: ToolSpec  # named `agent__<agent>`
    agent: str
    task_queue: str
    # The agent's `call: inline`: a call runs the agent's loop inside the calling turn's
    # workflow, its steps activities of the caller's (``inline_agent``).
    inline: bool = False


class TeamPlan(Compact):
    """A workflow agent's steps (fast-agent's workflow agents), each run as a child turn."""

    kind: TeamKind
    # A chain's sequence; a parallel's fan-out; a router's or a planner's agents; an
    # evaluator-optimizer's generator and evaluator; a maker's worker.
    steps: list[AgentTool]
    fan_in: AgentTool | None = None
    cumulative: bool = False
    include_request: bool = True
    min_rating: str = "GOOD"
    max_refinements: int = 3
    refinement_instruction: str | None = None
    k: int = 3
    max_samples: int = 50
    match_strategy: str = "exact"
    red_flag_max_length: int | None = None
    # A planner's steps at most; 0 or less: until its model says the objective is met.
    plan_iterations: int = 5


class TurnPlan(Compact):
    """The agent's settings with the turn's allowed overrides applied, resolved once on a worker
    and recorded in history, so the workflow itself never reads configuration."""

    agent: str
    model: str
    instruction: str | None = None
    max_iterations: int
    use_history: bool
    parallel_tool_calls: bool
    structured_output: dict[str, Any] | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    has_tools: bool
    llm: Timeouts
    tools: Timeouts
    # Hook names per point, in the order they run; empty means no hook activity at all.
    hooks: dict[HookPoint, list[str]] = Field(default_factory=dict)
    compaction: CompactionPlan | None = None
    continue_as_new: ContinueAsNewPlan = Field(default_factory=ContinueAsNewPlan)
    visibility: VisibilityPlan = Field(default_factory=VisibilityPlan)
    # The task queue each of the agent's tool servers is listed and called on (None: the
    # turn's own), in the agent's order; empty when every server is on the turn's queue (and in
    # plans recorded before this existed), which schedules the tool activities as before.
    tool_task_queues: dict[str, str | None] = Field(default_factory=dict)
    # Which tool calls wait for a person's decision; None: none do.
    approval: ApprovalPlan | None = None
    # The agents the model may call as tools, in the agent's order, and how many such calls
    # may run at once (None: all of a batch's).
    agent_tools: list[AgentTool] = Field(default_factory=list)
    max_parallel: int | None = None
    # How the turn answers what its MCP servers ask during a tool call (elicitation, sampling),
    # for the servers whose config allows any; empty: none does, and a request is declined.
    server_requests: dict[str, ServerRequestPlan] = Field(default_factory=dict)
    # Tools a client answers (None: none).
    client_tools: ClientToolsPlan | None = None
    # The config's `limits:` entry that governs each model of the turn's chain (the model and
    # its fallbacks), by model string; a model without one is absent and pays no limiter.
    limits: dict[str, str] = Field(default_factory=dict)

    # Set for a workflow agent: the turn runs these steps instead of the model loop.
    team: TeamPlan | None = None
    # What the turn may spend before it asks (or stops); None: no budget.
    budget: BudgetPlan | None = None
    # The models that answer, in order, a model call `model` fails for good (a final provider
    # error), and how many attempts a model of such a chain gets before the next one answers
    # (the last gets `llm.max_attempts`).
    fallback_models: list[str] = Field(default_factory=list)
    fallback_after_attempts: int = 2
    # The turn's effective task priority and fairness key (prepare_turn resolves them).
    priority: TaskPriority = "normal"
    fairness_key: str | None = None

    def agent_tool(self, tool: str) -> AgentTool | None:
        """The agent a call of ``tool`` runs, if it names one of the agent's agent tools."""
        return next((a for a in self.agent_tools if a.spec.name == tool), None)

    def client_tool(self, tool: str) -> ClientTool | None:
        """The client-side tool a call of ``tool`` names, if it names one."""
        tools = self.client_tools.tools if self.client_tools else []
        return next((t for t in tools if t.spec.name == tool), None)

    def tool_task_queue(self, tool: str) -> str | None:
        """Where a call of ``tool`` (``server__tool``) runs (None: the turn's own queue)."""
        return self.tool_task_queues.get(tool.partition(TOOL_SEPARATOR)[0])


class ToolsRequest(Compact):
    agent: str
    # Which of the agent's servers to list (those on the task queue it was sent to); None: all.
    servers: list[str] | None = None


class ToolCatalog(BaseModel):
    tools: list[ToolSpec]


class ToolCallRequest(Compact):
    agent: str
    call_id: str
    name: str  # namespaced
    arguments: dict[str, Any]
    # The answers to what the server asked on earlier runs of this call, in order: a run
    # answers each request the server makes again from here (``server_requests``).
    answers: list[ServerAnswer] = Field(default_factory=list, max_length=MAX_SERVER_REQUESTS)
    # The call of an agent run inline in this workflow (``inline_agent``) whose loop made this
    # one: its call ids are the called agent's, which may be the caller's too, so the tool's
    # idempotency key is scoped by it (the same key a child turn's call would have).
    scope: str | None = Field(default=None, max_length=1000)

    def server_plan(self, plan: TurnPlan) -> ServerRequestPlan | None:
        return plan.server_requests.get(self.name.partition(TOOL_SEPARATOR)[0])


class ToolCallOutcome(Compact):
    result: CallToolResult
    duration_ms: float
    # Set when the server asked something this run had no answer for: ``result`` is then
    # meaningless, and the call runs again once the workflow has the answer.
    needs_input: ServerRequest | None = None
    # What the run declined or cancelled at once, as the server's config says (recorded).
    declined: list[ServerRequest] = Field(default_factory=list)


class HookContext(BaseModel):
    """What a hook sees: fast-agent's runner state, as data."""

    hook_point: HookPoint
    agent: str
    model: str
    iteration: int
    messages: list[Message]  # this turn's messages so far (the delta)
    last_message: Message | None
    usage: dict[str, Usage]


class HookRequest(BaseModel):
    hook: str
    context: HookContext


class HookChange(BaseModel):
    """What a hook wants changed; the default changes nothing."""

    append: list[Message] = Field(default_factory=list)  # added to the turn's messages
    replace: list[Message] | None = None  # replaces the turn's messages (e.g. redaction)
    stop_reason: StopReason | None = None  # ends the turn with this stop reason


class CompactRequest(BaseModel):
    agent: str
    model: str
    messages: list[Message]  # the older part of the conversation, to summarise
