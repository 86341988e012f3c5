"""A provider's rate limits, as the fake API plays them: requests and tokens per minute over a
sliding window of what it answered, a refusal (with how long to wait) beyond them, and the
counts a bench reads (requests answered, refused, the peak in any window).

The tokens a request counts are the ones its answer reports (prompt + completion), so the
window holds exactly what a client is told it used. ``request_tokens`` makes that usage a
function of the request itself (``Tokens(sized=True)``), so a bench can size its workload.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

STATS_PATH = "/fake/stats"
CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and JSON


@dataclass(frozen=True)
class ProviderLimits:
    """What one API key may use: requests and tokens (prompt + completion) per ``window``
    seconds (a minute, as the providers count; tests shorten it)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if self.window <= 0:
            raise ValueError(f"window must be > 0 seconds, got {self.window}")


@dataclass(frozen=True)
class Refusal:
    """Why a request was answered 429: which limit, its value, what the window held, what the
    request needed, and the seconds until the window has room for it."""

    kind: Literal["requests", "tokens"]
    limit: int
    used: int
    requested: int
    retry_after: float


@dataclass(frozen=True)
class LimitStats:
    """What the fake answered since it started (or since its counts were reset)."""

    answered: int = 0  # requests let through (whatever the script answered them with)
    rate_limited: int = 0  # requests answered 429 by the limits
    tokens: int = 0  # prompt + completion tokens of the answers
    peak_requests: int = 0  # the most requests answered in any one window
    peak_tokens: int = 0  # the most tokens answered in any one window
    window: float = 60.0

    @property
    def rate_limited_share(self) -> float:
        asked = self.answered + self.rate_limited
        return self.rate_limited / asked if asked else 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> LimitStats:
        return LimitStats(**{k: data[k] for k in LimitStats.__dataclass_fields__})


def request_tokens(body: Any) -> int:
    """The prompt tokens the fake reports for a request body (``Tokens(sized=True)``): its
    compact JSON's characters / ``CHARS_PER_TOKEN``, rounded up. Deterministic, so a bench that
    pads its messages by ``CHARS_PER_TOKEN`` characters per token knows what it will count."""
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, sort_keys=True)
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def read_stats(base_url: str, timeout: float = 10.0) -> LimitStats:
    """``LimitStats`` of a fake API in another process, over HTTP (``GET /fake/stats``);
    ``base_url`` is its root (``http://127.0.0.1:PORT``), or either API's base URL."""
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(root + STATS_PATH, timeout=timeout) as response:
        return LimitStats.from_json(json.loads(response.read()))


class LimitWindow:
    """The sliding window of answered requests (time, tokens): admits a request if the limits
    leave room for it, and keeps the counts. The server's thread admits; any thread reads."""

    def __init__(self, limits: ProviderLimits | None = None) -> None:
        self._lock = threading.Lock()
        self._limits = limits
        self._reset()

    @property
    def limits(self) -> ProviderLimits | None:
        return self._limits

    def set_limits(self, limits: ProviderLimits | None) -> None:
        """Enforce ``limits`` (None: none) from now on, counting afresh."""
        with self._lock:
            self._limits = limits
            self._reset()

    def reset(self) -> None:
        """Count afresh (the limits stay)."""
        with self._lock:
            self._reset()

    def _reset(self) -> None:
        self._entries: deque[tuple[float, int]] = deque()
        self._window_tokens = 0
        self._stats = LimitStats(window=self._length())

    def _length(self) -> float:
        # Without limits, peaks are still counted per minute, as a provider would.
        return self._limits.window if self._limits is not None else 60.0

    def stats(self) -> LimitStats:
        with self._lock:
            return self._stats

    def admit(self, tokens: int, now: float) -> Refusal | None:
        """Count a request whose answer reports ``tokens`` at ``now`` (monotonic seconds), or,
        if the window has no room for it, count a refusal and say why."""
        with self._lock:
            self._expire(now)
            refusal = self._refusal(tokens, now)
            stats = self._stats
            if refusal is not None:
                self._stats = replace(stats, rate_limited=stats.rate_limited + 1)
                return refusal
            self._entries.append((now, tokens))
            self._window_tokens += tokens
            self._stats = replace(
                stats,
                answered=stats.answered + 1,
                tokens=stats.tokens + tokens,
                # A window's contents peak at one of its requests: the window that ends there.
                peak_requests=max(stats.peak_requests, len(self._entries)),
                peak_tokens=max(stats.peak_tokens, self._window_tokens),
            )
            return None

    def _expire(self, now: float) -> None:
        horizon = now - self._length()
        while self._entries and self._entries[0][0] <= horizon:
            self._window_tokens -= self._entries.popleft()[1]

    def _refusal(self, tokens: int, now: float) -> Refusal | None:
        limits = self._limits
        if limits is None:
            return None
        rpm, tpm = limits.requests_per_minute, limits.tokens_per_minute
        used = len(self._entries)
        if rpm is not None and used >= rpm:
            # Room once all but rpm - 1 of the requests in the window have left it.
            leaving = self._entries[used - rpm][0]
            return Refusal("requests", rpm, used, 1, self._until(leaving, now))
        if tpm is not None and self._window_tokens + tokens > tpm:
            return Refusal(
                "tokens", tpm, self._window_tokens, tokens, self._until_room(tokens, tpm, now)
            )
        return None

    def _until_room(self, tokens: int, tpm: int, now: float) -> float:
        """Seconds until enough of the window's tokens have left it for ``tokens`` more (a
        whole window when the request alone is more than the limit: it never fits)."""
        if tokens > tpm:
            return self._length()
        held = self._window_tokens
        for at, spent in self._entries:
            held -= spent
            if held + tokens <= tpm:
                return self._until(at, now)
        return self._length()  # unreachable: an empty window has room for tokens <= tpm

    def _until(self, at: float, now: float) -> float:
        return max(at + self._length() - now, 0.001)
