"""Checks of ``loop``'s keyword arguments, so that a wrong type is named where it is given,
not found later as an obscure error deep in the loop."""

from __future__ import annotations

import inspect
import signal
import warnings
from typing import Any

from .._records._history import History
from .._time._elapsed import Elapsed, checked_batch_size_fn

__all__ = ["check_arguments", "check_dataset", "checked_batch_size_fn", "is_empty"]

_NOT_ELAPSED = (
    "loop(elapsed={elapsed!r}): expected a ciclo.Elapsed (what an earlier loop returned, e.g. "
    "state, history, elapsed = ciclo.loop(...)) or None, got {kind}."
)
_NOT_SIGNALS = (
    "loop(stop_signals={stop_signals!r}): expected a tuple of signal.Signals, e.g. "
    "stop_signals=(signal.SIGINT, signal.SIGTERM), or () for none; not names or numbers."
)
_EXHAUSTED_GENERATOR = (
    "loop(dataset=...) is a generator that is already exhausted (an earlier loop or a list() "
    "consumed it), so it would yield no batch. A generator runs once: call its function again "
    "for a new one, or give a list or another re-iterable dataset."
)


def check_arguments(history: Any, elapsed: Any, batch_size_fn: Any, stop_signals: Any) -> None:
    """Raises a ``TypeError`` naming the argument and the fix when one has the wrong type.

    Example:
        >>> check_arguments(None, None, None, (signal.SIGINT,))
        >>> check_arguments(None, 3, None, ())
        Traceback (most recent call last):
        TypeError: loop(elapsed=3): expected a ciclo.Elapsed (what an earlier loop returned, e.g. state, history, elapsed = ciclo.loop(...)) or None, got int.
    """  # noqa: E501
    if history is not None and not isinstance(history, History):
        raise TypeError(
            f"loop(history={history!r}): expected a ciclo.History (e.g. one an earlier loop "
            f"returned) or None, got {type(history).__name__}."
        )
    if elapsed is not None and not isinstance(elapsed, Elapsed):
        raise TypeError(_NOT_ELAPSED.format(elapsed=elapsed, kind=type(elapsed).__name__))
    if batch_size_fn is not None and not callable(batch_size_fn):
        raise TypeError(
            f"loop(batch_size_fn={batch_size_fn!r}): expected a function batch -> int (the "
            f"number of samples in a batch), got {type(batch_size_fn).__name__}."
        )
    if isinstance(stop_signals, str | int) or not all(
        isinstance(s, signal.Signals) for s in _items(stop_signals)
    ):
        raise TypeError(_NOT_SIGNALS.format(stop_signals=stop_signals))


def _items(value: Any) -> list[Any]:
    try:
        return list(value)
    except TypeError:
        return [None]


def check_dataset(dataset: Any) -> None:
    """Raises a ``ValueError`` for a generator that already ran to its end: reused, it
    would yield nothing, and the loop would end at once with no step and no error.

    Example:
        >>> batches = (x for x in [1, 2])
        >>> check_dataset(batches)
        >>> list(batches)
        [1, 2]
        >>> check_dataset(batches)
        Traceback (most recent call last):
        ValueError: loop(dataset=...) is a generator that is already exhausted (an earlier loop or a list() consumed it), so it would yield no batch. A generator runs once: call its function again for a new one, or give a list or another re-iterable dataset.
    """  # noqa: E501
    if is_empty(dataset):
        warnings.warn(
            "loop(dataset=...) is empty (it has no batch), so the loop runs no step. Give a "
            "dataset with batches; train_loop and test_loop raise an error for an empty one.",
            RuntimeWarning,
            stacklevel=3,
        )
    if inspect.isgenerator(dataset) and inspect.getgeneratorstate(dataset) == "GEN_CLOSED":
        raise ValueError(_EXHAUSTED_GENERATOR)


def is_empty(dataset: Any) -> bool:
    """Whether ``dataset`` has a length, of 0 (an empty list or array of batches).

    Example:
        >>> is_empty([]), is_empty([1]), is_empty(iter([]))
        (True, False, False)
    """
    try:
        return len(dataset) == 0
    except TypeError:  # no length (an iterator, a generator): unknown until iterated
        return False
