"""How errors and messages name a callback."""

from __future__ import annotations

from typing import Any

__all__ = ["callback_name"]


def callback_name(fn: Any) -> str:
    """A readable name of a callback for error messages.

    Example:
        >>> callback_name(print)
        'print'
    """
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__
