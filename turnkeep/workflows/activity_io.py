"""What crosses the workflow/activity boundary. Names of activities live here too, so workflow
code can call them without importing the (I/O-heavy) modules that implement them."""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar, cast

from pydantic import BaseModel, Field, PrivateAttr

from turnkeep.workflows.approval import ApprovalPlan
from turnkeep.workflows.messages import CallToolResult, Message, StopReason, estimate_chars
from turnkeep.workflows.turn_io import TurnOverrides, Usage

PREPARE_TURN = "prepare_turn"
LIST_TOOLS = "list_tools"
LLM_STEP = "llm_step"
CALL_TOOL = "call_tool"
RUN_HOOK = "run_hook"
COMPACT_HISTORY = "compact_history"
# The query `llm_step` reads its input through (see LlmStepRequest).
MODEL_INPUT_QUERY = "model_input"


class Timeouts(BaseModel):
    """How long one kind of activity may take, and how it is retried."""

    start_to_close: float  # seconds
    heartbeat: float | None = None
    max_attempts: int = 5
    initial_interval: float = 1.0
    backoff: float = 2.0
    max_interval: float = 30.0


class PrepareTurnRequest(BaseModel):
    agent: str
    overrides: TurnOverrides


class HookPoint(StrEnum):
    """fast-agent's ToolRunner hook points."""

    BEFORE_LLM_CALL = "before_llm_call"
    AFTER_LLM_CALL = "after_llm_call"
    BEFORE_TOOL_CALL = "before_tool_call"
    AFTER_TOOL_CALL = "after_tool_call"
    AFTER_TURN_COMPLETE = "after_turn_complete"


class CompactionPlan(BaseModel):
    threshold_tokens: int  # compact when the estimated context reaches this
    keep_exchanges: int  # assistant exchanges kept verbatim besides the pending one


# Temporal's default limit on one payload (the server's blob size error limit).
TEMPORAL_PAYLOAD_LIMIT_BYTES = 2 * 1024 * 1024
# Well below Temporal's hard limits on one run's history (50 MB, 51,200 events) and under the
# levels at which it starts warning (10 MB, 10,240 events).
DEFAULT_CONTINUE_AS_NEW_BYTES = 8 * 1024 * 1024
DEFAULT_CONTINUE_AS_NEW_EVENTS = 8_000


class ContinueAsNewPlan(BaseModel):
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


class VisibilityPlan(BaseModel):
    """What the turn publishes for operators beyond activity summaries
    (turnkeep/workflows/visibility.py): decided by the worker that prepared the turn and
    recorded with the plan, so the commands it implies replay identically."""

    # Turnkeep search attributes the namespace has registered (checked at worker start); only
    # these are upserted, as upserting an unknown one would fail the workflow task.
    search_attributes: list[str] = Field(default_factory=list)
    # Seconds of workflow time between two upserts in the middle of a turn (0: every answer).
    search_attribute_interval: float = 0.0


# Tools are named `server__tool` and split on the first separator.
TOOL_SEPARATOR = "__"


class TurnPlan(BaseModel):
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

    def tool_task_queue(self, tool: str) -> str | None:
        """Where a call of ``tool`` (``server__tool``) runs (None: the turn's own queue)."""
        return self.tool_task_queues.get(tool.partition(TOOL_SEPARATOR)[0])


class ToolSpec(BaseModel):
    name: str  # namespaced: server__tool
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolsRequest(BaseModel):
    agent: str
    # Which of the agent's servers to list (those on the task queue it was sent to); None: all.
    servers: list[str] | None = None


class ToolCatalog(BaseModel):
    tools: list[ToolSpec]


class LlmRequest(BaseModel):
    """Everything a provider needs for one model call: the conversation as the model sees it,
    the tools on offer and the request parameters."""

    agent: str
    model: str
    call_index: int  # 1-based number of this model call within the turn
    instruction: str | None
    messages: list[Message]
    tools: list[ToolSpec]
    structured_output: dict[str, Any] | None = None
    temperature: float | None = None
    max_tokens: int | None = None


@dataclass(frozen=True)
class RequestJson:
    """An ``LlmRequest`` as JSON: everything but the messages, and each message on its own
    with its sha256. Its digest is taken over those parts, so a conversation that grows by a
    message costs one message's dump and hash, not the whole conversation's again."""

    header: str  # the request's JSON without "messages"
    messages: tuple[tuple[str, str], ...]  # (sha256, JSON) per message, in order

    @classmethod
    def of(cls, request: LlmRequest) -> RequestJson:
        return MessageJson().request_json(request)

    def digest(self) -> str:
        parts = [self.header, *(sha for sha, _ in self.messages)]
        return _sha256("\n".join(parts))

    def chars(self) -> int:
        return len(self.header) + sum(len(text) for _, text in self.messages)

    def parse(self, message: Callable[[str, str], Message] | None = None) -> LlmRequest:
        """The request, each message parsed by ``message(sha256, JSON)`` (which may answer
        from a cache) or else on its own."""
        parse_message = message or _parse_message
        request = LlmRequest.model_validate_json(f'{self.header[:-1]},"messages":[]}}')
        request.messages = [parse_message(sha, text) for sha, text in self.messages]
        return request


def _parse_message(sha256: str, text: str) -> Message:
    del sha256
    return Message.model_validate_json(text)


class MessageJson:
    """Each message's JSON and sha256, and its size for token estimates, worked out once per
    message object over a turn's model calls. This relies on a message never being changed in
    place once it is in the conversation (``TurnState`` replaces one instead); each call keeps
    only the entries of its own messages, each with the message itself, so an id is never
    mistaken for another's.

    It trades memory for CPU: a turn cached on a worker holds its conversation's JSON next to
    the messages, where dumping the whole conversation for every model call would make a
    turn's CPU grow with the square of its length. A turn whose calls await a person's
    decision drops it (``TurnWorkflow._approve``): it may wait for hours, and it pays one
    dump of its conversation afterwards."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[Message, str, str]] = {}
        self._estimates: dict[int, tuple[Message, int]] = {}

    def estimate_tokens(self, messages: list[Message]) -> int:
        """``messages.estimate_tokens``: the same number, measuring only new messages."""
        kept: dict[int, tuple[Message, int]] = {}
        chars = 0
        for message in messages:
            entry = self._estimates.get(id(message))
            if entry is None or entry[0] is not message:
                entry = (message, estimate_chars(message))
            kept[id(message)] = entry
            chars += entry[1]
        self._estimates = kept
        return chars // 4

    def request_json(self, request: LlmRequest) -> RequestJson:
        kept: dict[int, tuple[Message, str, str]] = {}
        parts: list[tuple[str, str]] = []
        for message in request.messages:
            entry = self._by_id.get(id(message))
            if entry is None or entry[0] is not message:
                text = message.model_dump_json()
                entry = (message, _sha256(text), text)
            kept[id(message)] = entry
            parts.append(entry[1:])
        self._by_id = kept
        return RequestJson(
            header=request.model_dump_json(exclude={"messages"}), messages=tuple(parts)
        )


class LlmStepRequest(BaseModel):
    """The input of ``llm_step``: a reference to the ``LlmRequest``, not a copy.

    Copying the conversation into every model call's input would record it again on each
    iteration, so workflow history would grow with the square of the turn's length. The
    conversation is recorded once (turn input, activity results); ``llm_step`` reads the
    request it should make through a query of the running workflow, and checks the digest so
    it can only ever send exactly what the workflow meant."""

    agent: str
    model: str
    call_index: int
    workflow_id: str
    run_id: str
    digest: str  # request_digest() of the LlmRequest

    # The request as JSON parts, in this process's memory only (a private attribute is never
    # serialized): the worker that schedules the call hands them to ``llm_step`` without
    # dumping the conversation again (turnkeep/activities/model_activity.py).
    _request_json: RequestJson | None = PrivateAttr(default=None)

    @classmethod
    def referencing(
        cls,
        request: LlmRequest,
        *,
        workflow_id: str,
        run_id: str,
        messages: MessageJson | None = None,
    ) -> LlmStepRequest:
        """The reference to ``request`` in this workflow run. With the turn's ``messages``
        (kept across its model calls), only messages new since the last call are dumped."""
        request_json = (messages or MessageJson()).request_json(request)
        step = cls(
            agent=request.agent,
            model=request.model,
            call_index=request.call_index,
            workflow_id=workflow_id,
            run_id=run_id,
            digest=request_json.digest(),
        )
        step._request_json = request_json
        return step

    def pop_request_json(self) -> RequestJson | None:
        """The request's JSON, once, on the worker that built this reference (None elsewhere):
        afterwards the step holds only the reference, however long the SDK keeps it."""
        request_json, self._request_json = self._request_json, None
        return request_json


M = TypeVar("M", bound=BaseModel)


class SharedValues:
    """One object per distinct value across the turns of a worker process: the plan and the
    tools of every turn of an agent are the same (an instruction, tool descriptions and JSON
    schemas: often tens of KB), and a worker may cache thousands of turns that wait for a
    person, each of which would otherwise hold its own copy. Sound only for values never
    changed in place (turnkeep replaces a plan or a tool, it never edits one), and equal by
    their JSON: the shared one is then the same on replay as the one it stands for. Held
    weakly: a value goes once no turn holds it (a one-off override's plan, a tool no longer
    listed).

    ``turnkeep.workflows`` passes through the sandbox (``turnkeep/worker/workflow_runner.py``),
    so this is one table per process. Workflow tasks run on several threads: a race costs at
    most one value not shared."""

    def __init__(self) -> None:
        self._by_json: weakref.WeakValueDictionary[tuple[type[BaseModel], str], BaseModel] = (
            weakref.WeakValueDictionary()
        )

    def __call__(self, value: M) -> M:
        # Keyed by the class too: what comes back is of ``value``'s class.
        return cast(M, self._by_json.setdefault((type(value), value.model_dump_json()), value))

    def __len__(self) -> int:
        return len(self._by_json)


shared = SharedValues()


def request_digest(request: LlmRequest) -> str:
    return RequestJson.of(request).digest()


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# Query answers are payloads too: pages stay below the external-storage threshold, so reading
# the conversation never writes a copy of it anywhere.
MODEL_INPUT_PAGE_BYTES = 192 * 1024


class ModelInputPage(BaseModel):
    """Part of an ``LlmRequest``: the first page has everything but later messages; the
    others only ``messages[start:...]``."""

    request: LlmRequest
    total_messages: int


def model_input_page(request: LlmRequest, start: int) -> ModelInputPage:
    """The page of ``request`` that begins at message ``start`` (always at least one)."""
    end, size = start, 0
    while end < len(request.messages) and (end == start or size < MODEL_INPUT_PAGE_BYTES):
        size += len(request.messages[end].model_dump_json())
        end += 1
    update: dict[str, Any] = {"messages": request.messages[start:end]}
    if start > 0:
        update["tools"] = []
        update["instruction"] = None
    return ModelInputPage(
        request=request.model_copy(update=update), total_messages=len(request.messages)
    )


class ToolCallRequest(BaseModel):
    agent: str
    call_id: str
    name: str  # namespaced
    arguments: dict[str, Any]


class ToolCallOutcome(BaseModel):
    result: CallToolResult
    duration_ms: float


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
