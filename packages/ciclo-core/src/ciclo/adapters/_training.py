"""How an adapter calls a model, written once for every framework: which argument of its
``__call__`` says whether it trains (and the keyword arguments that set it), which takes
randomness at call time (``key``, ``rngs``), the keys of its RNG streams, derived from the
step's key, and which extra arguments a loss asks for by name (``params``, ``state``).

An adapter keeps only what is specific to its framework (where the signature comes from,
which flags its models use); the detection, the errors and the key derivation live here.
"""

from __future__ import annotations

import inspect
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = [
    "AUTO",
    "EXTRAS",
    "INVERTED_FLAGS",
    "TRAINING_FLAGS",
    "detect_rng_arg",
    "detect_training_arg",
    "find_argument",
    "requested_extras",
    "stream_keys",
    "training_kwargs",
]

#: ``training_arg="auto"`` (``key_arg="auto"``...): find the argument in the signature.
AUTO = "auto"

#: Arguments that are ``True`` when the model trains.
TRAINING_FLAGS = ("training", "train", "is_training")

#: Arguments that are ``False`` when the model trains.
INVERTED_FLAGS = ("deterministic",)


def _parameters(call: inspect.Signature | Callable[..., Any] | None) -> dict[str, Any] | None:
    """The parameters of a signature or a callable, ``None`` when they cannot be read."""
    if call is None:
        return None
    if isinstance(call, inspect.Signature):
        return dict(call.parameters)
    try:
        return dict(inspect.signature(call).parameters)
    except (TypeError, ValueError):
        return None


def find_argument(
    call: inspect.Signature | Callable[..., Any] | None,
    requested: str | None,
    *,
    candidates: Sequence[str],
    option: str,
    what: str,
    none_means: str,
) -> str | None:
    """The argument of ``call`` that ciclo sets, as an adapter's ``create_state`` option
    asks: ``"auto"`` finds the one of ``candidates`` that ``call`` takes (``None`` if it
    takes none, an error if several), a name is checked to be taken (or absorbed by
    ``**kwargs``), ``None`` sets nothing.

    Args:
        call: the model's ``__call__`` (or the signature ciclo calls it with); ``None`` or a
            signature that cannot be read skips the checks.
        requested: the option's value: :data:`AUTO`, an argument name or ``None``.
        candidates: the names ``"auto"`` looks for, in order of preference.
        option: the option's name, for errors (``"training_arg"``).
        what: what is called, for errors (``"MLP.__call__"``).
        none_means: what ``option=None`` does, for errors (``"set no flag"``).

    Example:
        >>> import ciclo
        >>> def forward(x, *, train=False): ...
        >>> ciclo.adapters.find_argument(
        ...     forward, "auto", candidates=("training", "train"), option="training_arg",
        ...     what="forward", none_means="set no flag",
        ... )
        'train'
    """
    if requested is not None and not isinstance(requested, str):
        raise TypeError(f"{option} must be an argument name, {AUTO!r} or None, got {requested!r}.")
    parameters = _parameters(call)
    if requested == AUTO:
        found = [name for name in candidates if parameters is not None and name in parameters]
        if len(found) > 1:
            kind = "training flags" if option == "training_arg" else f"arguments for {option}"
            raise TypeError(
                f"{what} takes several {kind} {found}; say which one ciclo sets: "
                f"create_state(..., {option}={found[0]!r})."
            )
        return found[0] if found else None
    if (
        requested is not None
        and parameters is not None
        and requested not in parameters
        and not any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    ):
        raise TypeError(
            f"{option}={requested!r}, but {what} takes no argument of that name (it takes "
            f"{list(parameters)}). Pass {option}=None to {none_means}."
        )
    return requested


def detect_training_arg(
    call: inspect.Signature | Callable[..., Any] | None,
    training_arg: str | None,
    what: str,
    *,
    flags: Sequence[str] = (*TRAINING_FLAGS, *INVERTED_FLAGS),
) -> str | None:
    """The argument of ``call`` that says whether the model trains, or ``None``:
    :func:`find_argument` for the ``training_arg`` option.

    Args:
        call: the model's ``__call__`` (or its signature).
        training_arg: ``"auto"`` (look for one of ``flags``), an argument name, or ``None``
            (pass nothing).
        what: what is called, for errors (``"MLP.__call__"``).
        flags: the names ``"auto"`` looks for (by default :data:`TRAINING_FLAGS` and
            :data:`INVERTED_FLAGS`; Haiku looks for ``("is_training",)`` only).

    Example:
        >>> import ciclo
        >>> def forward(x, deterministic=True): ...
        >>> ciclo.adapters.detect_training_arg(forward, "auto", "forward")
        'deterministic'
    """
    return find_argument(
        call,
        training_arg,
        candidates=flags,
        option="training_arg",
        what=what,
        none_means="set no flag",
    )


def detect_rng_arg(
    call: inspect.Signature | Callable[..., Any] | None,
    rng_arg: str | None,
    what: str,
    *,
    candidates: Sequence[str],
    option: str,
) -> str | None:
    """The argument of ``call`` that takes randomness at call time (Equinox's ``key``,
    NNX's ``rngs``), or ``None``: :func:`find_argument` for an adapter's ``key_arg`` /
    ``rngs_arg`` option, detected like the training flag.

    Args:
        call: the model's ``__call__`` (or its signature).
        rng_arg: ``"auto"`` (look for one of ``candidates``), an argument name, or ``None``
            (pass no randomness at call time).
        what: what is called, for errors (``"CNN.__call__"``).
        candidates: the names ``"auto"`` looks for (``("rngs",)`` for NNX).
        option: the option's name, for errors (``"rngs_arg"``).

    Example:
        >>> import ciclo
        >>> def forward(x, rngs=None): ...
        >>> ciclo.adapters.detect_rng_arg(
        ...     forward, "auto", "forward", candidates=("rngs",), option="rngs_arg"
        ... )
        'rngs'
    """
    return find_argument(
        call,
        rng_arg,
        candidates=candidates,
        option=option,
        what=what,
        none_means="pass no randomness at call time",
    )


#: What a loss or metric may ask for by parameter name, beyond ``(preds, targets)``.
EXTRAS = ("params", "state")


def requested_extras(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The extra values ``fn(preds, targets, ...)`` asks for by parameter name, among
    :data:`EXTRAS`: ``params`` (the trainable parameters, differentiated in a training
    step: a regularizer's gradient flows through them) and ``state`` (the whole state).

    Example:
        >>> import ciclo
        >>> def l2(preds, targets, params): ...
        >>> ciclo.adapters.requested_extras(l2)
        ('params',)
        >>> ciclo.adapters.requested_extras(lambda preds, targets: 0.0)
        ()
    """
    parameters = _parameters(fn)
    return () if parameters is None else tuple(name for name in EXTRAS if name in parameters)


def training_kwargs(training_arg: str | None, training: bool) -> dict[str, bool]:
    """The keyword arguments telling the model whether it trains: ``{training_arg:
    training}``, inverted for :data:`INVERTED_FLAGS` (``deterministic``), ``{}`` for ``None``.

    Example:
        >>> import ciclo
        >>> ciclo.adapters.training_kwargs("deterministic", True)
        {'deterministic': False}
        >>> ciclo.adapters.training_kwargs("is_training", True)
        {'is_training': True}
    """
    if training_arg is None:
        return {}
    return {training_arg: (not training) if training_arg in INVERTED_FLAGS else training}


def stream_keys(key: jax.Array, streams: Sequence[str]) -> dict[str, jax.Array]:
    """One key per RNG stream, derived from the step's ``key`` and the stream's name (the
    step's key itself when there is one stream: no extra hashing in the step).

    Example:
        >>> import ciclo, jax
        >>> keys = ciclo.adapters.stream_keys(jax.random.key(0), ["dropout", "noise"])
        >>> sorted(keys)
        ['dropout', 'noise']
    """
    if len(streams) == 1:
        return {streams[0]: key}
    return {name: jax.random.fold_in(key, zlib.crc32(name.encode())) for name in streams}
