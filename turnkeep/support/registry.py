"""Extension classes by key: the mechanism behind turnkeep's registries of model providers and
tool sources. Built-in classes register the same way a third party's do, from an installed
package's entry point or a worker's own list, so none of them can quietly replace another."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from importlib.metadata import entry_points
from typing import Any, ClassVar, Generic, Self, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Subclasses of ``base`` by the value of their ``key`` attribute. A key another class has
    is refused, never silently taken over; registering a class twice is a no-op."""

    # Set by each registry: the base class it holds, the class attribute that keys each
    # subclass, what one is called in messages, how messages say two share a key, and the
    # characters a key may not contain.
    base: ClassVar[type[Any]]
    key: ClassVar[str]
    what: ClassVar[str]
    share: ClassVar[str]
    forbidden: ClassVar[str] = ""

    def __init__(self, classes: Iterable[type[T]] = ()) -> None:
        self._classes: dict[str, type[T]] = {}
        for cls in classes:
            self.register(cls)

    def register(self, cls: type[T]) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise TypeError(f"{cls!r} is not a {self.base.__name__} subclass")
        key = getattr(cls, self.key, "")
        if not isinstance(key, str) or not key or any(c in key for c in self.forbidden):
            banned = " or ".join(repr(c) for c in self.forbidden)
            without = f" without {banned}" if banned else ""
            raise ValueError(f"{cls.__name__}.{self.key} must be a non-empty string{without}")
        known = self._classes.get(key)
        if known is cls:
            return
        if known is not None:
            raise ValueError(
                f"two {self.what}s {self.share} {key!r}: {known.__qualname__} and "
                f"{cls.__qualname__}"
            )
        self._admit(cls, key)
        self._classes[key] = cls

    def _admit(self, cls: type[T], key: str) -> None:
        """What a registry checks and indexes beyond the key (a provider's aliases): raise to
        refuse ``cls``, before anything of it is kept."""

    def extended(self, classes: Iterable[type[T]]) -> Self:
        """This registry and ``classes`` (a worker's own), leaving this one unchanged."""
        registry = type(self)(self)
        for cls in classes:
            registry.register(cls)
        return registry

    def register_installed(self, group: str) -> Self:
        """Register the class of every entry point of ``group``. A broken one stops the worker
        with its name, rather than leaving its models or tools missing without a word."""
        for entry in entry_points(group=group):
            try:
                self.register(entry.load())
            except Exception as err:
                raise ValueError(
                    f"{self.what} entry point {entry.name!r} ({entry.value}) of group {group!r} "
                    f"could not be registered: {err}"
                ) from err
        return self

    def __iter__(self) -> Iterator[type[T]]:
        return iter(self._classes.values())

    def __getitem__(self, key: str) -> type[T]:
        return self._classes[key]

    def get(self, key: str) -> type[T] | None:
        return self._classes.get(key)
