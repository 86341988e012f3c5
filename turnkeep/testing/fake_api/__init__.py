"""A fake Anthropic / OpenAI API over real HTTP on 127.0.0.1, for tests and benchmarks.

It speaks ``POST /v1/messages`` (Anthropic) and ``POST /v1/chat/completions`` (OpenAI), both
non-streaming and (a request with ``stream``) as server-sent events the way the real APIs
stream, answering from a script of steps, one per request, in order, per API (or per model:
see below)::

    with FakeModelApi() as fake:
        fake.script(
            Reply.error(429, "slow down", headers={"retry-after": "2"}),
            Reply.tool_calls(("call_1", "srv__tool", {"a": 1})),
            Reply.delay(0.5, then=Reply.text("done", usage=Tokens(input=100, output=7))),
        )
        client = AsyncAnthropic(api_key="k", base_url=fake.base_url_anthropic)
        ...
        assert fake.requests[0].body["messages"] == [...]

It records every request (JSON body, headers, arrival time) for assertions.

A script of its own for one model id (the ``model`` a request names) answers that model's
requests, whichever API they come by, so agents with different fake models each follow their
own script in one worker (``FakeModel`` builds on it)::

    fake.script(Reply.text("from A"), model="agent-a")

A streamed answer can misbehave as some OpenAI-compatible servers and proxies do
(``streamed_as``): answer with the whole non-streamed body (``"json"``), or end the stream
cleanly without its closing event (``"no_done"``: no ``[DONE]`` / ``message_stop``) or without
its stop reason either (``"no_stop"``: no ``finish_reason`` chunk / ``message_delta``)::

    fake.script(Reply.text("whole", streamed_as="json"))

``refuse_field`` plays a server that does not know a request field (an OpenAI-compatible one
refusing ``stream_options``, say): every request carrying it gets a 400 naming the field::

    fake.refuse_field("stream_options")

``mount`` serves an API under a provider's own path too, optionally only to requests carrying
its auth header (others get a 401 in the API's shape, without using up a script step)::

    base_url = fake.mount("/openai/deployments/", auth=("api-key", KEY))

It is a tiny HTTP/1.1 server on asyncio streams rather than an ASGI app, because it must be able
to hang up without answering (``Reply.drop()``), which ASGI servers turn into a 500. It runs on
its own event loop in a daemon thread, so it works the same under any test loop scope, and a
``Reply.delay`` ends early when the client gives up waiting, so shutdown never waits on it.

``limits`` plays a provider's rate limits: requests and tokens (prompt + completion, as the
answers report them) per minute over a sliding window; beyond them a request gets a 429 in its
API's shape with ``retry-after`` (and OpenAI's ``retry-after-ms``) and uses up no step. It
counts what it answered, refused and the peaks in any window, in process and over HTTP
(``GET /fake/stats``, ``read_stats``); ``Tokens(sized=True)`` reports a request's own size
(its JSON's characters / 4) as its prompt tokens, so a bench can size its workload::

    fake.limit(ProviderLimits(requests_per_minute=120, tokens_per_minute=40_000))
    fake.script(Reply.text("done", usage=Tokens(output=50, sized=True)))
    fake.limit_stats().rate_limited

Its modules: ``steps`` (the script DSL: ``Reply`` and the steps it builds), ``scripts`` (which
step answers a request, and the requests recorded), ``server`` (``FakeModelApi``), ``limits``
(a provider's rate limits: the window and its counts), ``http1`` (HTTP/1.1 and server-sent
events on asyncio streams), ``wire`` (what the two wire formats share) and one module per wire
format, ``anthropic`` and ``openai``.
"""

from __future__ import annotations

from turnkeep.testing.fake_api.limits import (
    LimitStats,
    ProviderLimits,
    Refusal,
    read_stats,
    request_tokens,
)
from turnkeep.testing.fake_api.scripts import Recorded
from turnkeep.testing.fake_api.server import FakeModelApi
from turnkeep.testing.fake_api.steps import (
    Answer,
    Api,
    Delay,
    Drop,
    Failure,
    Raw,
    Reply,
    Step,
    StreamedAs,
    Tokens,
)

__all__ = [
    "Answer",
    "Api",
    "Delay",
    "Drop",
    "Failure",
    "FakeModelApi",
    "LimitStats",
    "ProviderLimits",
    "Raw",
    "Recorded",
    "Refusal",
    "Reply",
    "Step",
    "StreamedAs",
    "Tokens",
    "read_stats",
    "request_tokens",
]
