"""How a Flax model is called at a step: the training flag of its ``__call__`` and the keys
of its RNG streams."""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = ["AUTO", "detect_training_arg", "stream_keys", "training_kwargs"]

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


def stream_keys(key: jax.Array, streams: Sequence[str]) -> dict[str, jax.Array]:
    """One key per RNG stream, derived from the step's ``key`` and the stream's name (the
    step's key itself when there is one stream: no extra hashing in the step)."""
    if len(streams) == 1:
        return {streams[0]: key}
    return {name: jax.random.fold_in(key, zlib.crc32(name.encode())) for name in streams}
