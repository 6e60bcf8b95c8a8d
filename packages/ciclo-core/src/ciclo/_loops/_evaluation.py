"""The evaluation sets of ``train_loop``: ``test_dataset`` (one factory or re-iterable
dataset, or a dict of them) and ``test_duration`` (one period, or one per set) parsed into
one entry per set."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .._time._periods import period_unit

__all__ = ["EvaluationSet", "dataset_factory", "dataset_label", "evaluation_sets"]

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
        where = dataset_label(test_dataset, name)
        factories[name] = dataset_factory(factory, where, "at each evaluation")
    _check_late_binding(factories)
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
    fix = (
        f"Give a zero-argument function returning a fresh one (it is called {when}), e.g. "
        f"{where}=lambda: make_batches(x_test, y_test), or a re-iterable dataset such as a "
        f"list."
    )
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
                raise ValueError(
                    f"test_dataset[{first!r}] and test_dataset[{second!r}] are the same "
                    f"function of the same values, so both would evaluate the same data: "
                    f"Python binds a lambda's variables when it is called, not when it is "
                    f"made, so lambdas made in a loop all see the loop's last value. Bind "
                    f"the value as a default: {{name: lambda name=name: make_batches(name) "
                    f"for name in names}}, or use functools.partial(make_batches, name)."
                )
