"""The ``playback`` model: replays a scripted list of assistant messages from a JSON file that
the agent's configuration names (``agents.<name>.playback``).

Model call *n* of a turn answers with entry *n*, so a retried or replayed call gets the same
answer on any worker. An entry is a ``Message`` (role may be left out) or a bare string; a
message with ``tool_calls`` and no stop reason stops for ``toolUse``. A compaction summary is
not a turn call: it is echoed, as passthrough does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from turnkeep.config.settings import Settings
from turnkeep.contract.messages import Message, StopReason
from turnkeep.contract.model_io import LlmRequest
from turnkeep.contract.turn_io import Usage
from turnkeep.errors import config_error
from turnkeep.providers.base import ModelProvider, with_usage
from turnkeep.providers.parsed_messages import estimate_tokens
from turnkeep.providers.passthrough import PassthroughProvider


def load_script(path: Path) -> list[Message]:
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise config_error("PlaybackScript", f"cannot read playback script {path}: {err}") from err
    if not isinstance(entries, list):
        raise config_error("PlaybackScript", f"playback script {path} must be a JSON list")
    return [_entry(item) for item in entries]


# Parsed scripts by path, with the file's (mtime, size) they were read at: a script is parsed
# once rather than on every model call, and an edited file is picked up by the next call.
_SCRIPTS: dict[Path, tuple[tuple[int, int], list[Message]]] = {}


def cached_script(path: Path) -> list[Message]:
    try:
        stat = path.stat()
    except OSError:
        return load_script(path)  # which says why it cannot be read
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _SCRIPTS.get(path)
    if cached is None or cached[0] != key:
        cached = _SCRIPTS[path] = (key, load_script(path))
    return cached[1]


def _entry(item: Any) -> Message:
    if isinstance(item, str):
        return Message.assistant(item)
    message = Message.model_validate({"role": "assistant", **item})
    if message.stop_reason is None:
        stop = StopReason.TOOL_USE if message.tool_calls else StopReason.END_TURN
        message = message.model_copy(update={"stop_reason": stop})
    return message


class PlaybackProvider(ModelProvider):
    name = "playback"
    bare = True
    context_window = 200_000

    def __init__(self, scripts: Path | Mapping[str, Path]) -> None:
        """``scripts``: one script for every call, or each agent's own by agent name."""
        self._scripts = scripts

    @classmethod
    def from_settings(cls, settings: Settings) -> PlaybackProvider:
        # Only the agents' scripts, resolved now: the settings' base directory never changes.
        return cls(
            {
                name: settings.path(agent.playback)
                for name, agent in settings.agents.items()
                if agent.playback is not None
            }
        )

    async def complete(self, request: LlmRequest, model_name: str) -> Message:
        if request.call_index < 1:
            # Not one of the turn's calls (a compaction summary): the script is for the turn,
            # so answer as passthrough does, which echoes the request.
            return await PassthroughProvider().complete(request, model_name)
        script = cached_script(self._script(request.agent))
        index = request.call_index - 1
        reply = (
            script[index]
            if index < len(script)
            else Message.assistant(f"MESSAGES EXHAUSTED (list size {len(script)})")
        )
        usage = Usage(
            input_tokens=estimate_tokens(request.messages), output_tokens=estimate_tokens([reply])
        )
        return with_usage(reply, usage)

    def _script(self, agent: str) -> Path:
        if isinstance(self._scripts, Path):
            return self._scripts
        script = self._scripts.get(agent)
        if script is None:
            raise config_error(
                "UnknownModel", f"agent {agent!r} uses playback but names no playback script"
            )
        return script
