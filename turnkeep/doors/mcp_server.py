"""MCP server mode: a worker's agents served as MCP tools, as ``fast-agent serve`` serves them.

Each agent is one tool named after it, taking one ``message`` string and answering with the
text of the turn's final message (fast-agent's managed agent tools: the agent's
``description``, else ``Send a message to <agent>.``). What a call is follows fast-agent's
``--instance-scope``:

- ``shared`` (fast-agent's default): one turnkeep session per agent for every client; each call
  is a message in it, so every caller sees one conversation.
- ``connection``: one session per agent and MCP connection (an stdio client, a handshake-era
  HTTP session); it is closed, its running turn left to finish, when the connection ends. A
  2026-era HTTP request is a connection of its own, so there each call is a session of one turn.
- ``request``: each call is a turn of its own, with no history.

A call is a durable turn: a client that goes away leaves it running. Progress notifications
carry the live text of its model calls when the client sent a progress token; a client's
``notifications/cancelled`` cancels the turn, which repairs its conversation. For turns that
outlive a call, five more tools: ``turnkeep_start``, ``turnkeep_status``, ``turnkeep_cancel``,
``turnkeep_pending`` and ``turnkeep_decide``, each a thin layer over the client API.

The server serves only agents its ``Settings`` name (``agents`` narrows them), and reaches
only turns of those agents: any other id is told as unknown, whether or not it exists. The HTTP
gateway serves one such door per key at ``/mcp`` (``turnkeep.doors.gateway.mcp``).
"""

# No `from __future__ import annotations`: the tools' annotations are read by fastmcp when they
# are registered, and some name the server's own agents.
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

import anyio
import mcp_types
from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.exceptions import ValidationError as FastMcpValidationError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools import ToolResult
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field, ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import FailureError
from temporalio.service import RPCError, RPCStatusCode

from turnkeep.client.live import TextDelta
from turnkeep.client.queries import poll_query
from turnkeep.client.sessions import SessionClosedError, SessionHandle, open_session
from turnkeep.client.status import describe_failure
from turnkeep.client.turns import TurnHandle, get_turn, start_turn
from turnkeep.config.settings import Settings
from turnkeep.contract.approval import DecisionRecord, PendingCall
from turnkeep.contract.session_io import SessionProgress
from turnkeep.contract.turn_io import (
    TaskPriority,
    TurnCancelledError,
    TurnInput,
    TurnResult,
    agent_task_queue,
)
from turnkeep.doors.hosts import HostOriginGuard
from turnkeep.errors import known
from turnkeep.support.asgi import AsgiServer, bind, http_url
from turnkeep.support.sdk_private import mcp_cancel_requested, mcp_connection
from turnkeep.workflows import visibility
from turnkeep.workflows.session_workflow import SessionWorkflow
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

log = logging.getLogger(__name__)

InstanceScope = Literal["shared", "connection", "request"]
SCOPES: tuple[InstanceScope, ...] = ("shared", "connection", "request")

# The longest message a call may send (characters): far above a prompt, well below what a
# Temporal payload holds.
MAX_MESSAGE = 200_000
# The longest a status call waits for a turn to end, and how long a decision waits for the
# turn's worker to take it.
MAX_WAIT_SECONDS = 300.0
DECIDE_SECONDS = 30.0
# The path streamable HTTP is served on.
MCP_PATH = "/mcp"
# How many of the turns it started a server remembers (for `drain`), the newest.
TRACKED_TURNS = 10_000
# Who a decision made over MCP is recorded as.
DECIDED_BY = "mcp"

TOOL_NAMES = (
    "turnkeep_start",
    "turnkeep_status",
    "turnkeep_cancel",
    "turnkeep_pending",
    "turnkeep_decide",
)

Message = Annotated[
    str, Field(min_length=1, max_length=MAX_MESSAGE, description="Message to send to the agent")
]
TurnId = Annotated[
    str, Field(min_length=1, max_length=1000, description="The turn's id (turnkeep_start's).")
]
CallId = Annotated[
    str, Field(min_length=1, max_length=1000, description="The waiting tool call's id.")
]


class Started(BaseModel):
    turn_id: str
    agent: str


class TurnStatus(BaseModel):
    turn_id: str
    agent: str
    # The workflow's: running, completed, failed, cancelled, terminated, timed_out.
    status: str
    # The final message's text once the turn has completed (a cancelled turn's, if it had one).
    text: str | None = None
    error: str | None = None


class WaitingCall(BaseModel):
    """A tool call waiting for a decision: decide it with ``turn_id`` and ``call_id``."""

    turn_id: str
    agent: str
    call_id: str
    name: str
    arguments: dict[str, Any]
    since: datetime
    # When it waits in a child turn (an agent the turn called as a tool): that turn and agent.
    child_turn_id: str | None = None
    child_agent: str | None = None


class Waiting(BaseModel):
    approvals: list[WaitingCall]


_STATUS = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
}


def served_agents(settings: Settings, agents: Iterable[str] | None = None) -> list[str]:
    """The agents a server for ``settings`` serves: all it names, or those of ``agents``;
    an agent the settings lack raises ``ValueError`` naming it."""
    if agents is None:
        return list(settings.agents)
    wanted = list(dict.fromkeys(a.strip() for a in agents if a.strip()))
    missing = [a for a in wanted if a not in settings.agents]
    if missing:
        raise ValueError(
            f"no agent {missing[0]!r} in the configuration (its agents: {known(settings.agents)})"
        )
    if not wanted:
        raise ValueError("no agent to serve")
    return wanted


# Which agent a turn is of, from its description (None: none served).
AgentOf = Callable[[WorkflowExecutionDescription], Awaitable[str | None]]


class McpDoor:
    """The MCP server (``server``) over a Temporal client, and what it keeps between calls:
    the shared sessions, and the turns it started (``drain`` waits for them).

    For a caller that is not the server's only one (the gateway's door per key):
    ``task_queue`` says where an agent's turns and sessions start (one queue, or a function of
    the agent; default: the agent's queue on the settings' ``task_queue``); ``agent_of`` which
    agent a turn is of (default: the one it names, by its search attribute or its queue, if it
    runs on that agent's queue); ``decided_by`` who its decisions are recorded as;
    ``decide=False`` refuses every decision; ``priority`` and ``tenant`` are those of every
    turn and session it starts (``TurnInput``'s)."""

    def __init__(
        self,
        client: Client,
        settings: Settings,
        *,
        agents: Iterable[str] | None = None,
        scope: InstanceScope = "shared",
        name: str = "turnkeep",
        task_queue: str | Callable[[str], str] | None = None,
        agent_of: AgentOf | None = None,
        decided_by: str = DECIDED_BY,
        decide: bool = True,
        priority: TaskPriority | None = None,
        tenant: str | None = None,
    ) -> None:
        if scope not in SCOPES:
            raise ValueError(f"instance scope must be one of {', '.join(SCOPES)}, not {scope!r}")
        self.client = client
        self.settings = settings
        self.scope: InstanceScope = scope
        self._priority, self._tenant = priority, tenant
        self.agents = served_agents(settings, agents)
        clash = sorted(set(self.agents) & set(TOOL_NAMES))
        if clash:
            raise ValueError(f"agent {clash[0]!r} has the name of one of turnkeep's MCP tools")
        if isinstance(task_queue, str):
            queue = task_queue
            self._queue_of: Callable[[str], str] = lambda _agent: queue
        elif task_queue is None:
            self._queue_of = lambda agent: agent_task_queue(settings.task_queue, agent)
        else:
            self._queue_of = task_queue
        # Each queue that only one served agent's turns run on, to that agent.
        queues = [self._queue_of(a) for a in self.agents]
        self._queues = {
            q: a for q, a in zip(queues, self.agents, strict=True) if queues.count(q) == 1
        }
        self._agent_of = agent_of
        self.decided_by = decided_by
        self.decide = decide
        # The sessions kept for the server's life: shared scope's, and a 2026-era stdio
        # client's in connection scope (the process serves that one client).
        self._shared: dict[str, SessionHandle] = {}
        self._process: dict[str, SessionHandle] = {}
        self._lock = asyncio.Lock()
        self._started: dict[str, TurnHandle] = {}
        self.server = FastMCP(
            name=name,
            instructions=self._instructions(),
            lifespan=self._lifespan,
            # A tool's unexpected failure is told as such, never with its text (which could
            # carry what a caller should not see); turnkeep's own errors are ToolErrors.
            mask_error_details=True,
            middleware=[_OneLineArgumentErrors()],
        )
        for agent in self.agents:
            self._add_agent_tool(agent)
        self._add_turn_tools()

    # -- the agents' tools ----------------------------------------------------------------------

    def _instructions(self) -> str:
        history = (
            "Agents do NOT retain history between your requests"
            if self.scope == "request"
            else "Agents retain history between tool calls"
        )
        names = ", ".join(f"`{a}`" for a in self.agents)
        return (
            f"This server provides access to {len(self.agents)} durable turnkeep agents. "
            f"Available agent tools: {names}. Instance mode is {self.scope}. {history}. "
            "For turns that outlive a call: turnkeep_start, turnkeep_status, turnkeep_cancel, "
            "turnkeep_pending, turnkeep_decide."
        )

    def _add_agent_tool(self, agent: str) -> None:
        options = self.settings.agents[agent]
        description = options.description or f"Send a message to {agent}."

        async def send(message: Message, ctx: Context) -> str:
            return await self._send(agent, message, ctx)

        self.server.tool(send, name=agent, description=description, output_schema=None)

    async def _send(self, agent: str, message: str, ctx: Context) -> str:
        cancel = mcp_cancel_requested(ctx.session)
        turn: TurnHandle | None = None
        try:
            turn = await self._begin(agent, message, ctx)
            return await self._follow(turn, ctx)
        except asyncio.CancelledError:
            # Only the client's own cancellation cancels the turn: one that went away, or a
            # server stopping, leaves it running on its workers.
            if turn is not None and cancel is not None and cancel.is_set():
                with anyio.CancelScope(shield=True):
                    await _cancel_quietly(turn)
            raise

    async def _begin(self, agent: str, message: str, ctx: Context) -> TurnHandle:
        """The turn that answers ``message``: a turn of its own (request scope), else the
        session's turn, once it runs."""
        sessions = self._sessions(ctx)
        if sessions is None:
            return await self._start(agent, message)
        try:
            session = await self._kept(sessions, agent, ctx)
            try:
                sent = await session.send(message)
            except (SessionClosedError, WorkflowUpdateFailedError) as err:
                # Ended or closing (closed by someone, idle too long): the caller's next
                # message goes to a new session, as fast-agent's next call gets a new instance.
                if not _session_closed(err):
                    raise
                sessions.pop(agent, None)
                session = await self._kept(sessions, agent, ctx)
                sent = await session.send(message)
        except SessionClosedError as err:
            raise ToolError(f"{agent}'s session has ended: {err}") from None
        except (WorkflowUpdateFailedError, RPCError) as err:
            raise ToolError(f"{agent}'s session refused the message: {_cause(err)}") from None

        def started(progress: SessionProgress) -> bool:
            running = progress.turn.workflow_id if progress.turn else None
            return progress.turns_ended >= sent.turn or running == sent.turn_id

        # A message sent while another caller's turn runs waits for it: follow ours only.
        if await poll_query(session.handle, SessionWorkflow.progress, started) is None:
            raise ToolError(f"{agent}'s session ended before answering")
        return self._track(get_turn(self.client, sent.turn_id))

    async def _follow(self, turn: TurnHandle, ctx: Context) -> str:
        """The turn's live text as progress notifications, then its final text."""
        sent = 0
        async for event in turn.stream():
            if isinstance(event, TextDelta) and event.text:
                sent += 1
                # A client that cannot be told (gone, say) does not stop the turn's answer.
                with contextlib.suppress(Exception):
                    await ctx.report_progress(sent, None, event.text)
        try:
            result = await turn.result()
        except TurnCancelledError:
            raise ToolError(f"turn {turn.workflow_id} was cancelled") from None
        except WorkflowFailureError as err:
            raise ToolError(f"turn {turn.workflow_id} failed: {_cause(err)}") from None
        return _text(result) or ""

    def _sessions(self, ctx: Context) -> dict[str, SessionHandle] | None:
        """Where the caller's sessions are kept, by agent, as the scope says; None: nowhere
        (request scope, or a connection this SDK does not let be reached), a turn of its own."""
        if self.scope == "shared":
            return self._shared
        connection = mcp_connection(ctx.session) if self.scope == "connection" else None
        if connection is None:
            return None
        # A 2026-era request is a connection of its own. Over stdio the process serves one
        # client, whose sessions last as long as the process; over HTTP nothing ties one
        # request to the next: a session for this call, closed with it.
        if connection.protocol_version in MODERN_PROTOCOL_VERSIONS and ctx.transport == "stdio":
            return self._process
        sessions: dict[str, SessionHandle] = connection.state.setdefault("turnkeep", {})
        return sessions

    async def _kept(
        self, sessions: dict[str, SessionHandle], agent: str, ctx: Context
    ) -> SessionHandle:
        """The agent's session in ``sessions``, opened on first use (once, whoever asks); one
        kept on an MCP connection is closed when the connection ends."""
        async with self._lock:
            session = sessions.get(agent)
            if session is None:
                keeper = None
                if sessions is not self._shared and sessions is not self._process:
                    keeper = mcp_connection(ctx.session)
                session = sessions[agent] = await self._open(agent, close_with=keeper)
        return session

    async def _open(self, agent: str, *, close_with: Any = None) -> SessionHandle:
        session = await open_session(
            self.client,
            agent=agent,
            task_queue=self._queue_of(agent),
            on_new_message=self.settings.agents[agent].on_new_message,
            priority=self._priority,
            tenant=self._tenant,
        )
        if close_with is not None:
            # The connection's end closes the session: what it was answering is answered.
            close_with.exit_stack.push_async_callback(_close_quietly, session)
        return session

    async def _start(self, agent: str, message: str) -> TurnHandle:
        try:
            turn = TurnInput.model_validate(
                {
                    "agent": agent,
                    "messages": [message],
                    "priority": self._priority,
                    "tenant": self._tenant,
                }
            )
        except ValueError as err:
            raise ToolError(f"refused: {_first_line(err)}") from None
        handle = await start_turn(self.client, turn, task_queue=self._queue_of(agent))
        return self._track(handle)

    def _track(self, turn: TurnHandle) -> TurnHandle:
        self._started[turn.workflow_id] = turn
        if len(self._started) > TRACKED_TURNS:
            del self._started[next(iter(self._started))]
        return turn

    # -- turns that outlive a call ----------------------------------------------------------

    def _add_turn_tools(self) -> None:
        agents = ", ".join(self.agents)

        async def turnkeep_start(
            agent: Annotated[
                str, Field(min_length=1, max_length=200, description=f"One of: {agents}.")
            ],
            message: Message,
        ) -> Started:
            if agent not in self.agents:
                raise ToolError(
                    f"unknown agent {agent!r}: this server serves {agents}; nothing was started"
                )
            handle = await self._start(agent, message)
            return Started(turn_id=handle.workflow_id, agent=agent)

        async def turnkeep_status(
            turn_id: TurnId,
            wait_seconds: Annotated[
                float,
                Field(
                    ge=0,
                    le=MAX_WAIT_SECONDS,
                    description="Wait up to this long for the turn to end (0: answer now).",
                ),
            ] = 0,
        ) -> TurnStatus:
            turn, agent = await self._served_turn(turn_id)
            if wait_seconds > 0:
                with anyio.move_on_after(wait_seconds):
                    await _ended(turn)
            return await self._status(turn, agent)

        async def turnkeep_cancel(turn_id: TurnId) -> TurnStatus:
            turn, agent = await self._served_turn(turn_id)
            status = await self._status(turn, agent)
            if status.status != "running":
                raise ToolError(f"turn {turn_id!r} has ended ({status.status}): nothing to cancel")
            try:
                await turn.cancel()
            except RPCError as err:  # it ended meanwhile
                raise ToolError(f"turn {turn_id!r} could not be cancelled: {_cause(err)}") from None
            return status.model_copy(update={"status": "cancelling"})

        async def turnkeep_pending(
            turn_id: Annotated[
                str | None,
                Field(max_length=1000, description="Only this turn's calls (default: every turn)."),
            ] = None,
        ) -> Waiting:
            if turn_id is not None:
                turn, agent = await self._served_turn(turn_id)
                return Waiting(approvals=await self._waiting(turn, agent))
            return Waiting(approvals=await self._all_waiting())

        async def turnkeep_decide(
            turn_id: TurnId,
            call_id: CallId,
            approve: Annotated[bool, Field(description="true runs the call, false denies it.")],
            reason: Annotated[
                str | None,
                Field(max_length=10_000, description="Why; the model sees it on a denial."),
            ] = None,
            arguments: Annotated[
                dict[str, Any] | None,
                Field(description="Run the call with these arguments instead."),
            ] = None,
        ) -> DecisionRecord:
            if not self.decide:
                raise ToolError("this caller may not decide tool calls")
            turn, _ = await self._served_turn(turn_id)
            try:
                with anyio.fail_after(DECIDE_SECONDS):
                    return await turn.decide(
                        call_id, approve, reason=reason, by=self.decided_by, arguments=arguments
                    )
            except (WorkflowUpdateFailedError, RPCError) as err:
                # The turn refused it (no such call waiting), or has ended.
                raise ToolError(f"decision refused: {_cause(err)}") from None
            except TimeoutError:
                raise ToolError(
                    f"no worker took the decision within {DECIDE_SECONDS:.0f}s; is one running?"
                ) from None

        described: dict[Callable[..., Any], str] = {
            turnkeep_start: "Start a durable turn of an agent and return its turn_id at once; "
            "the turn runs on whether or not anyone waits for it.",
            turnkeep_status: "A turn's status, and its final text once it has completed.",
            turnkeep_cancel: "Cancel a running turn; its conversation is repaired.",
            turnkeep_pending: "Tool calls waiting for a person's approval.",
            turnkeep_decide: "Approve or deny a tool call that waits for approval.",
        }
        for fn, description in described.items():
            self.server.tool(fn, description=description)

    async def _served_turn(self, turn_id: str) -> tuple[TurnHandle, str]:
        """The turn ``turn_id`` and its agent, if it is a turn of an agent this server serves;
        any other id, whether or not a workflow has it, is told the same."""
        unknown = ToolError(f"no turn {turn_id!r} of an agent this server serves")
        turn = get_turn(self.client, turn_id)
        try:
            described = await turn.handle.describe()
        except RPCError as err:
            if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                raise unknown from None
            raise
        if described.workflow_type != WORKFLOW_NAME:
            raise unknown
        if self._agent_of is not None:
            agent = await self._agent_of(described)
        else:
            # Its agent's, if it runs on that agent's queue: a turn of an agent of the same
            # name on another worker's queue is not this server's.
            agent = described.typed_search_attributes.get(visibility.AGENT)
            agent = agent or self._queues.get(described.task_queue)
            if agent is not None and described.task_queue != self._queue_of(agent):
                agent = None
        if agent is None or agent not in self.agents:
            raise unknown
        return turn, agent

    async def _status(self, turn: TurnHandle, agent: str) -> TurnStatus:
        described = await turn.handle.describe()
        status = _STATUS.get(described.status or WorkflowExecutionStatus.RUNNING, "running")
        answer = TurnStatus(turn_id=turn.workflow_id, agent=agent, status=status)
        if status == "completed":
            answer.text = _text(await turn.result())
        elif status == "cancelled":
            try:
                await turn.result()
            except TurnCancelledError as cancelled:
                answer.text = _text(cancelled.result) if cancelled.result else None
            except WorkflowFailureError:
                pass
        elif status != "running":
            try:
                await turn.result()
            except WorkflowFailureError as err:
                answer.error = _cause(err)
        return answer

    async def _waiting(self, turn: TurnHandle, agent: str) -> list[WaitingCall]:
        try:
            with anyio.fail_after(DECIDE_SECONDS):
                calls = await turn.pending_approvals()
        except TimeoutError:
            raise ToolError("no worker answered for the turn; is one running?") from None
        except RPCError as err:
            raise ToolError(f"the turn's waiting calls could not be read: {err.message}") from None
        return [_waiting_call(turn.workflow_id, agent, call) for call in calls]

    async def _all_waiting(self) -> list[WaitingCall]:
        """Every call waiting in a turn of a served agent (by search attribute); a call waiting
        in a child turn is listed under the turn at the top, as ``turnkeep pending`` does."""
        agents = ", ".join("'" + a.replace("'", "") + "'" for a in self.agents)
        query = (
            f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running' AND "
            f"{visibility.STATUS.name} = '{visibility.TurnStatus.AWAITING_APPROVAL.value}' AND "
            f"{visibility.AGENT.name} IN ({agents})"
        )
        listed: list[WaitingCall] = []
        try:
            async for execution in self.client.list_workflows(query):
                # Listed by its agent's search attribute; on that agent's queue only, unless
                # ``agent_of`` says which turns are whose (the gateway's, as its API lists them).
                agent = execution.typed_search_attributes.get(visibility.AGENT)
                if agent is None or agent not in self.agents:
                    continue
                if self._agent_of is None and execution.task_queue != self._queue_of(agent):
                    continue
                turn = get_turn(self.client, execution.id)
                try:
                    listed.extend(await self._waiting(turn, agent))
                except ToolError:
                    log.warning("the waiting calls of turn %s could not be read", execution.id)
        except RPCError as err:
            if err.status != RPCStatusCode.INVALID_ARGUMENT:
                raise
            raise ToolError(
                "the namespace cannot be searched for waiting calls (register turnkeep's search "
                "attributes: turnkeep setup); name the turn instead"
            ) from None
        children = {c.child_turn_id for c in listed if c.child_turn_id is not None}
        return [c for c in listed if c.turn_id not in children]

    # -- the server's life ----------------------------------------------------------------------

    @property
    def turn_ids(self) -> list[str]:
        """The turns this server started (its calls' and ``turnkeep_start``'s), oldest first."""
        return list(self._started)

    @asynccontextmanager
    async def serve_http(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
    ) -> AsyncIterator[str]:
        """Serve streamable HTTP on ``host:port`` (0: a free port) while in the block; yields
        the endpoint's URL. Requests are held to ``turnkeep.doors.hosts``' Host and Origin
        rules, which ``allowed_hosts`` and ``allowed_origins`` extend. Raises ``OSError`` when
        the address cannot be bound."""
        sock = bind(host, port)
        # FastMCP's own Host/Origin check off: the guard, shared by every door, is the one.
        web = self.server.http_app(path=MCP_PATH, host_origin_protection=False)
        guarded = HostOriginGuard(web, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins)
        server = AsgiServer(guarded, name="MCP server")
        # The app's lifespan runs the MCP session manager (and closes the shared sessions).
        async with web.router.lifespan_context(web):
            bound = await server.start(sock)
            try:
                yield f"{http_url(host, bound)}{MCP_PATH}"
            finally:
                await server.stop()

    @asynccontextmanager
    async def _lifespan(self, server: FastMCP) -> AsyncIterator[dict[str, Any]]:
        try:
            yield {}
        finally:
            with anyio.CancelScope(shield=True):
                await self.close()

    async def close(self) -> None:
        """Close the sessions kept for the server's life (their running turns are answered
        first, on the workers)."""
        sessions = [*self._shared.values(), *self._process.values()]
        self._shared, self._process = {}, {}
        for session in sessions:
            await _close_quietly(session)

    async def drain(self, seconds: float) -> int:
        """Wait up to ``seconds`` for the turns this server started to end (a worker
        in the same process stops with it); how many still run."""
        running = [t for t in self._started.values() if await _running(t)]
        if running:
            with anyio.move_on_after(seconds):
                await asyncio.gather(*(_ended(t) for t in running))
        return sum([await _running(t) for t in running])


def mcp_server(
    client: Client,
    settings: Settings,
    *,
    agents: Sequence[str] | None = None,
    scope: InstanceScope = "shared",
    name: str = "turnkeep",
) -> FastMCP:
    """A FastMCP server with ``settings``' agents (or those of ``agents``) as tools, over
    ``client``: serve it with ``run_stdio_async()`` or ``http_app()``. Its turns run on the
    workers of ``settings.task_queue``; run one beside it (``build_workers``) if none polls."""
    return McpDoor(client, settings, agents=agents, scope=scope, name=name).server


# -- helpers ------------------------------------------------------------------------------------


class _OneLineArgumentErrors(Middleware):
    """A tool call's bad arguments told in one line naming the argument and the problem (not
    pydantic's report, which spans lines and echoes the value)."""

    async def on_call_tool(
        self,
        context: MiddlewareContext[mcp_types.CallToolRequestParams],
        call_next: CallNext[mcp_types.CallToolRequestParams, ToolResult],
    ) -> ToolResult:
        try:
            return await call_next(context)
        except FastMcpValidationError as err:
            cause = err.__cause__
            if not isinstance(cause, ValidationError) or not cause.errors():
                raise ToolError(f"invalid arguments for {context.message.name}") from None
            first = cause.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "arguments"
            raise ToolError(
                f"invalid arguments for {context.message.name}: {where}: {first['msg']}"
            ) from None


def _text(result: TurnResult | None) -> str | None:
    return result.final.text if result is not None and result.final is not None else None


def _first_line(err: BaseException) -> str:
    return str(err).strip().partition("\n")[0]


def _cause(err: BaseException) -> str:
    """What refused or failed, in its own words, on one line."""
    cause = err.cause if isinstance(err, WorkflowFailureError | WorkflowUpdateFailedError) else err
    if isinstance(cause, FailureError):
        return _first_line(Exception(describe_failure(cause)))
    if isinstance(cause, RPCError):
        return _first_line(Exception(cause.message))
    return _first_line(cause)


def _session_closed(err: Exception) -> bool:
    """Whether a send failed because the session has ended or is closing (its validator's
    words for the second)."""
    return isinstance(err, SessionClosedError) or "session is closed" in _cause(err)


def _waiting_call(turn_id: str, agent: str, call: PendingCall) -> WaitingCall:
    return WaitingCall(
        turn_id=turn_id,
        agent=agent,
        call_id=call.call_id,
        name=call.name,
        arguments=call.arguments,
        since=call.since,
        child_turn_id=call.turn_id,
        child_agent=call.agent,
    )


async def _running(turn: TurnHandle) -> bool:
    try:
        described = await turn.handle.describe()
    except RPCError:
        return False
    return described.status == WorkflowExecutionStatus.RUNNING


async def _ended(turn: TurnHandle) -> None:
    try:
        await turn.handle.result()
    except Exception:  # how it ended is the status's to tell
        return


async def _cancel_quietly(turn: TurnHandle) -> None:
    try:
        await turn.cancel()
    except RPCError as err:  # it ended meanwhile
        log.debug("cancelling turn %s: %s", turn.workflow_id, err.message)


async def _close_quietly(session: SessionHandle) -> None:
    try:
        await session.close()
    except Exception as err:  # it ended already, or the server went away
        log.debug("closing session %s: %s", session.session_id, type(err).__name__)
