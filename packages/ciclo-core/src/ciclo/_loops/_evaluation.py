"""The evaluation sets of ``train_loop``: ``test_dataset`` (one factory, or a dict of them)
and ``test_duration`` (one period, or one per set) parsed into one entry per set."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._time._units import period_unit

__all__ = ["EvaluationSet", "evaluation_sets"]

#: ``(factory, (unit, amount) or None)``: a set's dataset factory and its own period.
EvaluationSet = tuple[Callable[[], Iterable[Any]], tuple[str, float] | None]


def evaluation_sets(
    test_dataset: Any, test_duration: Any, test_name: str
) -> dict[str, EvaluationSet]:
    """``{name: (factory, (unit, amount) or None)}`` from train_loop's arguments.

    Example:
        >>> sets = evaluation_sets({"valid": list, "test": list}, {"valid": 100}, "test")
        >>> {name: period for name, (_, period) in sets.items()}
        {'valid': ('steps', 100), 'test': None}
    """
    if test_dataset is None:
        if test_duration is not None:
            raise ValueError("test_duration needs a test_dataset (a function returning one).")
        return {}
    if isinstance(test_dataset, Mapping):
        factories = dict(test_dataset)
        if not factories:
            raise ValueError(
                "test_dataset is an empty dict; give {name: function returning a dataset}, "
                "e.g. {'valid': make_valid, 'test': make_test}, or None."
            )
        if test_name != "test":
            raise TypeError(
                f"test_name={test_name!r} names a single test_dataset; with a dict of "
                f"evaluation sets the keys are the names ({', '.join(map(repr, factories))})."
            )
    else:
        factories = {test_name: test_dataset}
    for name, factory in factories.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"test_dataset names must be non-empty strings, got {name!r}.")
        if not callable(factory):
            where = (
                "test_dataset"
                if len(factories) == 1 and name == test_name
                else (f"test_dataset[{name!r}]")
            )
            raise TypeError(
                f"{where} must be a zero-argument function returning a fresh dataset "
                f"(it is called at each evaluation), got {type(factory).__name__}. "
                f"Example: {where}=lambda: make_batches(x_test, y_test)."
            )
    if isinstance(test_duration, Mapping):
        unknown = [name for name in test_duration if name not in factories]
        if unknown:
            raise ValueError(
                f"test_duration names {unknown}, which test_dataset does not have; its "
                f"evaluation sets are {list(factories)}."
            )
        durations = dict(test_duration)
    else:
        durations = dict.fromkeys(factories, test_duration)
    return {
        name: (
            factory,
            None
            if durations.get(name) is None
            else period_unit(durations[name], f"test_duration for {name!r}"),
        )
        for name, factory in factories.items()
    }
