"""The ledger of one limit: who waits, what was granted, what the last minute used. Pure (no
Temporal): the limiter workflow holds one and asks it, at each event, what to grant now and when
to look again, and carries its state when it continues as new.

Rules:

- **Window.** A grant needs the 60 s sliding window (kept two seconds longer, see
  ``WINDOW_MARGIN_SECONDS``) to have room: fewer than ``requests_per_minute`` grants, and the
  estimated tokens fitting ``tokens_per_minute`` (a call alone in an empty window always fits,
  or a request larger than the limit would wait for ever).
- **Pace.** Grants are spread over the minute, not given a minute's worth at once: a request
  bucket refills at ``rpm/60`` per second, a token bucket at ``tpm/60`` per second, each holding
  a small burst (``BURST_SECONDS`` of the rate). So a call that comes later with a higher
  priority waits only for the next slot.
- **Concurrency.** A grant holds a slot until it is settled, or until its lease expires (a turn
  that died never settles).
- **Estimate, then settle.** A grant counts its estimated tokens (the request's size, its
  instruction and tools included, plus its max tokens, else the limit's learned average
  output); the settle replaces the estimate by the provider's usage, in the window and in the
  token bucket.
- **Backoff.** A provider's ``retry-after`` holds every grant until then.
- **Order.** Priority class first (interactive, normal, batch), then the fairness key with the
  fewest grants in the window, then first come, first served. Only the first in that order may
  be granted: nothing overtakes it, or a large request would starve behind small ones.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, Field

from turnkeep.contract.limits_io import CapacityRequest, LimitValues
from turnkeep.contract.turn_io import TaskPriority

WINDOW_SECONDS = 60.0
# A grant leaves the ledger's window this much after the provider's would: a call reaches the
# provider some time after its grant, and a late one followed by a prompt one would otherwise
# put one request too many in the provider's minute.
WINDOW_MARGIN_SECONDS = 2.0
_KEPT = WINDOW_SECONDS + WINDOW_MARGIN_SECONDS
# How much of a minute's rate a bucket holds: the burst a quiet limit allows at once.
BURST_SECONDS = 2.0
# The output a call is estimated to take before the limit has learned any.
DEFAULT_OUTPUT_TOKENS = 500
_RANK: dict[TaskPriority, int] = {"interactive": 0, "normal": 1, "batch": 2}


class Waiter(BaseModel):
    key: str
    workflow_id: str
    run_id: str
    request_id: str
    priority: TaskPriority = "normal"
    fairness_key: str | None = None
    tokens: int  # the estimate
    input_tokens: int = 0
    lease_seconds: float
    seq: int
    asked_at: float


class Lease(BaseModel):
    key: str
    workflow_id: str
    run_id: str
    request_id: str
    tokens: int
    input_tokens: int = 0
    granted_at: float
    expires_at: float


class Used(BaseModel):
    """One grant in the window: when, how many tokens (estimated, then settled), whose."""

    key: str
    at: float
    tokens: int
    fairness_key: str | None = None


class LedgerState(BaseModel):
    waiting: list[Waiter] = Field(default_factory=list)
    leases: dict[str, Lease] = Field(default_factory=dict)
    window: list[Used] = Field(default_factory=list)
    # Bucket levels at `refilled_at` (None: full, before the first grant).
    request_level: float | None = None
    token_level: float | None = None
    refilled_at: float | None = None
    backoff_until: float | None = None
    output_average: float = 0.0
    output_samples: int = 0
    seq: int = 0


class Ledger:
    def __init__(self, values: LimitValues, state: LedgerState | None = None) -> None:
        self.values = values
        self.state = state or LedgerState()

    # -- bucket arithmetic ------------------------------------------------------------

    def _rates(self) -> tuple[float | None, float | None]:
        rpm, tpm = self.values.requests_per_minute, self.values.tokens_per_minute
        return (rpm / WINDOW_SECONDS if rpm else None, tpm / WINDOW_SECONDS if tpm else None)

    def _bursts(self) -> tuple[float, float]:
        rate_r, rate_t = self._rates()
        return (
            max(1.0, (rate_r or 0) * BURST_SECONDS),
            max(1.0, (rate_t or 0) * BURST_SECONDS),
        )

    def _refill(self, now: float) -> None:
        s = self.state
        burst_r, burst_t = self._bursts()
        rate_r, rate_t = self._rates()
        if s.refilled_at is None or s.request_level is None or s.token_level is None:
            s.request_level, s.token_level, s.refilled_at = burst_r, burst_t, now
            return
        elapsed = max(0.0, now - s.refilled_at)
        s.request_level = min(burst_r, s.request_level + elapsed * (rate_r or 0))
        s.token_level = min(burst_t, s.token_level + elapsed * (rate_t or 0))
        s.refilled_at = now

    def _prune(self, now: float) -> None:
        s = self.state
        s.window = [u for u in s.window if u.at > now - _KEPT]
        for key in [k for k, lease in s.leases.items() if lease.expires_at <= now]:
            del s.leases[key]
        if s.backoff_until is not None and s.backoff_until <= now:
            s.backoff_until = None

    # -- what the turns do ------------------------------------------------------------

    def estimate(self, request: CapacityRequest) -> int:
        """The tokens a call is counted at until it settles."""
        if not self.values.tokens_per_minute:
            return 0
        output = (
            round(self.state.output_average) if self.state.output_samples else DEFAULT_OUTPUT_TOKENS
        )
        if request.max_output_tokens is not None:
            output = min(output, request.max_output_tokens)
        return request.input_tokens + output

    def ask(self, request: CapacityRequest, now: float) -> None:
        """Queue ``request`` (once: asking again with the same key changes nothing)."""
        s = self.state
        key = request.key
        if key in s.leases or any(w.key == key for w in s.waiting):
            return
        s.seq += 1
        s.waiting.append(
            Waiter(
                key=key,
                workflow_id=request.workflow_id,
                run_id=request.run_id,
                request_id=request.request_id,
                priority=request.priority,
                fairness_key=request.fairness_key,
                tokens=self.estimate(request),
                input_tokens=request.input_tokens,
                lease_seconds=request.lease_seconds,
                seq=s.seq,
                asked_at=now,
            )
        )

    def is_granted(self, key: str) -> bool:
        return key in self.state.leases

    def idle(self, now: float) -> bool:
        """Nothing waits, holds a grant, counts in the window or backs off: nothing to keep."""
        s = self.state
        self._prune(now)
        return not (s.waiting or s.leases or s.window or s.backoff_until)

    def has_granted(self, key: str) -> bool:
        """Whether ``key`` holds a grant, or had one within the window (a lease that expired
        before its call ended still settles its tokens)."""
        return key in self.state.leases or any(u.key == key for u in self.state.window)

    def is_known(self, key: str) -> bool:
        return key in self.state.leases or any(w.key == key for w in self.state.waiting)

    def withdraw(self, key: str, now: float) -> None:
        """The turn no longer wants ``key``: a waiter leaves the queue; a grant it had (that
        crossed the withdrawal) frees its slot, its window entry kept (it may have run)."""
        s = self.state
        s.waiting = [w for w in s.waiting if w.key != key]
        s.leases.pop(key, None)

    def drop(self, key: str) -> None:
        """A grant that never reached its turn (closed): as if never given."""
        s = self.state
        lease = s.leases.pop(key, None)
        if lease is None:
            return
        s.window = [u for u in s.window if u.key != key]
        if s.request_level is not None:
            s.request_level += 1
        if s.token_level is not None:
            s.token_level += lease.tokens

    def settle(self, key: str, used: int | None, retry_after: float | None, now: float) -> None:
        """The call of ``key`` ended: its slot is free, its tokens are what it ``used`` (None:
        the provider reported nothing, the estimate stands); with ``retry_after``, every grant
        waits that long."""
        s = self.state
        self._refill(now)
        lease = s.leases.pop(key, None)
        if used is not None:
            for entry in s.window:
                if entry.key == key:
                    if s.token_level is not None:
                        burst_t = self._bursts()[1]
                        s.token_level = min(burst_t, s.token_level + entry.tokens - used)
                    entry.tokens = used
            if lease is not None and self.values.tokens_per_minute:
                # The output part is what the next estimates learn from.
                output = max(0, used - lease.input_tokens)
                s.output_samples += 1
                s.output_average += (output - s.output_average) / min(s.output_samples, 50)
        if retry_after is not None and retry_after > 0:
            until = now + retry_after
            s.backoff_until = max(s.backoff_until or 0.0, until)

    # -- granting ---------------------------------------------------------------------

    def _ordered(self) -> list[Waiter]:
        recent: dict[str | None, int] = {}
        for entry in self.state.window:
            recent[entry.fairness_key] = recent.get(entry.fairness_key, 0) + 1
        return sorted(
            self.state.waiting,
            key=lambda w: (_RANK[w.priority], recent.get(w.fairness_key, 0), w.seq),
        )

    def _blocked(self, waiter: Waiter, now: float) -> str | None:
        """Which dimension holds ``waiter`` back now (None: it may be granted)."""
        s, v = self.state, self.values
        if s.backoff_until is not None and s.backoff_until > now:
            return "backoff"
        if v.concurrency is not None and len(s.leases) >= v.concurrency:
            return "concurrency"
        if v.requests_per_minute is not None and (
            len(s.window) >= v.requests_per_minute or (s.request_level or 0) < 1
        ):
            return "requests"
        if v.tokens_per_minute is not None:
            in_window = sum(u.tokens for u in s.window)
            if in_window and in_window + waiter.tokens > v.tokens_per_minute:
                return "tokens"
            if (s.token_level or 0) < min(waiter.tokens, self._bursts()[1]):
                return "tokens"
        return None

    def grants(self, now: float) -> list[Lease]:
        """Grant what may be granted now, in order; the leases given."""
        self._prune(now)
        self._refill(now)
        s = self.state
        given: list[Lease] = []
        while s.waiting:
            waiter = self._ordered()[0]
            if self._blocked(waiter, now) is not None:
                break
            s.waiting.remove(waiter)
            lease = Lease(
                key=waiter.key,
                workflow_id=waiter.workflow_id,
                run_id=waiter.run_id,
                request_id=waiter.request_id,
                tokens=waiter.tokens,
                input_tokens=waiter.input_tokens,
                granted_at=now,
                expires_at=now + waiter.lease_seconds,
            )
            s.leases[waiter.key] = lease
            s.window.append(
                Used(key=waiter.key, at=now, tokens=waiter.tokens, fairness_key=waiter.fairness_key)
            )
            if s.request_level is not None:
                s.request_level -= 1
            if s.token_level is not None and self.values.tokens_per_minute:
                s.token_level -= waiter.tokens
            given.append(lease)
        return given

    def next_check(self, now: float) -> float | None:
        """When the first waiter might be granted without any event (a timer's due time);
        None: only an event (a settle, a new request) can change anything."""
        s, v = self.state, self.values
        if not s.waiting:
            return None
        waiter = self._ordered()[0]
        times: list[float] = []
        if s.backoff_until is not None and s.backoff_until > now:
            times.append(s.backoff_until)
        if v.concurrency is not None and len(s.leases) >= v.concurrency and s.leases:
            times.append(min(lease.expires_at for lease in s.leases.values()))
        rate_r, rate_t = self._rates()
        if v.requests_per_minute is not None and rate_r:
            if len(s.window) >= v.requests_per_minute:
                times.append(s.window[0].at + _KEPT)
            level = s.request_level or 0
            if level < 1:
                times.append(now + (1 - level) / rate_r)
        if v.tokens_per_minute is not None and rate_t:
            in_window = sum(u.tokens for u in s.window)
            if in_window and in_window + waiter.tokens > v.tokens_per_minute:
                times.append(self._window_room(waiter.tokens, v.tokens_per_minute))
            need = min(waiter.tokens, self._bursts()[1])
            level = s.token_level or 0
            if level < need:
                times.append(now + (need - level) / rate_t)
        if not times:
            return None
        # The latest of what holds it: each is needed; a small step past it so that the
        # float arithmetic of the refill does not leave it a hair short.
        return max(max(times), now) + 0.001

    def _window_room(self, tokens: int, limit: int) -> float:
        """When enough of the window's entries have left it for ``tokens`` to fit."""
        total = sum(u.tokens for u in self.state.window)
        for entry in self.state.window:
            total -= entry.tokens
            if total == 0 or total + tokens <= limit:
                return entry.at + _KEPT
        return self.state.window[-1].at + _KEPT

    # -- what it shows ----------------------------------------------------------------

    def in_use(self, now: float) -> tuple[int, int]:
        """Requests and tokens in the window now."""
        self._prune(now)
        return len(self.state.window), sum(u.tokens for u in self.state.window)

    def why(self, key: str, now: float) -> str:
        """Why ``key`` waits, in a few words: ``58/60 rpm``, ``39500/40000 tpm``, ``50/50
        concurrency``, ``backing off until 12:00:03 UTC``, with how many wait before it."""
        self._prune(now)
        self._refill(now)
        order = self._ordered()
        position = next((i for i, w in enumerate(order) if w.key == key), None)
        if position is None:
            return "granted" if key in self.state.leases else "unknown request"
        head = order[0]
        blocked = self._blocked(head, now) or "requests"
        text = self.dimension(blocked)
        return f"{text} · {position} ahead" if position else text

    def waiters(self, limit: int = 100) -> list[tuple[Waiter, str]]:
        """The first ``limit`` waiters in grant order, each with why it waits (reads only: for
        a query)."""
        order = self._ordered()
        if not order:
            return []
        now = self.state.refilled_at or 0.0
        text = self.dimension(self._blocked(order[0], now) or "requests")
        return [(w, f"{text} · {i} ahead" if i else text) for i, w in enumerate(order[:limit])]

    def dimension(self, which: str) -> str:
        s, v = self.state, self.values
        if which == "backoff" and s.backoff_until is not None:
            until = datetime.fromtimestamp(s.backoff_until, UTC).strftime("%H:%M:%S UTC")
            return f"backing off until {until}"
        if which == "concurrency" and v.concurrency is not None:
            return f"{len(s.leases)}/{v.concurrency} concurrency"
        if which == "tokens" and v.tokens_per_minute is not None:
            return f"{sum(u.tokens for u in s.window)}/{v.tokens_per_minute} tpm"
        if v.requests_per_minute is not None:
            return f"{len(s.window)}/{v.requests_per_minute} rpm"
        if v.tokens_per_minute is not None:
            return f"{sum(u.tokens for u in s.window)}/{v.tokens_per_minute} tpm"
        return f"{len(s.leases)}/{v.concurrency} concurrency"

    def summary(self, name: str, now: float) -> str:
        """The limiter's own details: usage of each dimension, queue and backoff."""
        requests, tokens = self.in_use(now)
        v, s = self.values, self.state
        parts = []
        if v.requests_per_minute:
            parts.append(f"{requests}/{v.requests_per_minute} rpm")
        if v.tokens_per_minute:
            parts.append(f"{tokens}/{v.tokens_per_minute} tpm")
        if v.concurrency:
            parts.append(f"{len(s.leases)}/{v.concurrency} concurrency")
        parts.append(f"{len(s.waiting)} waiting")
        if s.backoff_until is not None and s.backoff_until > now:
            parts.append(self.dimension("backoff"))
        return f"**limit {name}** · " + " · ".join(parts)
