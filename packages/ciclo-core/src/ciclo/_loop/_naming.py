"""How errors and messages name a callback and describe a value, and how many arguments a
function takes (the lowest module of the loop: every other one may use it)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

__all__ = ["callback_name", "describe", "count_positional"]


def callback_name(fn: Any) -> str:
    """A readable name of a callback for messages; of a class, its qualified name (what a
    checkpoint records for a stateful callback object: ``callback_name(type(obj))``).

    Example:
        >>> callback_name(print), callback_name(dict)
        ('print', 'dict')
    """
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def describe(value: Any) -> str:
    """A short description of a value for error messages.

    Example:
        >>> describe({"loss": 1.0}), describe(0.5)
        ("a dict with keys ['loss']", 'float 0.5')
    """
    if isinstance(value, Mapping):
        return f"a dict with keys {list(value)[:5]}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}"


def count_positional(fn: Any, most: int) -> int | None:
    """How many positional arguments ``fn`` takes, up to ``most`` (``most`` with ``*args``);
    ``None`` when its signature cannot be read. The one arity reader of ciclo (loop
    callbacks, managed steps).

    Example:
        >>> count_positional(lambda state, batch, *, fast=False: None, 4)
        2
    """
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return most
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return min(sum(p.kind in positional for p in parameters), most)
