"""OpenTelemetry traces of turns, through the Temporal SDK's ``TracingInterceptor``.

A turn is one trace: a span for the turn (``invoke_agent <agent>``), and under it the SDK's
spans for the workflow and each activity it schedules, where the model calls' and tool calls'
activity spans become ``chat <model>`` and ``execute_tool <tool>`` spans carrying the GenAI
semantic-convention attributes (``gen_ai.*``). Message content (model input and output, tool
arguments and results) goes on them only with ``trace_content``.

The SDK's workflow spans have no parent unless the client that started the workflow traced
it, and a worker that takes over a turn would start a new trace. So a turn's trace and span
ids are derived from its first run's id: any worker, before or after a restart or a
continue-as-new, puts its spans under the same turn span, and the turn span itself, recorded
when the turn ends, gets those same ids. A turn started by a traced client joins the client's
trace (the ids then derive the turn span's id only), under the client's span.

This module needs the ``otel`` extra (``opentelemetry-api``/``-sdk``); turnkeep imports it
only when tracing is on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import opentelemetry.context
import opentelemetry.trace
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TracerProvider,
)
from temporalio import activity, workflow
from temporalio.contrib.opentelemetry import TracingInterceptor, TracingWorkflowInboundInterceptor
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    ExecuteWorkflowInput,
    WorkflowInterceptorClassInput,
)

from turnkeep.contract.activity_io import CALL_TOOL, LLM_STEP, ToolCallOutcome
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest
from turnkeep.observability.recording import error_class
from turnkeep.observability.spans import MODEL_CALL_HOOK
from turnkeep.support.sdk_private import Carrier, WorkflowTracingHooks
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

log = logging.getLogger(__name__)

TRACER_NAME = "turnkeep"
# The tracer the turn spans are made with: its id generator hands out the turn's own ids.
_TURN_TRACER_NAME = "turnkeep.turn"
# Carried to the next run when a turn continues as new, next to the trace context: when the
# turn started and the span it started under (which the next run's headers no longer name).
_START_KEY = "turnkeep-turn-start-ns"
_PARENT_KEY = "turnkeep-turn-parent"
_EXTERN = "__turnkeep_turn_span"


def turn_ids(first_run_id: str) -> tuple[int, int]:
    """The trace id and turn span id of the turn whose first run is ``first_run_id``."""
    digest = hashlib.sha256(f"turnkeep-turn:{first_run_id}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


@dataclass(frozen=True)
class _TurnSpan:
    """What the workflow hands out of the sandbox to record its turn span."""

    name: str
    trace_id: int
    span_id: int
    parent: dict[str, str] | None  # the client's context, as a W3C carrier
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


class TurnTracing(TracingInterceptor):
    """``TracingInterceptor`` with turnkeep's turn span, deterministic turn ids and GenAI
    attributes. ``tracer_provider``: default, the global one."""

    def __init__(
        self, tracer_provider: TracerProvider | None = None, *, trace_content: bool = False
    ) -> None:
        provider = tracer_provider or opentelemetry.trace.get_tracer_provider()
        super().__init__(provider.get_tracer(TRACER_NAME))
        self.trace_content = trace_content
        # None: the global provider, looked up when the first turn ends (an application may
        # set it after building its worker).
        self._provider = tracer_provider
        self._ids = _TurnIds()
        self._turn_tracer: opentelemetry.trace.Tracer | None = None
        self._lock = threading.Lock()

    def workflow_interceptor_class(
        self, input: WorkflowInterceptorClassInput
    ) -> type[TracingWorkflowInboundInterceptor]:
        super().workflow_interceptor_class(input)
        input.unsafe_extern_functions[_EXTERN] = self._record_turn
        return _TurnWorkflowInbound

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        # The SDK's interceptor outside, so its activity span is current in ours.
        return super().intercept_activity(_GenAiActivityInbound(next, self))

    def _tracer_for_turns(self) -> opentelemetry.trace.Tracer:
        with self._lock:
            if self._turn_tracer is None:
                provider = self._provider or opentelemetry.trace.get_tracer_provider()
                tracer = provider.get_tracer(_TURN_TRACER_NAME)
                # The SDK's tracer takes span and trace ids from its `id_generator`; the turn
                # span's must be the ones its workflow derived. Another provider's turn spans
                # get ids of their own (their children still share the turn's trace).
                inner = getattr(tracer, "id_generator", None)
                if inner is None:
                    return tracer  # not the SDK's (or no provider set yet): ask again next time
                if isinstance(inner, _TurnIds):
                    # The provider hands every caller the same tracer: another interceptor of
                    # this process (another worker) has wrapped it already.
                    self._ids = inner
                else:
                    self._ids.inner = inner
                    tracer.id_generator = self._ids  # type: ignore[attr-defined]
                self._turn_tracer = tracer
            return self._turn_tracer

    def _record_turn(self, params: _TurnSpan) -> None:
        # Called from the workflow: a failure here would fail its workflow task, for ever.
        try:
            self._record(params)
        except Exception:
            log.warning("could not record the span of a turn", exc_info=True)

    def _record(self, params: _TurnSpan) -> None:
        tracer = self._tracer_for_turns()
        parent = self.text_map_propagator.extract(params.parent) if params.parent else None
        with self._ids.fixed(params.trace_id, params.span_id):
            span = tracer.start_span(
                params.name,
                context=parent or opentelemetry.context.Context(),
                kind=SpanKind.INTERNAL,
                attributes=params.attributes,
                start_time=params.start_ns,
            )
        if params.error is not None:
            span.set_status(Status(StatusCode.ERROR, params.error))
        span.end(end_time=params.end_ns)


class _TurnIds:
    """An id generator that hands out a turn's own ids while ``fixed`` says so, and otherwise
    defers to the provider's."""

    def __init__(self) -> None:
        self.inner: Any = None
        self._local = threading.local()

    @contextmanager
    def fixed(self, trace_id: int, span_id: int) -> Iterator[None]:
        self._local.ids = (trace_id, span_id)
        try:
            yield
        finally:
            self._local.ids = None

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids[1] if ids else int(self.inner.generate_span_id())

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return ids[0] if ids else int(self.inner.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        # A turn's trace id is a hash: as random as the provider's own.
        check = getattr(self.inner, "is_trace_id_random", None)
        return bool(check()) if check is not None else True


# -- workflow side (in the sandbox) ----------------------------------------------------------


class _TurnWorkflowInbound(WorkflowTracingHooks, TracingWorkflowInboundInterceptor):
    def _is_turn(self) -> bool:
        return workflow.info().workflow_type == WORKFLOW_NAME

    def workflow_carrier(self, from_headers: Carrier | None) -> Carrier | None:
        if not self._is_turn():
            return from_headers
        headers = from_headers or {}
        info = workflow.info()
        trace_id, span_id = turn_ids(info.first_execution_run_id)
        # The span the turn started under: named by a continued run's carrier, else the
        # client's context if the client traced the start.
        carried = headers.get(_PARENT_KEY)
        parent: dict[str, str] | None = carried if isinstance(carried, dict) else None
        if parent is None and info.continued_run_id is None and headers:
            parent = {k: v for k, v in headers.items() if isinstance(v, str)}
        parent_context = self.text_map_propagator.extract(parent) if parent else None
        parent_span = opentelemetry.trace.get_current_span(parent_context).get_span_context()
        if parent_span.is_valid:
            trace_id = parent_span.trace_id
        turn = SpanContext(
            trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
        carrier: Carrier = {}
        context = opentelemetry.trace.set_span_in_context(NonRecordingSpan(turn))
        self.text_map_propagator.inject(carrier, context)
        carrier[_START_KEY] = headers.get(_START_KEY) or str(int(info.start_time.timestamp() * 1e9))
        if parent:
            carrier[_PARENT_KEY] = parent
        return carrier

    def next_run_carrier(self) -> Carrier:
        # Only used for continue-as-new: the next run gets the turn's start and parent too.
        if not self._is_turn():
            return {}
        turn = self.loaded_carrier() or {}
        return {key: turn[key] for key in (_START_KEY, _PARENT_KEY) if key in turn}

    async def execute_workflow(self, input: ExecuteWorkflowInput) -> Any:
        if not self._is_turn():
            return await super().execute_workflow(input)
        try:
            result = await super().execute_workflow(input)
        except workflow.ContinueAsNewError:
            raise
        except (Exception, asyncio.CancelledError) as err:
            # Not the SDK's eviction of a cached workflow (a BaseException): the turn goes on.
            self._end_turn(input, None, err)
            raise
        self._end_turn(input, result, None)
        return result

    def _end_turn(
        self, input: ExecuteWorkflowInput, result: Any, err: BaseException | None
    ) -> None:
        if workflow.unsafe.is_replaying():
            return
        # A failure here would fail the turn's last workflow task, for ever: spans are not
        # worth that.
        try:
            self._turn_span(input, result, err)
        except Exception as problem:
            workflow.logger.warning("could not record the turn's span: %r", problem)

    def _turn_span(
        self, input: ExecuteWorkflowInput, result: Any, err: BaseException | None
    ) -> None:
        carrier = self.loaded_carrier() or {}
        info = workflow.info()
        trace_id, span_id = turn_ids(info.first_execution_run_id)
        parent = carrier.get(_PARENT_KEY)
        if parent:
            parent_context = self.text_map_propagator.extract(parent)
            parent_span = opentelemetry.trace.get_current_span(parent_context)
            trace_id = parent_span.get_span_context().trace_id
        agent = _agent_of(input.args)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": agent,
            "temporalWorkflowID": info.workflow_id,
            "temporalRunID": info.run_id,
        }
        attributes.update(_turn_attributes(result, err))
        workflow.extern_functions()[_EXTERN](
            _TurnSpan(
                name=f"invoke_agent {agent}",
                trace_id=trace_id,
                span_id=span_id,
                parent=parent,
                start_ns=int(carrier.get(_START_KEY) or workflow.time_ns()),
                end_ns=workflow.time_ns(),
                attributes=attributes,
                error=None if err is None else _turn_error(err),
            )
        )


def _agent_of(args: Sequence[Any]) -> str:
    turn = args[0] if args else None
    agent = turn.get("agent") if isinstance(turn, dict) else getattr(turn, "agent", None)
    return agent if isinstance(agent, str) else ""


def _turn_error(err: BaseException) -> str | None:
    if isinstance(err, asyncio.CancelledError):
        return None  # a cancelled turn is not an error of the turn
    return error_class(err)


def _turn_attributes(result: Any, err: BaseException | None) -> dict[str, Any]:
    if err is not None:
        stop = "cancelled" if isinstance(err, asyncio.CancelledError) else "failed"
        return {"gen_ai.response.finish_reasons": [stop]}
    stop_reason = str(getattr(result, "stop_reason", "") or "")
    usage: Mapping[str, Any] = getattr(result, "usage", None) or {}
    attributes: dict[str, Any] = {
        "gen_ai.response.finish_reasons": [stop_reason],
        "turnkeep.iterations": int(getattr(result, "iterations", 0) or 0),
        "gen_ai.usage.input_tokens": sum(u.input_tokens for u in usage.values()),
        "gen_ai.usage.output_tokens": sum(u.output_tokens for u in usage.values()),
    }
    if len(usage) == 1:
        attributes["gen_ai.request.model"] = next(iter(usage))
    return attributes


# -- activity side -----------------------------------------------------------------------------


class _GenAiActivityInbound(ActivityInboundInterceptor):
    """Names the SDK's span of a model or tool call after the call and adds ``gen_ai.*``."""

    def __init__(self, next: ActivityInboundInterceptor, root: TurnTracing) -> None:
        super().__init__(next)
        self._root = root

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        kind = activity.info().activity_type
        span = opentelemetry.trace.get_current_span()
        if kind not in (LLM_STEP, CALL_TOOL) or not input.args or not span.is_recording():
            return await super().execute_activity(input)
        request = input.args[0]
        content = self._root.trace_content
        if kind == LLM_STEP:
            _start_chat(span, request)
            token = MODEL_CALL_HOOK.set(lambda p, m, r: _chat_request(span, p, m, r, content))
        else:
            _start_tool(span, request, content)
            token = None
        try:
            result = await super().execute_activity(input)
        except BaseException as err:
            span.set_attribute("error.type", error_class(err))
            raise
        finally:
            if token is not None:
                MODEL_CALL_HOOK.reset(token)
        if kind == LLM_STEP and isinstance(result, Message):
            _chat_response(span, result, content)
        elif isinstance(result, ToolCallOutcome):
            _tool_result(span, result, content)
        return result


def _start_chat(span: opentelemetry.trace.Span, request: Any) -> None:
    model = str(getattr(request, "model", ""))
    span.update_name(f"chat {model}")
    span.set_attributes(
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.agent.name": str(getattr(request, "agent", "")),
            "turnkeep.call_index": int(getattr(request, "call_index", 0)),
        }
    )


def _chat_request(
    span: opentelemetry.trace.Span, provider: str, model: str, request: LlmRequest, content: bool
) -> None:
    name = model or request.model
    span.update_name(f"chat {name}")
    attributes: dict[str, Any] = {
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": name,
    }
    if request.temperature is not None:
        attributes["gen_ai.request.temperature"] = request.temperature
    if request.max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = request.max_tokens
    if content:
        if request.instruction:
            attributes["gen_ai.system_instructions"] = json.dumps(
                [{"type": "text", "content": request.instruction}]
            )
        attributes["gen_ai.input.messages"] = json.dumps(
            [_message_json(m) for m in request.messages]
        )
    span.set_attributes(attributes)


def _chat_response(span: opentelemetry.trace.Span, message: Message, content: bool) -> None:
    attributes: dict[str, Any] = {}
    if message.stop_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [str(message.stop_reason)]
    usage = message.channel_json("usage") or {}
    for attribute, key in (
        ("gen_ai.usage.input_tokens", "input_tokens"),
        ("gen_ai.usage.output_tokens", "output_tokens"),
        ("gen_ai.usage.cache_read.input_tokens", "cache_read_tokens"),
        ("gen_ai.usage.cache_creation.input_tokens", "cache_write_tokens"),
    ):
        if isinstance(usage.get(key), int):
            attributes[attribute] = usage[key]
    model = usage.get("model")
    if isinstance(model, str) and model:
        attributes["gen_ai.response.model"] = model
    if content:
        attributes["gen_ai.output.messages"] = json.dumps([_message_json(message)])
    span.set_attributes(attributes)


def _start_tool(span: opentelemetry.trace.Span, request: Any, content: bool) -> None:
    tool = str(getattr(request, "name", ""))
    span.update_name(f"execute_tool {tool}")
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "function",
        "gen_ai.tool.call.id": str(getattr(request, "call_id", "")),
        "gen_ai.agent.name": str(getattr(request, "agent", "")),
    }
    if content:
        attributes["gen_ai.tool.call.arguments"] = json.dumps(getattr(request, "arguments", {}))
    span.set_attributes(attributes)


def _tool_result(span: opentelemetry.trace.Span, outcome: ToolCallOutcome, content: bool) -> None:
    if outcome.result.is_error:
        span.set_attribute("error.type", "tool_error")
        span.set_status(Status(StatusCode.ERROR))
    if content:
        span.set_attribute("gen_ai.tool.call.result", outcome.result.text)


def _message_json(message: Message) -> dict[str, Any]:
    """A message in the GenAI conventions' shape (role and parts)."""
    parts: list[dict[str, Any]] = []
    if message.text:
        parts.append({"type": "text", "content": message.text})
    for call_id, call in (message.tool_calls or {}).items():
        parts.append(
            {"type": "tool_call", "id": call_id, "name": call.name, "arguments": call.arguments}
        )
    for call_id, result in (message.tool_results or {}).items():
        parts.append({"type": "tool_call_response", "id": call_id, "response": result.text})
    return {"role": message.role, "parts": parts}


def tracing_interceptor(trace_content: bool) -> TurnTracing:
    """The interceptor ``TurnkeepPlugin`` adds when ``observability.tracing`` is on."""
    return TurnTracing(trace_content=trace_content)
