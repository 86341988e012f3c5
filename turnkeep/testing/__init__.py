"""What you test your own agents with.

- ``FakeModel``: scripted model answers per agent (text, tool calls, errors, delays), served
  through the real provider SDKs by ``FakeModelApi``, a fake Anthropic and OpenAI API on
  loopback; ``Reply`` and ``Tokens`` build the scripts.
- ``harness`` and ``Harness``: a worker with ``TurnkeepPlugin`` on a task queue of its own,
  and shortcuts to run turns and sessions on it; ``TurnkeepEnvironment``: an embedded
  Temporal dev server, a client and a fake model API, started once.
- ``turnkeep.testing.pytest_plugin``: the same as pytest fixtures.
- ``check_replay``: recorded histories against the current workflow code, in the strict
  sandbox.
- ``eventually``: a bounded wait for state a test cannot await.

Names are imported on first use, so ``import turnkeep.testing`` loads no SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnkeep.testing.fake_api import FakeModelApi, Recorded, Reply, Tokens
    from turnkeep.testing.fake_model import FakeModel
    from turnkeep.testing.harness import Harness, TurnkeepEnvironment, eventually, harness
    from turnkeep.testing.replay import ReplayFailedError, check_replay

_EXPORTS = {
    "FakeModel": "turnkeep.testing.fake_model",
    "FakeModelApi": "turnkeep.testing.fake_api",
    "Recorded": "turnkeep.testing.fake_api",
    "Reply": "turnkeep.testing.fake_api",
    "Tokens": "turnkeep.testing.fake_api",
    "Harness": "turnkeep.testing.harness",
    "TurnkeepEnvironment": "turnkeep.testing.harness",
    "eventually": "turnkeep.testing.harness",
    "harness": "turnkeep.testing.harness",
    "ReplayFailedError": "turnkeep.testing.replay",
    "check_replay": "turnkeep.testing.replay",
}

__all__ = [
    "FakeModel",
    "FakeModelApi",
    "Harness",
    "Recorded",
    "ReplayFailedError",
    "Reply",
    "Tokens",
    "TurnkeepEnvironment",
    "check_replay",
    "eventually",
    "harness",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'turnkeep.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
