"""The gateway's limits: requests per key (a token bucket), the size of a request's body, and
how many watchers it serves at once."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from turnkeep.doors.gateway.errors import ApiError

# Buckets remembered at most: a caller cycling through addresses cannot grow them past this
# (the least recently seen go first; a forgotten bucket starts full again).
MAX_BUCKETS = 10_000

M = TypeVar("M", bound=BaseModel)


class RateLimiter:
    """A token bucket per caller: ``burst`` requests at once, refilled at ``per_second``."""

    def __init__(self, per_second: float, burst: int, *, max_buckets: int = MAX_BUCKETS) -> None:
        self.per_second = per_second
        self.burst = float(burst)
        self._max = max_buckets
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def wait_for(self, caller: str) -> float:
        """Take a request from ``caller``'s bucket: 0 when allowed, else how many seconds
        until it would be."""
        now = time.monotonic()
        tokens, at = self._buckets.pop(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - at) * self.per_second)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.per_second
        self._buckets[caller] = (tokens, now)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)
        return wait


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body, refused (413) past ``limit`` bytes before more is read."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "the Content-Length header is not a number") from None
        if size > limit:
            raise ApiError(413, f"the request body is over the gateway's {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over the gateway's {limit} bytes")
    return bytes(body)


async def read_json(request: Request, model: type[M], limit: int) -> M:
    """The body as ``model``: 413 past ``limit``, 400 for what is not JSON, 422 naming the
    first field that does not fit (never quoting the value, which may be anything)."""
    body = await read_body(request, limit)
    if not body.strip():
        raise ApiError(400, "the request has no body; send a JSON object")
    try:
        # Strict: a JSON value of the type the document gives, not one pydantic would coerce
        # (`0` for false, `"3"` for 3), which the document does not allow.
        return model.model_validate_json(body, strict=True)
    except ValidationError as err:
        raise ApiError(_status(err), describe(err)) from None


def _status(err: ValidationError) -> int:
    return 400 if any(e["type"] in ("json_invalid", "json_type") for e in err.errors()) else 422


def describe(err: ValidationError) -> str:
    """A validation error in one line: the first problem's field and message."""
    errors = err.errors(include_input=False, include_url=False)
    if not errors:
        return "the request body is not valid"
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"the request body is not valid JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    if first["type"] == "model_type":
        return "the request body must be a JSON object"
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {first['msg']}{more}"
