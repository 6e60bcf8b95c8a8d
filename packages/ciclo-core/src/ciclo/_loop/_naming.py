"""How errors and messages name a callback and describe a value (the lowest module of the
loop: every other one may use it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["callback_name", "describe"]


def callback_name(fn: Any) -> str:
    """A readable name of a callback for error messages.

    Example:
        >>> callback_name(print)
        'print'
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
