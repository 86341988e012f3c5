"""What an MCP server asks of the client during a tool call (MCP elicitation and sampling), as
the turn records it. Pure (pydantic and stdlib only): the tool activity, the workflow and any
client share these models.

A tool call never holds an activity while a person takes their time ("suspend and re-ask"):
when the server asks something the call's request has no answer for, the ``call_tool``
activity ends with ``ToolCallOutcome.needs_input``; the workflow waits for the answer (a
person's, or a model call's for sampling) like an approval, appends it to the call's
``answers`` and runs the call again. The re-run is answered from those answers, in order, as
long as the server asks the same things (same method, same request digest)."""

from __future__ import annotations

import math
from typing import Any, Literal

from turnkeep.contract.compact import Compact
from turnkeep.contract.messages import ContentBlock, Message, TextContent

ServerRequestKind = Literal["elicitation", "sampling"]
# fast-agent's elicitation modes: ask a person; cancel every request at once; none (the
# capability is not advertised, and a request that comes anyway is declined).
ElicitationMode = Literal["forms", "auto-cancel", "none"]
# How many of its server's requests one tool call may have answered: past this the call ends
# with an error result, so a server asking something new on every run cannot loop for ever.
MAX_SERVER_REQUESTS = 10
# Who declines what the agent's config does not allow (recorded in the audit trail).
SERVER_POLICY_DECIDER = "policy:mcp-server"
# The prompt a person sees is cut at this length; the request itself is kept whole.
_PROMPT_MAX_CHARS = 500


class SamplingRequest(Compact):
    """A server's ``sampling/createMessage`` as the model call it becomes: text messages only."""

    messages: list[Message]
    system_prompt: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None


class ServerRequest(Compact):
    """One request a server made during a tool call that the call had no answer for."""

    kind: ServerRequestKind
    # The request's sha256 (method and params, ``_meta`` left out), as the activity took it: a
    # re-run's request is answered by an answer with the same kind and digest.
    digest: str
    server: str
    # Elicitation: the message and the requested schema (form mode).
    message: str | None = None
    requested_schema: dict[str, Any] | None = None
    # Sampling: what the model is to be asked.
    sampling: SamplingRequest | None = None
    # Set only on a request the run declined at once (``ToolCallOutcome.declined``): why.
    reason: str | None = None

    def prompt(self) -> str:
        """What a person is asked, in one line."""
        if self.kind == "elicitation":
            text = self.message or ""
        else:
            asked = (
                self.sampling.messages[-1].text if self.sampling and self.sampling.messages else ""
            )
            text = f"{self.server} asks the model: {asked}"
        line = " ".join(text.split())
        return line if len(line) <= _PROMPT_MAX_CHARS else line[: _PROMPT_MAX_CHARS - 1] + "…"


class ServerAnswer(Compact):
    """The answer a re-run gives to a request matching ``kind`` and ``digest``: the MCP result,
    as JSON (an ``ElicitResult``: ``action`` and ``content``; a ``CreateMessageResult``:
    ``role``, ``content``, ``model``, ``stopReason``), or, for a refused sampling request,
    ``error``."""

    kind: ServerRequestKind
    digest: str
    result: dict[str, Any] | None = None
    error: str | None = None


class ServerRequestPlan(Compact):
    """How the turn answers one server's requests (``mcp.servers.<name>.elicitation`` /
    ``.sampling``), for the servers that ask anything of a person or a model."""

    elicitation: ElicitationMode = "none"
    elicitation_timeout: float | None = None  # seconds; None: the agent's approval timeout
    sampling: bool = False
    sampling_model: str | None = None  # None: the agent's model
    sampling_approval: bool = False


def wait_id(call_id: str, kind: ServerRequestKind, n: int) -> str:
    """The id a server's ``n``-th request in call ``call_id`` waits under."""
    return f"{call_id}:{'elicit' if kind == 'elicitation' else 'sample'}:{n}"


def elicit_answer(
    request: ServerRequest, action: Literal["accept", "decline", "cancel"], content: Any = None
) -> ServerAnswer:
    result: dict[str, Any] = {"action": action}
    if action == "accept":
        result["content"] = content or {}
    return ServerAnswer(kind="elicitation", digest=request.digest, result=result)


def sample_answer(request: ServerRequest, answer: Message, model: str) -> ServerAnswer:
    """A model's answer as the server's ``CreateMessageResult`` (text only)."""
    stop = {"endTurn": "endTurn", "maxTokens": "maxTokens", "stopSequence": "stopSequence"}
    result = {
        "role": "assistant",
        "content": {"type": "text", "text": answer.text},
        "model": model,
        "stopReason": stop.get(str(answer.stop_reason or "endTurn"), "endTurn"),
    }
    return ServerAnswer(kind="sampling", digest=request.digest, result=result)


def sample_refusal(request: ServerRequest, reason: str) -> ServerAnswer:
    return ServerAnswer(kind="sampling", digest=request.digest, error=reason)


def sampling_messages(messages: list[dict[str, Any]]) -> list[Message]:
    """A sampling request's messages as turnkeep's: text kept, other blocks named."""
    out: list[Message] = []
    for m in messages:
        raw = m.get("content")
        blocks = raw if isinstance(raw, list) else [raw]
        content: list[ContentBlock] = []
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "text":
                content.append(TextContent(text=str(block.get("text", ""))))
            elif isinstance(block, dict):
                content.append(TextContent(text=f"[{block.get('type', 'content')} omitted]"))
        role = "assistant" if m.get("role") == "assistant" else "user"
        out.append(Message(role=role, content=content))
    return out


# -- elicitation schemas --------------------------------------------------------------------
# MCP's requested schemas are flat: an object of primitive properties (string, number,
# integer, boolean; a string may be an enum, an array of enum strings a multi-select).


def content_problem(schema: dict[str, Any] | None, content: dict[str, Any]) -> str | None:
    """Why ``content`` does not match an elicitation's requested ``schema``, naming the field,
    or None."""
    props: dict[str, Any] = (schema or {}).get("properties") or {}
    for name in (schema or {}).get("required") or []:
        if name not in content:
            return f"field {name!r} is required"
    for name, value in content.items():
        spec = props.get(name)
        if spec is None:
            return f"field {name!r} is not in the requested schema ({', '.join(props) or 'none'})"
        problem = _value_problem(spec if isinstance(spec, dict) else {}, value)
        if problem is not None:
            return f"field {name!r} {problem}"
    return None


def _value_problem(spec: dict[str, Any], value: Any) -> str | None:
    kind = spec.get("type")
    options = _options(spec)
    if kind == "array":
        items = _options(spec.get("items") or {})
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return "must be a list of strings"
        bad = [v for v in value if items is not None and v not in items]
        return f"has {bad[0]!r}, not one of {items}" if bad else None
    if kind == "boolean":
        return None if isinstance(value, bool) else "must be true or false"
    if kind in ("number", "integer"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {'an integer' if kind == 'integer' else 'a number'}"
        if kind == "integer" and not (isinstance(value, int) or float(value).is_integer()):
            return "must be an integer"
        if not math.isfinite(value):
            return "must be a finite number"
        low, high = spec.get("minimum"), spec.get("maximum")
        if isinstance(low, int | float) and value < low:
            return f"must be at least {low}"
        if isinstance(high, int | float) and value > high:
            return f"must be at most {high}"
        return None
    if not isinstance(value, str):
        return "must be a string"
    if options is not None and value not in options:
        return f"must be one of {options}"
    low, high = spec.get("minLength"), spec.get("maxLength")
    if isinstance(low, int) and len(value) < low:
        return f"must be at least {low} characters"
    if isinstance(high, int) and len(value) > high:
        return f"must be at most {high} characters"
    return None


def _options(spec: dict[str, Any]) -> list[str] | None:
    """A string property's allowed values (``enum``, or ``oneOf``/``anyOf`` of ``const``)."""
    if isinstance(spec.get("enum"), list):
        return [str(v) for v in spec["enum"]]
    for key in ("oneOf", "anyOf"):
        if isinstance(spec.get(key), list):
            return [str(o.get("const")) for o in spec[key] if isinstance(o, dict) and "const" in o]
    return None


def coerce_content(schema: dict[str, Any] | None, content: dict[str, Any]) -> dict[str, Any]:
    """``content`` with integral numbers of ``integer`` fields as ints (JSON's 2.0 is 2)."""
    props: dict[str, Any] = (schema or {}).get("properties") or {}
    out = dict(content)
    for name, value in content.items():
        spec = props.get(name)
        if isinstance(spec, dict) and spec.get("type") == "integer" and isinstance(value, float):
            out[name] = int(value)
    return out
