"""What is started and stopped (a server, a child process) is also a context manager:
``with x as started`` is ``started = x.start()``, then ``x.stop()`` however the block ends.
Written once here so that every such class says only how it starts and stops."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Generic, TypeVar

T = TypeVar("T")


class StartStop(ABC, Generic[T]):
    """``start()`` returns what ``with`` gives (often the object itself); ``stop()`` undoes
    it. An exception in the block is not swallowed."""

    @abstractmethod
    def start(self) -> T: ...

    @abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> T:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AsyncStartStop(ABC, Generic[T]):
    """``StartStop`` for ``async with``: ``await start()``, then ``await stop()``."""

    @abstractmethod
    async def start(self) -> T: ...

    @abstractmethod
    async def stop(self) -> None: ...

    async def __aenter__(self) -> T:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
