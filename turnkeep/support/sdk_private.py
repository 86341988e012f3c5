"""Every private name of an SDK that turnkeep uses, and nothing else.

The rest of turnkeep calls what this module exposes: functions, constants, and base classes
that override an SDK's private method in one place and hand the decision to a public hook.
Each use has a reason the SDK's public API cannot meet yet (the design notes list them), and
each degrades to the SDK's stock behaviour where this SDK version lacks the name, so an
upgrade that moves one costs speed or robustness, never a working worker. turnkeep's test
suite checks that each name is still there, so such an upgrade is noticed, and the
``temporalio`` requirement stops below its next minor version for the same reason.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter
from temporalio.worker import Worker, WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxRestrictions

if TYPE_CHECKING:
    from fastmcp import FastMCP
    from opentelemetry.propagators.textmap import TextMapPropagator

# -- The workflow sandbox: serialization contexts without exec --------------------------------
#
# Before it encodes or decodes a payload, the SDK asks the workflow instance which command the
# payload belongs to. The stock sandbox's instance answers by exec-ing a snippet inside the
# sandbox, per payload; the answer is a read of the in-sandbox instance's pending-command
# tables, so this instance asks that object directly. The private names: the stock instance's
# class, and the global under which it keeps the in-sandbox object.

try:
    from temporalio.worker.workflow_sandbox._runner import _Instance
except ImportError:  # pragma: no cover - another SDK version: the stock sandbox
    _Instance = None  # type: ignore[assignment,misc]

IN_SANDBOX_GLOBAL = "__temporal_in_sandbox"
_INSTANCE_PARAMETERS = ("instance_details", "runner_class", "restrictions")


def _constructs_as_expected(cls: type) -> bool:
    """Whether ``cls`` is built as this module builds it: a changed constructor would fail
    every workflow, where a missing class only costs speed."""
    return tuple(inspect.signature(cls).parameters) == _INSTANCE_PARAMETERS


if _Instance is not None and _constructs_as_expected(_Instance):
    CONTEXTS_WITHOUT_EXEC = True

    class _DirectContextInstance(_Instance):
        """The stock sandbox's instance, answering serialization-context questions by a direct
        call on the in-sandbox instance (pure reads of its state) instead of ``exec``; the
        stock answer where that object is not where the stock instance keeps it."""

        def _in_sandbox(self) -> Any:
            return self.globals_and_locals.get(IN_SANDBOX_GLOBAL)

        def get_serialization_context(self, command_info: Any) -> Any:
            inner = self._in_sandbox()
            if inner is None:
                return super().get_serialization_context(command_info)
            return inner.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: Any) -> Any:
            inner = self._in_sandbox()
            if inner is None:
                return super().get_external_store_context(command_info)
            return inner.get_external_store_context(command_info)

else:  # pragma: no cover - another SDK version
    CONTEXTS_WITHOUT_EXEC = False


def sandboxed_instance(
    details: WorkflowInstanceDetails,
    runner_class: type[WorkflowRunner],
    restrictions: SandboxRestrictions,
) -> WorkflowInstance | None:
    """The stock sandbox's workflow instance, answering serialization-context questions
    without ``exec``; None where this SDK version does not allow it (the caller then makes the
    stock instance)."""
    if not CONTEXTS_WITHOUT_EXEC:  # pragma: no cover - another SDK version
        return None
    return _DirectContextInstance(details, runner_class, restrictions)


# -- Which workflow command a payload being decoded belongs to -------------------------------
#
# The worker decodes an activation's payloads inside a context variable naming the command
# (an activity's, a child workflow's...) each payload answers; a payload of no command came
# from a client (a start, an update, a query, a signal).

try:
    from temporalio.worker._command_aware_visitor import (
        current_command_info as _current_command_info,
    )
except ImportError:  # pragma: no cover - another SDK version: every payload as a command's
    _current_command_info = None  # type: ignore[assignment]

TELLS_COMMAND_PAYLOADS = _current_command_info is not None


def decoding_outside_commands() -> bool:
    """Whether the payloads being decoded now belong to no workflow command: a client sent
    them. False where this SDK version cannot tell."""
    return _current_command_info is not None and _current_command_info.get() is None


# -- The data converter's decoding stages ------------------------------------------------------

DecodeStage = Callable[[Sequence[Payload]], Awaitable[list[Payload]]]


class DecodingStages(DataConverter):
    """``DataConverter`` whose decoding stages run through public hooks.

    The SDK decodes payloads in three stages: the codec's decoding of external-storage
    references, the retrieval of stored payloads, then the codec. Each is a private coroutine
    that both ``decode`` and the worker's decoding of a workflow activation call, one after
    another, before any workflow code runs; overriding them is the only way in. Here every
    stage runs through ``decode_stage``, and the codec's is ``codec_decode``. Where this SDK
    version names them otherwise, the hooks are not called: the stock decoding."""

    async def decode_stage(self, stage: DecodeStage, payloads: Sequence[Payload]) -> list[Payload]:
        """Runs one decoding stage over ``payloads``: by default, just the stage."""
        return await stage(payloads)

    async def codec_decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """The codec stage: by default the SDK's (the payload codec's decode, if any)."""
        return await super()._decode_payload_sequence(payloads)

    async def _decode_reference_payload_sequence(
        self, payloads: Sequence[Payload]
    ) -> list[Payload]:
        return await self.decode_stage(super()._decode_reference_payload_sequence, payloads)

    async def _external_retrieve_payload_sequence(
        self, payloads: Sequence[Payload]
    ) -> list[Payload]:
        return await self.decode_stage(super()._external_retrieve_payload_sequence, payloads)

    async def _decode_payload_sequence(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await self.decode_stage(self.codec_decode, payloads)


# -- Releasing a run from a worker's workflow cache --------------------------------------------

Evict = Callable[[str], None]


def workflow_evictor(worker: Worker) -> Evict | None:
    """``worker``'s request to drop a run (by run id) from its workflow cache, if this SDK
    version lets it be reached: the worker's Core bridge has it, the ``Worker`` keeps that
    bridge private. Core carries the request out once the run's current task is done."""
    bridge = getattr(worker, "_bridge_worker", None)
    evict = getattr(bridge, "request_workflow_eviction", None)
    return evict if callable(evict) else None


# -- The workflow tracing interceptor's carrier ------------------------------------------------
#
# A mixin, not a subclass: the OpenTelemetry contrib module imports OpenTelemetry, which only
# a worker that traces loads.

Carrier = dict[str, Any]


class WorkflowTracingHooks:
    """Put before ``temporalio.contrib.opentelemetry.TracingWorkflowInboundInterceptor`` among
    a subclass's bases: the trace context a workflow's spans are made under (the SDK reads it
    from the workflow's start headers, privately) comes from ``workflow_carrier``, and the one
    carried to the next run on continue-as-new gets ``next_run_carrier``'s entries.

    Where this SDK version names those methods otherwise, the SDK's spans keep its stock
    context, and ``loaded_carrier`` still answers from ``workflow_carrier`` alone."""

    if TYPE_CHECKING:
        text_map_propagator: TextMapPropagator

    _turnkeep_carrier: Carrier | None = None

    def workflow_carrier(self, from_headers: Carrier | None) -> Carrier | None:
        """The workflow's trace context, given the one its start headers carry (None: none);
        asked again until it answers one. By default, the headers'."""
        return from_headers

    def next_run_carrier(self) -> Carrier:
        """Entries added to the trace context carried to the next run on continue-as-new; none
        by default."""
        return {}

    def loaded_carrier(self) -> Carrier | None:
        """The workflow's trace context, as its spans are made under."""
        return self._load_workflow_context_carrier()

    def _load_workflow_context_carrier(self) -> Carrier | None:
        if self._turnkeep_carrier:
            return self._turnkeep_carrier
        stock = getattr(super(), "_load_workflow_context_carrier", None)
        carrier = self.workflow_carrier(stock() if stock is not None else None)
        self._turnkeep_carrier = carrier
        return carrier

    def _context_to_headers(self, headers: Any) -> Any:
        extra = self.next_run_carrier()
        to_headers = getattr(self, "_context_carrier_to_headers", None)
        if not extra or to_headers is None:
            return super()._context_to_headers(headers)  # type: ignore[misc]
        carrier: Carrier = {}
        self.text_map_propagator.inject(carrier)
        carrier.update(extra)
        return to_headers(carrier, headers)


# -- fastmcp: the identity a server stamps on its results --------------------------------------


def server_info_stamp(server: FastMCP) -> dict[str, Any] | None:
    """What an MCP client of ``server`` finds under ``serverInfo`` in a result's ``_meta`` on a
    2026-era connection (the MCP SDK's low-level server makes it, and FastMCP keeps that server
    private); None where this fastmcp version does not let it be reached."""
    low_level = getattr(server, "_mcp_server", None)
    stamp = getattr(low_level, "server_info_stamp", None)
    return stamp if isinstance(stamp, dict) else None


# -- mcp: a tool call's cancellation, and the connection it came on ----------------------------
#
# A tool handler is cancelled both when its client sends `notifications/cancelled` and when the
# client goes away (or the server stops); the MCP door cancels the turn only in the first case.
# The SDK sets an event on the request's dispatch context for the first, which fastmcp's
# context does not expose: the server session keeps that context (and the connection, whose
# public `state` and `exit_stack` key and close a connection's session) private.


def mcp_cancel_requested(session: Any) -> Any | None:
    """The ``anyio.Event`` the MCP SDK sets when the client cancels the request ``session``
    (a request's ``ServerSession``) was built for; None where this SDK keeps no such event."""
    outbound = getattr(session, "_request_outbound", None)
    event = getattr(outbound, "cancel_requested", None)
    return event if callable(getattr(event, "is_set", None)) else None


def mcp_connection(session: Any) -> Any | None:
    """The MCP SDK's ``Connection`` behind a request's ``ServerSession`` (its ``state`` and
    ``exit_stack`` last as long as the client's connection); None where it cannot be reached."""
    connection = getattr(session, "_connection", None)
    has_parts = hasattr(connection, "state") and hasattr(connection, "exit_stack")
    return connection if has_parts else None
