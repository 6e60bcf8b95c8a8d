"""``train_loop(..., epochs=N)``: N passes over the training data, as one dataset.

The data is re-iterable (a list, a Grain ``MapDataset``) or a zero-argument function
returning a fresh dataset per epoch; without ``len()``, an epoch ends where a pass ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, overload

from .._time._elapsed import Elapsed
from .._time._schedules import NOT_AGAIN, Due, Schedule

__all__ = ["Passes", "SequencePasses", "epochs_dataset"]

_ONE_PASS = (
    "train_loop(epochs={epochs}): train_dataset is an iterator ({kind}), used up by one "
    "epoch; give a list, or a function returning a fresh dataset."
)
_NOT_A_DATASET = "train_loop(epochs={}): train_dataset() gave {}, not a dataset."


def _fresh(data: Any) -> Callable[[], Iterable[Any]]:
    """A function returning the data of one epoch."""
    if hasattr(data, "__iter__"):
        return lambda: data  # type: ignore[no-any-return]
    return data  # type: ignore[no-any-return]


class Passes(Iterable[Any]):
    """``epochs`` passes over the data, one batch ahead (:attr:`last_of_pass`).

    Example:
        >>> passes = Passes(lambda: iter([1, 2]), 2, None)
        >>> [(batch, passes.last_of_pass) for batch in passes]
        [(1, False), (2, True), (1, False), (2, True)]
    """

    #: How a resume that replays names it (``_resume.skip_consumed``).
    replay_words = ("the epochs of train_dataset", " (docs/loops.md: Shuffling each epoch)")

    def __init__(self, make: Callable[[], Iterable[Any]], epochs: int, first: Any) -> None:
        self.make, self.epochs = make, epochs
        self._first = first  # the first epoch's data, made when the length was read
        self.first_of_pass = self.last_of_pass = False
        self.on_last: Callable[[], object] = lambda: None  # called as a pass's last batch comes

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.epochs):
            data, self._first = self._first, None
            batches = iter(self.make() if data is None else data)
            try:
                ahead = next(batches)
            except StopIteration:
                return  # an empty pass: the data ran out
            first, last = True, False
            while not last:
                batch = ahead
                try:
                    ahead = next(batches)
                except StopIteration:
                    last = True
                    self.on_last()
                self.first_of_pass, self.last_of_pass, first = first, last, False
                yield batch

    def __repr__(self) -> str:
        return f"<train_loop's {self.epochs} epochs over {self.make!r}>"


class SequencePasses(Sequence[Any]):
    """``epochs`` passes over an indexable dataset, as one sequence (resumable by index).

    Example:
        >>> list(SequencePasses([1, 2], 2))
        [1, 2, 1, 2]
    """

    def __init__(self, data: Any, epochs: int) -> None:
        self.data, self.epochs, self.length = data, epochs, len(data)

    def __len__(self) -> int:
        return self.length * self.epochs

    def __iter__(self) -> Iterator[Any]:  # by index, with no Python call per batch
        indices = chain.from_iterable(repeat(range(self.length), self.epochs))
        return map(self.data.__getitem__, indices)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self.data[index % self.length]

    def __repr__(self) -> str:
        return f"<train_loop's {self.epochs} epochs over {type(self.data).__name__}>"


class PassEnds(Schedule):
    """Fires at each pass's last batch (an epoch's end), where ``Passes.on_last`` wakes the plan."""

    def __init__(self, passes: Passes) -> None:
        self.passes = passes

    def __call__(self, elapsed: Elapsed) -> bool:
        return self.passes.last_of_pass

    def next_due(self, elapsed: Elapsed) -> Due:
        return NOT_AGAIN

    def begins(self) -> bool:
        """Whether the current batch begins a pass."""
        return self.passes.first_of_pass

    def __repr__(self) -> str:
        return "train_loop.epochs"


def _indexable(data: Any) -> bool:
    return (
        hasattr(data, "__len__")
        and hasattr(data, "__getitem__")
        and not isinstance(data, dict | str | bytes)
    )


def epochs_dataset(data: Any, epochs: int) -> tuple[Iterable[Any], int | None]:
    """The dataset of ``epochs`` passes over ``data``, and an epoch's length (``None``: unknown).

    Example:
        >>> dataset, length = epochs_dataset([1, 2, 3], 2)
        >>> list(dataset), length
        ([1, 2, 3, 1, 2, 3], 3)
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"train_loop(epochs={epochs!r}): epochs must be a positive int.")
    first = None
    if hasattr(data, "__iter__"):
        if iter(data) is data and epochs > 1:
            raise TypeError(_ONE_PASS.format(epochs=epochs, kind=type(data).__name__))
        if _indexable(data):
            return SequencePasses(data, epochs), len(data)
        first = data
    elif callable(data):
        first = data()
        if not hasattr(first, "__iter__"):
            raise TypeError(_NOT_A_DATASET.format(epochs, type(first).__name__))
    else:
        kind = type(data).__name__
        raise TypeError(f"train_loop: train_dataset must be a dataset or a function, got {kind}.")
    length = len(first) if hasattr(first, "__len__") else None
    return Passes(_fresh(data), epochs, first), length
