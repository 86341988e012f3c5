"""``turnkeep.support.lifecycle``: what starts and stops is a context manager, sync and async;
``with`` gives what ``start()`` returned and stops however the block ends, letting an error
through."""

from __future__ import annotations

import pytest

from turnkeep.support.lifecycle import AsyncStartStop, StartStop


class Lamp(StartStop[str]):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def start(self) -> str:
        self.calls.append("start")
        return "lit"

    def stop(self) -> None:
        self.calls.append("stop")


class AsyncLamp(AsyncStartStop[str]):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def start(self) -> str:
        self.calls.append("start")
        return "lit"

    async def stop(self) -> None:
        self.calls.append("stop")


def test_with_gives_what_start_returned_and_stops() -> None:
    lamp = Lamp()
    with lamp as started:
        assert started == "lit"
        assert lamp.calls == ["start"]
    assert lamp.calls == ["start", "stop"]


def test_an_error_in_the_block_stops_and_goes_through() -> None:
    lamp = Lamp()
    with pytest.raises(KeyError), lamp:
        raise KeyError("x")
    assert lamp.calls == ["start", "stop"]


async def test_async_with_gives_what_start_returned_and_stops() -> None:
    lamp = AsyncLamp()
    async with lamp as started:
        assert started == "lit"
        assert lamp.calls == ["start"]
    assert lamp.calls == ["start", "stop"]


async def test_an_error_in_the_async_block_stops_and_goes_through() -> None:
    lamp = AsyncLamp()
    with pytest.raises(KeyError):
        async with lamp:
            raise KeyError("x")
    assert lamp.calls == ["start", "stop"]


def test_a_class_that_cannot_start_or_stop_is_refused() -> None:
    class Half(StartStop[None]):
        def start(self) -> None:
            pass

    with pytest.raises(TypeError):
        Half()  # type: ignore[abstract]
