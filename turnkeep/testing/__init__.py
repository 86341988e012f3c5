"""What you test your own agents with.

- ``FakeModel``: scripted model answers per agent (text, tool calls, errors, delays), served
  through the real provider SDKs by ``FakeModelApi``, a fake Anthropic and OpenAI API on
  loopback; ``Reply`` and ``Tokens`` build the scripts.
- The offline models, which need no API at all: ``passthrough`` (``PassthroughProvider``)
  echoes, and asks for a tool on a ``CALL_TOOL`` line or answers a ``FIXED_RESPONSE`` from
  then on; ``playback`` (``PlaybackProvider``) replays a JSON script of assistant messages.
- ``harness`` and ``Harness``: a worker with ``TurnkeepPlugin`` on a task queue of its own,
  and shortcuts to run turns and sessions on it; ``TurnkeepEnvironment``: an embedded
  Temporal dev server, a client and a fake model API, started once.
- ``turnkeep.testing.pytest_plugin``: the same as pytest fixtures.
- ``check_replay``: recorded histories against the current workflow code, in the strict
  sandbox.
- ``assert_replays``: recorded turns as a regression suite: replayed (tools answered from the
  recording), compared and judged, failing the test with ``EvaluationFailedError``.
- ``eventually``: a bounded wait for state a test cannot await.

The names are listed once, in this package's stub (``__init__.pyi``), and imported on first
use, so ``import turnkeep.testing`` loads no SDK.
"""

from turnkeep.support.lazy import lazy_exports

__getattr__, __dir__ = lazy_exports(globals())
