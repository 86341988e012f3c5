"""The ``playback`` model reads its script once, not on every call, yet picks up an edited
script at the next call, and names an unreadable one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from tests.conftest import write_script
from turnkeep.contract.messages import Message
from turnkeep.contract.model_io import LlmRequest
from turnkeep.providers import playback
from turnkeep.providers.playback import PlaybackProvider


def call(index: int) -> LlmRequest:
    return LlmRequest(
        agent="a",
        model="playback",
        call_index=index,
        instruction=None,
        messages=[Message.user("hi")],
        tools=[],
    )


async def test_the_script_is_parsed_once_and_reread_when_edited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_script(tmp_path / "script.json", "first", "second")
    parses: list[Path] = []
    real_load = playback.load_script
    monkeypatch.setattr(playback, "load_script", lambda p: parses.append(p) or real_load(p))
    model = PlaybackProvider(script)

    assert (await model.complete(call(1), "playback")).text == "first"
    assert (await model.complete(call(2), "playback")).text == "second"
    assert len(parses) == 1

    write_script(script, "edited", "script", "longer")
    stat = script.stat()  # the same second, maybe: make the change visible to mtime too
    os.utime(script, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert (await PlaybackProvider(script).complete(call(1), "playback")).text == "edited"
    assert len(parses) == 2


async def test_a_missing_script_is_named(tmp_path: Path) -> None:
    with pytest.raises(ApplicationError, match=r"cannot read playback script .*missing\.json"):
        await PlaybackProvider(tmp_path / "missing.json").complete(call(1), "playback")
