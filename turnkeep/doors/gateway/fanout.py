"""Server-sent events fanned out: ONE follower per turn or session in the gateway process
(``TurnHandle.stream`` / ``SessionHandle.stream``), whatever the number of watchers. Temporal
buffers few queries per workflow, and each follower asks its workflow by query: a thousand
watchers each following on their own would be a thousand pollers of one workflow.

A feed keeps the events of the messages it has seen (encoded once, shared by every watcher),
the live text since the last message, and the last ``approval`` and ``end`` events; a watcher
that joins late, or comes back with ``Last-Event-ID``, is given those first. Each watcher has a
bounded queue: one that falls ``buffer`` events behind is disconnected (it resumes from its
last message), so a slow reader never makes the gateway hold more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError

from turnkeep.client.live import MessageEvent, Restarted, StreamEvent, TextDelta, ToolCallStart
from turnkeep.client.queries import query_retrying
from turnkeep.client.sessions import get_session
from turnkeep.client.status import describe_failure
from turnkeep.client.turns import get_turn
from turnkeep.contract.approval import PendingCall
from turnkeep.doors.gateway.access import Kind
from turnkeep.doors.gateway.models import (
    ApprovalData,
    EndData,
    MessageData,
    RestartedData,
    TextData,
    ToolCallData,
)
from turnkeep.support.sse import encode_comment, encode_event
from turnkeep.workflows import visibility
from turnkeep.workflows.session_workflow import SessionWorkflow

log = logging.getLogger(__name__)

# How long a feed nobody watches keeps following (a page reloading comes back within it),
# and how long an ended feed stays to answer late watchers from memory.
LINGER_SECONDS = 10.0
# How often the approval watcher looks at the turn (a describe, answered by the server alone;
# it asks the worker only once the history has grown).
APPROVAL_POLL_SECONDS = 0.25
APPROVAL_POLL_MAX = 1.0
# A comment line to every watcher this often, so proxies and clients keep idle streams open.
PING_SECONDS = 15.0
_PING = encode_comment("ping")
# Events sent in one write at most.
_BATCH = 64
# How soon a feed whose follower failed while its workflow still runs follows it again (a
# worker restarting: nobody answers its queries for a while), doubling up to the most.
REFOLLOW_SECONDS = 0.5
REFOLLOW_MAX = 5.0


@dataclass(frozen=True)
class Event:
    """One server-sent event, encoded once for every watcher."""

    kind: str
    frame: bytes
    index: int | None = None  # a message's index in the transcript
    count: int = 0  # how many messages the feed had when it was published
    waiting: bool = False  # an approval event with calls


def encode(kind: str, data: BaseModel, event_id: int | None = None) -> bytes:
    return encode_event(kind, data.model_dump_json(), event_id=event_id)


_DROPPED = Event(kind="dropped", frame=b"")


class Watcher:
    def __init__(self, start: int, buffer: int) -> None:
        self.start = start  # the first message index it wants
        self.queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=buffer)
        self.dropped = False

    def offer(self, event: Event) -> None:
        if self.dropped:
            return
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            # Too far behind: what it has queued is let go, and its stream ends. The browser
            # (or any SSE client) reconnects with Last-Event-ID and catches up from the feed.
            self.dropped = True
            while not self.queue.empty():
                self.queue.get_nowait()
            self.queue.put_nowait(_DROPPED)

    def wants(self, event: Event) -> bool:
        if event.index is not None:
            if event.index < self.start:
                return False
            self.start = event.index + 1
            return True
        if event.kind in ("text", "tool_call", "restarted"):
            # Live text belongs after every message before it: not for a watcher still
            # missing some (it resumed ahead of this feed).
            return event.count >= self.start
        return True


@dataclass
class Feed:
    kind: Kind
    workflow_id: str
    messages: list[Event] = field(default_factory=list)
    live: list[Event] = field(default_factory=list)  # text since the last message
    approval: Event | None = None
    end: Event | None = None
    watchers: set[Watcher] = field(default_factory=set)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    idle: asyncio.TimerHandle | None = None
    # A session's turns that have ended: (turn number, where it ends in the transcript).
    turn_ends: list[tuple[int, int]] = field(default_factory=list)
    ended_upto: int = 0
    next_turn: int = 1
    waiting_turn: str | None = None  # the turn the last approval event was about
    live_call: int | None = None  # the model call the live text since the last message is of

    def publish(self, event: Event) -> None:
        if event.index is not None:
            self.messages.append(event)
            self.live.clear()
        elif event.kind in ("text", "tool_call", "restarted"):
            self.live.append(event)
        elif event.kind == "approval":
            self.approval = event
        elif event.kind == "end":
            self.end = event
        for watcher in tuple(self.watchers):
            watcher.offer(event)

    def backlog(self, start: int) -> list[Event]:
        events = self.messages[start:]
        if start <= len(self.messages):
            events = [*events, *self.live]
        if self.approval is not None and self.approval.waiting:
            events.append(self.approval)
        if self.end is not None:
            events.append(self.end)
        return events


class TooManyWatchers(Exception):
    pass


class Hub:
    """Every feed of one gateway process."""

    def __init__(
        self,
        client: Client,
        *,
        buffer: int = 1024,
        max_watchers: int = 10_000,
        linger: float = LINGER_SECONDS,
    ) -> None:
        self.client = client
        self.buffer = buffer
        self.max_watchers = max_watchers
        self.linger = linger
        self.feeds: dict[tuple[Kind, str], Feed] = {}
        self.watching = 0

    def watch(self, kind: Kind, workflow_id: str, start: int) -> AsyncIterator[bytes]:
        """The events of the turn or session from message index ``start`` on, as encoded
        frames, until its end (or until the watcher falls behind). Raises
        ``TooManyWatchers`` at the gateway's limit.

        The watcher subscribes when the stream is first read: a response never sent (its
        client gone first) leaves nothing behind. It misses nothing meanwhile: the feed keeps
        every message, the live text since the last, and the last approval and end."""
        if self.watching >= self.max_watchers:
            raise TooManyWatchers()
        self._feed(kind, workflow_id)
        return self._events(kind, workflow_id, start)

    def _feed(self, kind: Kind, workflow_id: str) -> Feed:
        feed = self.feeds.get((kind, workflow_id))
        if feed is None:
            feed = self._open(kind, workflow_id)
            self._idle(feed)  # until its first watcher comes
        return feed

    async def _events(self, kind: Kind, workflow_id: str, start: int) -> AsyncIterator[bytes]:
        feed = self._feed(kind, workflow_id)
        if feed.idle is not None:
            feed.idle.cancel()
            feed.idle = None
        watcher = Watcher(start, self.buffer)
        backlog = feed.backlog(start)
        ended = feed.end is not None  # the backlog ends with it
        if not ended:
            feed.watchers.add(watcher)
        self.watching += 1
        try:
            for event in backlog:
                if watcher.wants(event):
                    yield event.frame
            if ended:
                return
            while True:
                # What has queued up meanwhile goes out in one write: a watcher that fell a
                # little behind catches up in fewer, larger sends.
                events = [await watcher.queue.get()]
                while not watcher.queue.empty() and len(events) < _BATCH:
                    events.append(watcher.queue.get_nowait())
                frames = [e.frame for e in events if e is not _DROPPED and watcher.wants(e)]
                if frames:
                    yield b"".join(frames)
                if any(e is _DROPPED or e.kind == "end" for e in events):
                    return
        finally:
            self.watching -= 1
            feed.watchers.discard(watcher)
            if not feed.watchers:
                self._idle(feed)

    def _open(self, kind: Kind, workflow_id: str) -> Feed:
        feed = Feed(kind=kind, workflow_id=workflow_id)
        self.feeds[(kind, workflow_id)] = feed
        follow: Callable[[Feed], Coroutine[Any, Any, None]] = (
            self._follow_turn if kind == "turn" else self._follow_session
        )
        feed.tasks.append(asyncio.create_task(self._run(feed, follow)))
        feed.tasks.append(asyncio.create_task(self._approvals(feed)))
        return feed

    def _idle(self, feed: Feed) -> None:
        if feed.idle is None:
            feed.idle = asyncio.get_running_loop().call_later(self.linger, self._close, feed)

    def _close(self, feed: Feed) -> None:
        if feed.watchers:
            return
        if self.feeds.get((feed.kind, feed.workflow_id)) is feed:
            del self.feeds[(feed.kind, feed.workflow_id)]
        for task in feed.tasks:
            task.cancel()

    async def aclose(self) -> None:
        tasks = [task for feed in self.feeds.values() for task in feed.tasks]
        for feed in list(self.feeds.values()):
            if feed.idle is not None:
                feed.idle.cancel()
            for watcher in tuple(feed.watchers):
                watcher.offer(_DROPPED)
        self.feeds.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _run(self, feed: Feed, follow: Callable[[Feed], Coroutine[Any, Any, None]]) -> None:
        try:
            await self._follow_while_running(feed, follow)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            # The watchers are told, and the next one starts a new feed.
            log.warning(
                "following %s %s failed: %s", feed.kind, feed.workflow_id, type(err).__name__
            )
            feed.publish(
                Event(
                    kind="end",
                    frame=encode(
                        "end",
                        EndData(
                            status="unknown",
                            error=f"the gateway lost the {feed.kind}: {type(err).__name__}",
                        ),
                    ),
                )
            )
            if self.feeds.get((feed.kind, feed.workflow_id)) is feed:
                del self.feeds[(feed.kind, feed.workflow_id)]
        finally:
            for task in feed.tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            if not feed.watchers:
                self._idle(feed)

    async def _follow_while_running(
        self, feed: Feed, follow: Callable[[Feed], Coroutine[Any, Any, None]]
    ) -> None:
        """``follow`` the feed's workflow, and follow it again from the feed's last message
        when the follower fails while the workflow still runs: its queries go unanswered while
        a worker restarts, and that is no end of the turn or session for its watchers."""
        pause = REFOLLOW_SECONDS
        while True:
            try:
                await follow(feed)
                return
            except (RPCError, WorkflowQueryFailedError) as err:
                if not await self._running(feed):
                    raise
                log.info(
                    "following %s %s again after %s",
                    feed.kind,
                    feed.workflow_id,
                    type(err).__name__,
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, REFOLLOW_MAX)
            if feed.live and feed.live_call is not None:
                # The running call's live text comes again from its start: watchers drop theirs.
                again = RestartedData(call_index=feed.live_call)
                count = len(feed.messages)
                feed.publish(Event(kind="restarted", frame=encode("restarted", again), count=count))

    async def _running(self, feed: Feed) -> bool:
        try:
            described = await self.client.get_workflow_handle(feed.workflow_id).describe()
        except RPCError:
            return False
        return described.status == WorkflowExecutionStatus.RUNNING

    def _publish_stream_event(
        self, feed: Feed, event: StreamEvent, turn_id: str | None = None
    ) -> None:
        count = len(feed.messages)
        if isinstance(event, MessageEvent):
            turn_id = feed.workflow_id if feed.kind == "turn" else turn_id
            data = MessageData(index=count, message=event.message, turn_id=turn_id)
            feed.publish(
                Event(
                    kind="message", frame=encode("message", data, count), index=count, count=count
                )
            )
        elif isinstance(event, TextDelta):
            feed.live_call = event.call_index
            text = TextData(text=event.text, call_index=event.call_index)
            feed.publish(Event(kind="text", frame=encode("text", text), count=count))
        elif isinstance(event, ToolCallStart):
            call = ToolCallData(name=event.name, call_id=event.call_id)
            feed.publish(Event(kind="tool_call", frame=encode("tool_call", call), count=count))
        elif isinstance(event, Restarted):
            again = RestartedData(call_index=event.call_index)
            feed.publish(Event(kind="restarted", frame=encode("restarted", again), count=count))

    async def _follow_turn(self, feed: Feed) -> None:
        turn = get_turn(self.client, feed.workflow_id)
        async for event in turn.stream(len(feed.messages), every=True):
            self._publish_stream_event(feed, event)
        status, error = await turn_outcome(self.client, feed.workflow_id)
        self._end(feed, status, error)

    async def _follow_session(self, feed: Feed) -> None:
        session = get_session(self.client, feed.workflow_id)
        async for event in session.stream(len(feed.messages)):
            turn_id = None
            if isinstance(event, MessageEvent):
                turn_id = await self._session_turn(feed, len(feed.messages))
            self._publish_stream_event(feed, event, turn_id)
        described = await session.handle.describe()
        self._end(feed, _status_name(described.status), None)

    async def _session_turn(self, feed: Feed, index: int) -> str | None:
        """The turn of the session's message ``index``: an ended turn's by where each ended
        (asked once per turn), else the running turn's. Asked once per message of the feed,
        not per watcher."""
        session = get_session(self.client, feed.workflow_id)
        try:
            # Twice at most: a turn that ends between the two asks is found by its end.
            for _ in range(2):
                while feed.ended_upto <= index:
                    end = await query_retrying(
                        session.handle, SessionWorkflow.turn_end, feed.next_turn
                    )
                    if end is None:
                        break  # not ended yet
                    feed.turn_ends.append((feed.next_turn, end))
                    feed.ended_upto = end
                    feed.next_turn += 1
                for turn, end in feed.turn_ends:
                    if index < end:
                        return f"{feed.workflow_id}/turn-{turn}"
                progress = await session.progress()
                if progress.turn is not None and progress.turn.start <= index:
                    return progress.turn.workflow_id
                if progress.turns_ended < feed.next_turn:
                    return None
        except (RPCError, WorkflowQueryFailedError):
            return None
        return None

    def _end(self, feed: Feed, status: str, error: str | None) -> None:
        if feed.approval is not None and feed.approval.waiting and feed.waiting_turn:
            self._publish_approval(feed, feed.waiting_turn, [])
        feed.publish(Event(kind="end", frame=encode("end", EndData(status=status, error=error))))

    async def _approvals(self, feed: Feed) -> None:
        """Publish ``approval`` each time the calls waiting in the turn (in a session, its
        running turn) change: the turn's ``TurnkeepStatus`` says when it waits (published at
        once when a call starts waiting); its calls are asked of it only then, and only once
        its history has grown."""
        shown: list[PendingCall] = []  # what was last published for feed.waiting_turn
        asked: tuple[str, int] | None = None  # the turn and history length last asked at
        pinged = time.monotonic()
        delay = APPROVAL_POLL_SECONDS
        running: tuple[int, str | None] | None = None  # a session's history length, its turn
        while feed.end is None:
            await asyncio.sleep(delay)
            if time.monotonic() - pinged >= PING_SECONDS:
                feed.publish(Event(kind="ping", frame=_PING))
                pinged = time.monotonic()
            moved = False
            if feed.kind == "turn":
                turn_id: str | None = feed.workflow_id
            else:
                try:
                    now = await self._running_turn(feed, running)
                except (RPCError, WorkflowQueryFailedError):
                    continue
                moved, running = now != running, now
                turn_id = running[1]
            if feed.waiting_turn not in (None, turn_id) and shown:
                # The turn that waited has ended (a session's next turn runs): none waits there.
                self._publish_approval(feed, feed.waiting_turn, [])
                shown = []
            calls: list[PendingCall] | None = None
            if turn_id is not None:
                was_waiting = feed.waiting_turn == turn_id and bool(shown)
                try:
                    calls, now_asked = await self._waiting(turn_id, was_waiting, asked)
                except (RPCError, WorkflowQueryFailedError):
                    continue  # asked again at the next look
                moved, asked = moved or now_asked != asked, now_asked
            # Looked at more seldom while nothing happens (a turn waiting for a person, an
            # idle session), at once again when something does.
            delay = APPROVAL_POLL_SECONDS if moved else min(delay * 2, APPROVAL_POLL_MAX)
            if calls is None or turn_id is None:
                continue
            if feed.waiting_turn != turn_id:
                feed.waiting_turn, shown = turn_id, []
            if calls != shown:
                self._publish_approval(feed, turn_id, calls)
                shown = calls

    def _publish_approval(self, feed: Feed, turn_id: str, calls: list[PendingCall]) -> None:
        data = ApprovalData(turn_id=turn_id, calls=calls)
        feed.publish(Event(kind="approval", frame=encode("approval", data), waiting=bool(calls)))

    async def _waiting(
        self, turn_id: str, was_waiting: bool, asked: tuple[str, int] | None
    ) -> tuple[list[PendingCall] | None, tuple[str, int] | None]:
        """The calls waiting in ``turn_id`` now (None when nothing can have changed since the
        last look), and where it was asked."""
        handle = get_turn(self.client, turn_id)
        described = await handle.handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            return [], asked
        length = described.history_length
        if asked == (turn_id, length):
            return None, asked
        status = described.typed_search_attributes.get(visibility.STATUS)
        if (
            status is not None
            and status != visibility.TurnStatus.AWAITING_APPROVAL.value
            and not was_waiting
        ):
            return [], (turn_id, length)
        return await handle.pending_approvals(), (turn_id, length)

    async def _running_turn(
        self, feed: Feed, known: tuple[int, str | None] | None
    ) -> tuple[int, str | None]:
        """The session's history length and its running turn, asked of the session (a query,
        which its worker answers) only once its history has grown since ``known``."""
        session = get_session(self.client, feed.workflow_id)
        described = await session.handle.describe()
        if known is not None and described.history_length == known[0]:
            return known
        if described.status != WorkflowExecutionStatus.RUNNING:
            return described.history_length, None
        progress = await session.progress()
        turn = progress.turn.workflow_id if progress.turn is not None else None
        return described.history_length, turn


_STATUS = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
}


def _status_name(status: WorkflowExecutionStatus | None) -> str:
    return _STATUS.get(status, "running") if status is not None else "running"


async def turn_outcome(client: Client, turn_id: str) -> tuple[str, str | None]:
    """A turn's status name, and the error it ended with (None unless it failed or was
    cancelled, terminated, timed out)."""
    handle = client.get_workflow_handle(turn_id)
    described = await handle.describe()
    status = _status_name(described.status)
    if status in ("running", "completed"):
        return status, None
    if status != "failed":
        return status, _ENDED[status]
    try:
        await handle.result()
    except WorkflowFailureError as err:
        # In the failure's own words: an activity's error without its wrapper.
        cause = describe_failure(err.cause) if err.cause else str(err)
        return status, " ".join(cause.split()) or "the turn failed"
    except Exception as err:
        return status, f"the turn failed: {type(err).__name__}"
    return status, None


_ENDED = {
    "cancelled": "the turn was cancelled",
    "terminated": "the turn was terminated",
    "timed_out": "the turn timed out",
}
