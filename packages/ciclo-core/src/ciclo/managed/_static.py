"""``Static``: the one wrapper for values a compiled step treats as static."""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

import jax

__all__ = ["Static", "keep_static", "shared"]


class Static:
    """A static value of a state: hashed once, compared by identity, then by value if hashable.

    As a pytree it has no leaves.

    Example:
        >>> import ciclo
        >>> ciclo.adapters.Static([1, 2]) == ciclo.adapters.Static([1, 2])  # unhashable
        False
        >>> ciclo.adapters.Static((1, 2)) == ciclo.adapters.Static((1, 2))
        True
    """

    __slots__ = ("__weakref__", "_hash", "hashable", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        try:
            self._hash = hash(value)
            self.hashable = True
        except TypeError:
            self._hash = id(value)
            self.hashable = False

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Static):
            return NotImplemented
        if self.value is other.value:
            return True
        return (
            self.hashable
            and other.hashable
            and self._hash == other._hash
            and bool(self.value == other.value)
        )

    def __repr__(self) -> str:
        return f"Static({self.value!r})"


jax.tree_util.register_pytree_node(Static, lambda static: ((), static), lambda static, _: static)

_SHARED: weakref.WeakValueDictionary[int, Static] = weakref.WeakValueDictionary()


def shared(static: Static) -> Static:
    """The one :class:`Static` in use equal to ``static`` (compared without a Python call).

    Example:
        >>> a = shared(Static((1, 2)))
        >>> shared(Static((1, 2))) is a
        True
    """
    if not static.hashable:
        return static
    found = _SHARED.get(static._hash)
    if found is not None and found == static:
        return found
    _SHARED[static._hash] = static
    return static


def keep_static(value: Any) -> Any:
    """``value`` as a :class:`Static` when it is a function, a method or a
    ``functools.partial`` (an extra field such as ``apply_fn=module.apply``); anything else
    as it is (callable pytrees such as Equinox modules stay data).

    Example:
        >>> keep_static(len), keep_static(3)
        (Static(<built-in function len>), 3)
    """
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return Static(value)
    if isinstance(value, functools.partial):
        return Static(value)
    return value
