"""A tiny name -> object registry for the open sets of arr-coc (channels, samplers, ...)."""
from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from arr_coc.errors import UserError

T = TypeVar("T")


class UnknownNameError(UserError, KeyError):
    """Raised for a name that is not registered; prints as plain text, not a quoted key."""

    def __str__(self) -> str:
        return str(self.args[0])


class Registry(Generic[T]):
    """Maps names to objects; a duplicate name or an unknown name raises with a useful message.

    Example:
        >>> r = Registry("colour")
        >>> @r.register("red")
        ... def red(): return 1
        >>> r.get("red")()
        1
        >>> r.names()
        ['red']
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        if name not in self._items:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._items[name]

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)
