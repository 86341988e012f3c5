"""What crosses the workflow/activity boundary. Names of activities live here too, so workflow
code can call them without importing the (I/O-heavy) modules that implement them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from workflows.messages import CallToolResult, Message
from workflows.turn_io import TurnOverrides

PREPARE_TURN = "prepare_turn"
LIST_TOOLS = "list_tools"
LLM_STEP = "llm_step"
CALL_TOOL = "call_tool"

# Error types raised by activities that retrying cannot fix. The workflow fails the turn with
# them (configuration errors) or hands them to the model (tool errors), never retries them.
CONFIG_ERROR_TYPES = ("UnknownAgent", "UnknownModel", "OverrideNotAllowed", "ServerUnavailable")


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


class ToolSpec(BaseModel):
    name: str  # namespaced: server__tool
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class ToolsRequest(BaseModel):
    agent: str


class ToolCatalog(BaseModel):
    tools: list[ToolSpec]


class LlmRequest(BaseModel):
    agent: str
    model: str
    call_index: int  # 1-based number of this model call within the turn
    instruction: str | None
    messages: list[Message]
    tools: list[ToolSpec]
    structured_output: dict[str, Any] | None = None
    temperature: float | None = None
    max_tokens: int | None = None


class ToolCallRequest(BaseModel):
    agent: str
    call_id: str
    name: str  # namespaced
    arguments: dict[str, Any]


class ToolCallOutcome(BaseModel):
    result: CallToolResult
    duration_ms: float
