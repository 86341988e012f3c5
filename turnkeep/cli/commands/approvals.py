"""The commands about what waits in a turn for a person or a client: ``pending`` lists it
(every turn whose ``TurnkeepStatus`` is ``AwaitingApproval``, each wait with the command that
decides it), ``approve`` decides a tool call (``--always`` remembers it), ``answer`` answers an
MCP server's question, ``submit`` gives a client-side tool's result, ``budget`` raises a budget
or stops the turn at it, ``revoke`` revokes an "always allow" rule of a turn or a session."""

from __future__ import annotations

import asyncio
import getpass
import json
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Annotated, Any, Literal

import typer
from pydantic import BaseModel, Field
from rich.markup import escape
from rich.text import Text
from temporalio.client import Client
from temporalio.service import RPCError

from turnkeep.cli.console import console, print_json
from turnkeep.cli.options import Address, ConfigPath, Namespace
from turnkeep.cli.process import warn_if_unpolled
from turnkeep.cli.render import utc_time, visible
from turnkeep.cli.target import Target
from turnkeep.cli.waits import describe_wait
from turnkeep.client.limits import capacity_waits
from turnkeep.client.sessions import get_session
from turnkeep.client.turns import TurnHandle, get_turn
from turnkeep.contract.approval import AllowRule, DecisionRecord, PendingCall
from turnkeep.contract.limits_io import waiting_text
from turnkeep.contract.session_io import SESSION_WORKFLOW_NAME
from turnkeep.workflows import visibility
from turnkeep.workflows.turn_workflow import WORKFLOW_NAME

app = typer.Typer()


def _who(verb: str) -> Any:
    """The ``--by`` option of a command that ``verb`` (decides, answers...): the name the
    audit trail records."""
    return typer.Option(help=f"Who {verb} (default: the user name).")


AuditedReason = Annotated[str | None, typer.Option(help="Why (kept in the audit trail).")]

AWAITING_QUERY = (
    f"WorkflowType = '{WORKFLOW_NAME}' AND ExecutionStatus = 'Running' AND "
    f"{visibility.STATUS.name} = '{visibility.TurnStatus.AWAITING_APPROVAL.value}'"
)
# A query is answered by a worker of the turn's task queue; without one, say so and go on.
_QUERY_TIMEOUT = timedelta(seconds=10)


class AwaitingTurn(BaseModel):
    """One turn ``pending`` lists: its calls waiting, or why they could not be read."""

    workflow_id: str
    agent: str | None = None
    calls: list[PendingCall]
    error: str | None = None
    # A turn whose model call waits for its limit's capacity (`limits:`): why.
    waiting_for_capacity: str | None = Field(default=None, exclude_if=lambda v: v is None)


async def awaiting_turns(client: Client) -> list[AwaitingTurn]:
    """Every turn waiting for approval (by search attribute), with its waiting calls. A call
    waiting in a child turn is listed under the turn at the top (which lists it with the
    child's turn id), not again under the child."""
    turns: list[AwaitingTurn] = []
    async for execution in client.list_workflows(AWAITING_QUERY):
        agent = execution.typed_search_attributes.get(visibility.AGENT)
        turn = AwaitingTurn(workflow_id=execution.id, agent=agent, calls=[])
        try:
            handle = get_turn(client, execution.id)
            turn.calls = await handle.pending_approvals(rpc_timeout=_QUERY_TIMEOUT)
        except RPCError as err:
            turn.error = f"its calls could not be read (is a worker running?): {err.message}"
        turns.append(turn)
    shown = {call.turn_id for turn in turns for call in turn.calls if call.turn_id is not None}
    turns = [turn for turn in turns if turn.workflow_id not in shown]
    for wait in await capacity_waits(client):
        why = waiting_text(wait.limit, wait.why)
        turns.append(AwaitingTurn(workflow_id=wait.workflow_id, calls=[], waiting_for_capacity=why))
    return turns


@app.command()
def pending(
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the turns as JSON.")] = False,
) -> None:
    """List what waits for a person or a client, in every turn: tool calls awaiting approval,
    questions awaiting an answer, client-side calls awaiting their result, budgets awaiting a
    decision; each with the command that decides it (approve, answer, submit or budget)."""
    target = Target.of(address, namespace, config)
    if json_out:
        console.to_stderr()
    turns = target.run(awaiting_turns)
    if json_out:
        print_json(json.dumps([turn.model_dump(mode="json") for turn in turns], indent=2))
        return
    if not turns:
        console.print("no turn is waiting for a person or a client")
    for turn in turns:
        agent = f" · agent {escape(turn.agent)}" if turn.agent else ""
        console.print(f"[bold]turn[/] {escape(turn.workflow_id)}{agent}")
        if turn.error:
            console.print(f"  [yellow]{escape(turn.error)}[/]")
        if turn.waiting_for_capacity:
            console.print(Text(visible(f"  {turn.waiting_for_capacity}")), soft_wrap=True)
        for call in turn.calls:
            _print_wait(turn.workflow_id, call)


def _print_wait(turn_id: str, call: PendingCall) -> None:
    """One waiting call as ``pending`` lists it: what it waits for, the call (or what the
    budget has spent), since when, what it needs, and the command that decides it."""
    wait = describe_wait(turn_id, call)
    head = f"  waiting for {wait.kind} · {wait.what}{wait.where} · since {utc_time(call.since)}"
    console.print(Text(visible(head)), soft_wrap=True)
    if call.kind != "budget":
        arguments = json.dumps(call.arguments, ensure_ascii=False)
        console.print(Text(visible(f"    arguments: {arguments}")), soft_wrap=True)
    if call.requested_schema:
        fields = ", ".join(_schema_fields(call.requested_schema))
        said = "answer" if call.kind == "elicitation" else "result"
        console.print(Text(visible(f"    {said} fields: {fields}")), soft_wrap=True)
    console.print(Text(visible(f"    decide with: {wait.command}")), soft_wrap=True)


@app.command()
def approve(
    workflow_id: Annotated[str, typer.Argument(metavar="TURN_ID", help="The turn's id.")],
    call_id: Annotated[
        str, typer.Argument(metavar="CALL_ID", help="The tool call awaiting approval.")
    ],
    deny: Annotated[bool, typer.Option("--deny", help="Deny the call instead.")] = False,
    reason: Annotated[str | None, typer.Option(help="Why; the model sees it on a denial.")] = None,
    by: Annotated[str | None, _who("decides")] = None,
    arguments: Annotated[
        str | None,
        typer.Option(help="Run the call with these arguments instead (a JSON object)."),
    ] = None,
    always: Annotated[
        Literal["turn", "session"] | None,
        typer.Option(
            "--always",
            help="Also allow the tool's later calls for the rest of the turn or session.",
        ),
    ] = None,
    same_arguments: Annotated[
        bool,
        typer.Option("--same-arguments", help="With --always: only calls with these arguments."),
    ] = False,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Approve (or with --deny, deny) a tool call awaiting approval. A call waiting in a child
    turn (an agent the turn called as a tool) may be named with the parent turn's id."""
    target = Target.of(address, namespace, config)
    edited = _arguments(arguments)
    if same_arguments and always is None:
        raise typer.BadParameter("--same-arguments goes with --always")

    async def go(turn: TurnHandle) -> DecisionRecord:
        return await turn.decide(
            call_id,
            not deny,
            reason=reason,
            by=by or getpass.getuser(),
            arguments=edited,
            remember=always,
            remember_arguments=same_arguments,
        )

    record = _on_turn(target, workflow_id, go)
    edit = " with edited arguments" if record.arguments is not None else ""
    verb = "approved" if record.approved else "denied"
    console.print(f"{verb} call {escape(record.call_id)} ({escape(record.tool)}){edit}")
    if record.rule is not None:
        console.print(
            f"rule {escape(record.rule)}: {escape(record.tool)} is allowed for the rest of the "
            f"{record.remember} (revoke with: turnkeep revoke {escape(workflow_id)} "
            f"{escape(record.rule)})"
        )


@app.command()
def submit(
    workflow_id: Annotated[str, typer.Argument(metavar="TURN_ID", help="The turn's id.")],
    call_id: Annotated[
        str,
        typer.Argument(metavar="CALL_ID", help="The client-side tool call awaiting its result."),
    ],
    text: Annotated[str | None, typer.Option("--text", help="The result, as text.")] = None,
    json_result: Annotated[
        str | None,
        typer.Option("--json", help="The result as structured content (a JSON object)."),
    ] = None,
    error: Annotated[bool, typer.Option("--error", help="The result is an error.")] = False,
    by: Annotated[str | None, _who("answers")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Submit the result of a client-side tool's call (`--text` or `--json`); a tool with an
    output schema takes `--json` that matches it. To refuse the call, `turnkeep approve TURN
    CALL --deny`."""
    target = Target.of(address, namespace, config)
    if json_result is not None and text is None:
        result: str | dict[str, Any] = _object(json_result, "--json")
    elif text is not None and json_result is None:
        result = text
    else:
        raise typer.BadParameter("give the result with one of --text or --json")

    async def go(turn: TurnHandle) -> DecisionRecord:
        return await turn.submit_tool_result(
            call_id, result, is_error=error, by=by or getpass.getuser()
        )

    record = _on_turn(target, workflow_id, go)
    console.print(f"submitted the result of call {escape(record.call_id)} ({escape(record.tool)})")


@app.command()
def revoke(
    workflow_id: Annotated[str, typer.Argument(metavar="ID", help="A turn's id, or a session's.")],
    rule_id: Annotated[
        str, typer.Argument(metavar="RULE_ID", help="The rule (`turnkeep approve --always` said).")
    ],
    by: Annotated[str | None, _who("revokes")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Revoke an "always allow" rule of a turn, or of a session (for its later turns and the
    one running): the calls it covered wait for a person again."""

    async def go(client: Client) -> AllowRule:
        who = by or getpass.getuser()
        described = await client.get_workflow_handle(workflow_id).describe()
        if described.workflow_type == SESSION_WORKFLOW_NAME:
            return await get_session(client, workflow_id).revoke_allow(rule_id, by=who)
        return await get_turn(client, workflow_id).revoke_allow(rule_id, by=who)

    rule = Target.of(address, namespace, config).run(go)
    console.print(f"revoked rule {escape(rule.id)} ({escape(rule.tool)}): its calls wait again")


def _on_turn(
    target: Target, workflow_id: str, act: Callable[[TurnHandle], Awaitable[DecisionRecord]]
) -> DecisionRecord:
    """``act(turn)`` on turn ``workflow_id``, warning meanwhile when no worker polls its queue
    (the turn takes the update on a worker of its queue)."""

    async def go(client: Client) -> DecisionRecord:
        turn = get_turn(client, workflow_id)
        queue = (await turn.handle.describe()).task_queue
        unpolled = asyncio.ensure_future(
            warn_if_unpolled(
                client, queue, what="the decision", hint="start `turnkeep worker` for the turn"
            )
        )
        try:
            return await act(turn)
        finally:
            unpolled.cancel()

    return target.run(go)


@app.command()
def budget(
    workflow_id: Annotated[
        str, typer.Argument(metavar="TURN_ID", help="The id of the turn at its budget.")
    ],
    raise_to: Annotated[
        float | None,
        typer.Option("--raise", help="Raise the budget to this (tokens or USD, as the budget)."),
    ] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the turn at its budget.")] = False,
    reason: AuditedReason = None,
    by: Annotated[str | None, _who("decides")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Decide on a turn waiting at its budget: raise it (--raise N) or stop the turn (--stop)."""
    if (raise_to is None) == (not stop):
        raise typer.BadParameter("give one of --raise N or --stop")
    if raise_to is not None and raise_to <= 0:
        raise typer.BadParameter(f"--raise takes the new budget, above 0; got {raise_to:g}")
    target = Target.of(address, namespace, config)

    async def go(client: Client) -> None:
        turn = get_turn(client, workflow_id)
        who = by or getpass.getuser()
        if raise_to is not None:
            await turn.raise_budget(raise_to, by=who, reason=reason)
            console.print(f"raised the budget of {escape(workflow_id)} to {raise_to:g}")
        else:
            await turn.stop_at_budget(by=who, reason=reason)
            console.print(f"stopped {escape(workflow_id)} at its budget")

    target.run(go)


@app.command()
def answer(
    workflow_id: Annotated[str, typer.Argument(metavar="TURN_ID", help="The turn's id.")],
    call_id: Annotated[
        str, typer.Argument(help="What waits: `<tool call id>:elicit:<n>` (`turnkeep pending`).")
    ],
    json_content: Annotated[
        str | None,
        typer.Option("--json", help="The answer: a JSON object matching the requested schema."),
    ] = None,
    decline: Annotated[bool, typer.Option("--decline", help="Decline to answer.")] = False,
    cancel: Annotated[bool, typer.Option("--cancel", help="Dismiss the request.")] = False,
    reason: AuditedReason = None,
    by: Annotated[str | None, _who("answers")] = None,
    address: Address = None,
    namespace: Namespace = None,
    config: ConfigPath = None,
) -> None:
    """Answer what an MCP server asked during a tool call (an elicitation): --json with the
    answer, or --decline, or --cancel."""
    if sum((json_content is not None, decline, cancel)) != 1:
        raise typer.BadParameter("give one of --json, --decline or --cancel")
    content = _object(json_content, "--json") if json_content is not None else None
    target = Target.of(address, namespace, config)

    async def go(client: Client) -> None:
        turn = get_turn(client, workflow_id)
        record = await turn.answer_elicitation(
            call_id,
            content,
            decline=decline,
            cancel=cancel,
            reason=reason,
            by=by or getpass.getuser(),
        )
        verb = "answered" if record.approved else ("cancelled" if cancel else "declined")
        console.print(f"{verb} {escape(record.call_id)} ({escape(record.tool)})")

    target.run(go)


def _schema_fields(schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    return [
        f"{name}: {spec.get('type', '?') if isinstance(spec, dict) else '?'}"
        + ("" if name in required else "?")
        for name, spec in props.items()
    ]


def _object(text: str, option: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as err:
        raise typer.BadParameter(f"{option} is not JSON: {err}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"{option} must be a JSON object")
    return value


def _arguments(text: str | None) -> dict[str, Any] | None:
    return None if text is None else _object(text, "--arguments")
