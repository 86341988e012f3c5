"""fast-agent's ``RequestParams``, as an agent's ``request_params`` (``turnkeep.Agent``,
``@fast.agent``): the fields turnkeep honours become the agent's own options; the rest are
accepted at fast-agent's defaults, and one set to anything else is an error that names it, or,
where it cannot change what the model says or which tools run, a documented ignore.

Fields as in fast-agent's ``fast_agent.llm.request_params`` (and MCP's
``CreateMessageRequestParams`` it extends, whose camelCase names fast-agent also accepts) at
``FAST_AGENT_COMMIT``.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

# RequestParams field -> the agent option it sets.
HONOURED: dict[str, str] = {
    "model": "model",
    "max_tokens": "max_tokens",
    "max_iterations": "max_iterations",
    "parallel_tool_calls": "parallel_tool_calls",
    "temperature": "temperature",
    "use_history": "use_history",
}

# Accepted whatever their value: they steer fast-agent's console, MCP sampling or one
# provider (TensorZero's templates), none of which a turnkeep turn has.
IGNORED: frozenset[str] = frozenset(
    {
        "messages",
        "meta",
        "model_preferences",
        "include_context",
        "metadata",
        "template_vars",
        "emit_loop_progress",
        "streaming_timeout",
        "batch_context",
        "task",
    }
)

# Refused unless left at fast-agent's default, with what to do instead: each would change
# what the model is asked or how its tools run, and turnkeep does not do it.
REFUSED: dict[str, str] = {
    "system_prompt": "give the agent's `instruction` instead",
    "stop_sequences": "turnkeep sends no stop sequences",
    "tools": "name servers in `servers` and filter them with `tool_filter`",
    "tool_choice": "turnkeep lets the model choose its tools",
    "response_format": "turnkeep has no structured output",
    "structured_schema": "turnkeep has no structured output",
    "structured_tool_policy": "turnkeep has no structured output",
    "sampling_tool_choice": "turnkeep offers a sampling request's model call no tools",
    "mcp_metadata": "turnkeep sends its own idempotency key as a tool call's _meta",
    "tool_execution_handler": "use hooks (`hooks=`) or approval to act on tool calls",
    "tool_result_mode": "tool results always go back to the model (`postprocess`)",
    "top_p": "turnkeep does not send it",
    "top_k": "turnkeep does not send it",
    "min_p": "turnkeep does not send it",
    "presence_penalty": "turnkeep does not send it",
    "frequency_penalty": "turnkeep does not send it",
    "repetition_penalty": "turnkeep does not send it",
    "service_tier": "turnkeep does not send it",
}


def _alias(snake: str, camel: str) -> Any:
    return Field(default=None, validation_alias=AliasChoices(snake, camel))


class RequestParams(BaseModel):
    """fast-agent's ``RequestParams``: ``RequestParams(maxTokens=2048, max_iterations=20,
    parallel_tool_calls=False, temperature=0.2)`` gives an agent those options. See
    ``HONOURED``, ``IGNORED`` and ``REFUSED`` for what each field does here."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, arbitrary_types_allowed=True)

    # honoured
    model: str | None = None
    max_tokens: int | None = Field(
        default=None, gt=0, validation_alias=AliasChoices("max_tokens", "maxTokens")
    )
    max_iterations: int | None = Field(default=None, gt=0)
    parallel_tool_calls: bool = True
    temperature: float | None = None
    use_history: bool = True
    # ignored
    messages: list[Any] = Field(default_factory=list)
    meta: Any = None
    model_preferences: Any = _alias("model_preferences", "modelPreferences")
    include_context: Any = _alias("include_context", "includeContext")
    metadata: dict[str, Any] | None = None
    template_vars: dict[str, Any] = Field(default_factory=dict)
    emit_loop_progress: bool = False
    streaming_timeout: float | None = None
    batch_context: Any = None
    task: Any = None
    # refused unless at fast-agent's default
    system_prompt: str | None = _alias("system_prompt", "systemPrompt")
    stop_sequences: list[str] | None = _alias("stop_sequences", "stopSequences")
    tools: list[Any] | None = None
    tool_choice: Any = _alias("tool_choice", "toolChoice")
    response_format: Any = None
    structured_schema: dict[str, Any] | None = None
    structured_tool_policy: str = "auto"
    sampling_tool_choice: str | None = None
    mcp_metadata: dict[str, Any] | None = None
    tool_execution_handler: Any = None
    tool_result_mode: str = "postprocess"
    top_p: float | None = _alias("top_p", "topP")
    top_k: int | None = _alias("top_k", "topK")
    min_p: float | None = _alias("min_p", "minP")
    presence_penalty: float | None = _alias("presence_penalty", "presencePenalty")
    frequency_penalty: float | None = _alias("frequency_penalty", "frequencyPenalty")
    repetition_penalty: float | None = _alias("repetition_penalty", "repetitionPenalty")
    service_tier: str | None = None

    @model_validator(mode="after")
    def _refuse_what_turnkeep_cannot_do(self) -> RequestParams:
        for name, instead in REFUSED.items():
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                raise ValueError(f"RequestParams.{name} is not supported by turnkeep: {instead}")
        return self

    def agent_options(self) -> dict[str, Any]:
        """The agent options the fields set explicitly give."""
        return {
            HONOURED[name]: getattr(self, name) for name in self.model_fields_set & HONOURED.keys()
        }
