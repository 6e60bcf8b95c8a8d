"""The evaluation sets of ``train_loop``: ``test_dataset`` (one factory or re-iterable
dataset, or a dict of them), ``test_every`` (how often each set is evaluated) and
``test_duration`` (how long each evaluation runs), parsed into one entry per set."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import jax

from .._time._elapsed import Period, as_period
from .._time._periods import period_unit

__all__ = [
    "EvaluationSet",
    "check_not_arrays",
    "dataset_factory",
    "dataset_label",
    "evaluation_sets",
]


class EvaluationSet(NamedTuple):
    """One evaluation set of ``train_loop``."""

    factory: Callable[[], Iterable[Any]]  #: returns a fresh dataset at each evaluation
    every: tuple[str, float] | None  #: ``(unit, amount)`` of its own period; ``None``: epochs
    duration: Period | None  #: how much of the set an evaluation runs; ``None``: all of it


def _per_set(value: Any, names: list[str], keyword: str) -> dict[str, Any]:
    """``value`` (one for every set, or a dict ``{name: value}``) as one value per set."""
    if not isinstance(value, Mapping):
        return dict.fromkeys(names, value)
    unknown = [name for name in value if name not in names]
    if unknown:
        raise ValueError(
            f"{keyword} names {unknown}, which test_dataset does not have; its "
            f"evaluation sets are {names}."
        )
    return {name: value.get(name) for name in names}


def evaluation_sets(
    test_dataset: Any, test_every: Any, test_duration: Any, test_name: str
) -> dict[str, EvaluationSet]:
    """``{name: EvaluationSet}`` from train_loop's arguments.

    Example:
        >>> sets = evaluation_sets({"valid": list, "test": list}, {"valid": 100}, 2, "test")
        >>> {name: (every, duration.steps) for name, (_, every, duration) in sets.items()}
        {'valid': (('steps', 100), 2), 'test': (None, 2)}
    """
    if test_dataset is None:
        for keyword, value in (("test_every", test_every), ("test_duration", test_duration)):
            if value is not None:
                raise ValueError(f"{keyword} needs a test_dataset (a function returning one).")
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
        where = dataset_label(test_dataset, name)
        check_not_arrays(factory, where)
        factories[name] = dataset_factory(factory, where, "at each evaluation")
    _check_late_binding(factories)
    names = list(factories)
    every = _per_set(test_every, names, "test_every")
    duration = _per_set(test_duration, names, "test_duration")
    return {
        name: EvaluationSet(
            factory,
            None if every[name] is None else period_unit(every[name], f"test_every for {name!r}"),
            _duration(duration[name], name),
        )
        for name, factory in factories.items()
    }


def _duration(value: Any, name: str) -> Period | None:
    """``test_duration`` of one set as a period (checked like ``test_every``)."""
    if value is None:
        return None
    unit, amount = period_unit(value, f"test_duration for {name!r}")  # a positive amount
    if unit in ("time", "date") and jax.process_count() > 1:
        # each process would cut it at its own batch: the extra collectives hang the job
        raise ValueError(_TIMED_ON_PROCESSES.format(unit=unit, amount=amount, name=name))
    return as_period(value, f"test_duration for {name!r}")


_TIMED_ON_PROCESSES = (
    "test_duration=ciclo.at({unit}={amount:g}) (set {name!r}): with several processes each "
    "would stop at its own batch (a hang); give test_duration=ciclo.at(steps=...)."
)


#: A Keras-style ``validation_data=(x_val, y_val)`` given as ``test_dataset``.
_ARRAYS_NOT_BATCHES = (
    "{where} is a tuple of {count} arrays of {length} rows, as Keras' validation_data is; "
    "give batches: {where}=[(x_val[i : i + 64], y_val[i : i + 64]) for i in range(0, "
    "len(x_val), 64)]."
)


def check_not_arrays(value: Any, where: str) -> None:
    """Refuses a tuple of arrays with equal leading dimensions (Keras' ``(x, y)``) given
    where a dataset of batches is expected.

    Example:
        >>> import numpy as np
        >>> check_not_arrays([(np.ones((4, 2)), np.ones(4))], "test_dataset")
        >>> check_not_arrays((np.ones((4, 2)), np.ones(4)), "test_dataset")
        Traceback (most recent call last):
        ...
        TypeError: test_dataset is a tuple of 2 arrays of 4 rows, ...
    """
    if not isinstance(value, tuple) or len(value) < 2:
        return
    lengths = {_leading(item) for item in value}
    if len(lengths) == 1 and None not in lengths:
        raise TypeError(
            _ARRAYS_NOT_BATCHES.format(where=where, count=len(value), length=lengths.pop())
        )


def _leading(value: Any) -> int | None:
    """The leading dimension of an array (anything with a ``shape`` of rank 1 or more)."""
    shape = getattr(value, "shape", None)
    if not isinstance(shape, tuple) or not shape or not hasattr(value, "dtype"):
        return None
    return int(shape[0])


def dataset_label(test_dataset: Any, name: str) -> str:
    """How messages name an evaluation set: ``test_dataset``, or ``test_dataset['valid']``
    in a dict of sets."""
    return f"test_dataset[{name!r}]" if isinstance(test_dataset, Mapping) else "test_dataset"


class _Reiterated:
    """A re-iterable dataset as a factory: each call returns the dataset itself, which a new
    ``for`` loop iterates from its start."""

    def __init__(self, dataset: Iterable[Any]) -> None:
        self.dataset = dataset

    def __call__(self) -> Iterable[Any]:
        return self.dataset

    def __repr__(self) -> str:
        return f"<the {type(self.dataset).__name__} given>"


_FRESH_DATASET_FIX = (
    "Give a zero-argument function returning a fresh one (it is called {when}), e.g. "
    "{where}=lambda: make_batches(x_test, y_test), or a re-iterable dataset such as a list."
)


def dataset_factory(
    value: Any, where: str, when: str, who: str = ""
) -> Callable[[], Iterable[Any]]:
    """An evaluation dataset as a zero-argument function returning a fresh dataset: a
    function is kept, a re-iterable dataset (a list, an array, a Grain ``MapDataset``) is
    returned by each call; an iterator, which one evaluation would use up, is an error.
    ``where`` names the argument in messages (after ``who``, the function's name).

    Example:
        >>> dataset_factory([1, 2], "test_dataset", "at each evaluation")()
        [1, 2]
        >>> dataset_factory(iter([1, 2]), "test_dataset", "at each evaluation")
        Traceback (most recent call last):
        ...
        TypeError: test_dataset is an iterator (list_iterator), which the first evaluation would use up, leaving the next ones no batch. Give a zero-argument function returning a fresh one (it is called at each evaluation), e.g. test_dataset=lambda: make_batches(x_test, y_test), or a re-iterable dataset such as a list.
    """  # noqa: E501
    if callable(value):
        return value  # type: ignore[no-any-return]
    fix = _FRESH_DATASET_FIX.format(when=when, where=where)
    try:
        iterator = iter(value)
    except TypeError:
        raise TypeError(
            f"{who}{where} must be a dataset or a function returning one, got "
            f"{type(value).__name__}. {fix}"
        ) from None
    if iterator is value:
        raise TypeError(
            f"{who}{where} is an iterator ({type(value).__name__}), which the first evaluation "
            f"would use up, leaving the next ones no batch. {fix}"
        )
    return _Reiterated(value)


def _same_function(a: Any, b: Any) -> bool:
    """Whether two functions are the same code over the same values (a lambda made twice
    in a loop, closing over the loop variable: both read its last value)."""
    code = getattr(a, "__code__", None)
    if code is None or code is not getattr(b, "__code__", None):
        return False
    if getattr(a, "__defaults__", None) != getattr(b, "__defaults__", None):
        return False
    if getattr(a, "__kwdefaults__", None) != getattr(b, "__kwdefaults__", None):
        return False
    cells_a, cells_b = a.__closure__ or (), b.__closure__ or ()
    if not cells_a:  # no free variable: no late binding (the same function given twice)
        return False
    try:
        return all(
            x.cell_contents is y.cell_contents for x, y in zip(cells_a, cells_b, strict=False)
        )
    except ValueError:  # an empty cell
        return False


_LATE_BINDING = (
    "test_dataset[{first!r}] and test_dataset[{second!r}] are the same function of the same "
    "values (lambdas made in a loop see its last value); bind it as a default: "
    "{{name: lambda name=name: make_batches(name) for name in names}}."
)


def _check_late_binding(factories: Mapping[str, Any]) -> None:
    """Rejects evaluation sets whose factories are the same function over the same values:
    Python's late binding, as in ``{name: lambda: batches(data[name]) for name in names}``,
    where every lambda reads the loop's last ``name`` and all sets would be the same data.

    Example:
        >>> sets = {name: lambda: [name] for name in ("valid", "test")}
        >>> _check_late_binding(sets)
        Traceback (most recent call last):
        ...
        ValueError: test_dataset['valid'] and test_dataset['test'] are the same function ...
    """
    names = list(factories)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if _same_function(factories[first], factories[second]):
                raise ValueError(_LATE_BINDING.format(first=first, second=second))
