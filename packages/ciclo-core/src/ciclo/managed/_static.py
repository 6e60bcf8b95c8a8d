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


def keep_static(value: Any, name: str = "value") -> Any:
    """``value`` as a :class:`Static` when it is a function, a ``functools.partial`` or any
    other single object that is no array (an extra field such as ``apply_fn=module.apply``
    or ``label="run-a"``: static metadata); arrays, numbers and pytrees of them as they are
    (callable pytrees such as Equinox modules stay data).

    Raises:
        TypeError: a pytree holding strings (a compiled step cannot take them).

    Example:
        >>> keep_static(len), keep_static(3), keep_static("run-a")
        (Static(<built-in function len>), 3, Static('run-a'))
    """
    if inspect.isfunction(value) or inspect.ismethod(value) or inspect.isbuiltin(value):
        return Static(value)
    if isinstance(value, functools.partial | str | bytes):
        return Static(value)
    leaves = jax.tree_util.tree_leaves(value)
    if len(leaves) == 1 and leaves[0] is value and not _is_data(value):
        return Static(value)
    if any(isinstance(leaf, str | bytes) for leaf in leaves):
        raise TypeError(f"{name} holds strings: give arrays, or wrap it in ciclo.adapters.Static.")
    return value


def _is_data(leaf: Any) -> bool:
    """Whether a compiled step takes ``leaf`` as data: an array or a number."""
    return hasattr(leaf, "dtype") or isinstance(leaf, int | float | complex)
