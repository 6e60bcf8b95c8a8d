"""How a Flax module is told it is training: a ``training``/``train`` argument of ``__call__``."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["AUTO", "detect_training_arg", "training_kwargs"]

#: Detect the flag from the signature of the module's ``__call__``.
AUTO = "auto"

_FLAGS = ("training", "train", "is_training")
_INVERTED = ("deterministic",)


def detect_training_arg(
    call: Callable[..., Any], training_arg: str | None, what: str
) -> str | None:
    """The name of the argument of ``call`` that says whether the model trains, or ``None``.

    Args:
        call: the model's ``__call__``.
        training_arg: ``"auto"`` (look for ``training``, ``train``, ``is_training`` or
            ``deterministic``), an argument name, or ``None`` (pass nothing).
        what: the model's name, for error messages.
    """
    try:
        parameters = inspect.signature(call).parameters
    except (TypeError, ValueError):
        parameters = {}  # type: ignore[assignment]
    if training_arg == AUTO:
        found = [name for name in (*_FLAGS, *_INVERTED) if name in parameters]
        if len(found) > 1:
            raise TypeError(
                f"{what}.__call__ takes several training flags {found}; say which one ciclo "
                f"sets: create_state(..., training_arg={found[0]!r})."
            )
        return found[0] if found else None
    if (
        training_arg is not None
        and training_arg not in parameters
        and not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    ):
        raise TypeError(
            f"training_arg={training_arg!r}, but {what}.__call__ takes no argument of that "
            f"name (it takes {list(parameters)}). Pass training_arg=None to set no flag."
        )
    return training_arg


def training_kwargs(training_arg: str | None, training: bool) -> dict[str, bool]:
    """The keyword arguments telling the model whether it trains."""
    if training_arg is None:
        return {}
    return {training_arg: (not training) if training_arg in _INVERTED else training}
