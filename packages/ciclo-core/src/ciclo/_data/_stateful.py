"""``stateful_dataset``: a dataset whose iterator has ``get_state()``/``set_state()`` (Grain),
saved by checkpoints so that a resumed run continues from the iterator's own state.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["StatefulDataset", "stateful_dataset"]

#: Grain's iterators whose state is a global position, by class name (Grain not imported).
_ELASTIC_GRAIN_CLASSES = frozenset({"ElasticIterator", "_ElasticMapDatasetIterator"})


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "get_state", None)) and callable(getattr(obj, "set_state", None))


def _encode(state: Any) -> dict[str, Any]:
    """An iterator state as JSON values (Grain's ``DataLoaderIterator`` states are bytes)."""
    if isinstance(state, bytes):
        return {"bytes": state.decode("utf-8")}
    return {"json": json.dumps(state, sort_keys=True)}


def _decode(saved: Mapping[str, Any]) -> Any:
    if "bytes" in saved:
        return str(saved["bytes"]).encode("utf-8")
    return json.loads(str(saved["json"]))


_NOT_ITERABLE = "stateful_dataset: {} is not iterable; give a Grain DataLoader or IterDataset."
_NO_STATE = "stateful_dataset: the iterator of {} has no get_state()/set_state(); give a Grain one."


class StatefulDataset:
    """Iterates ``source`` through one iterator whose state a checkpoint holds.

    Attributes:
        source: what was given.
        drawn: batches drawn by this object (after a loaded state).
    """

    def __init__(self, source: Any) -> None:
        if not (_has_state(source) or callable(getattr(source, "__iter__", None))):
            raise TypeError(_NOT_ITERABLE.format(type(source).__name__))
        self.source = source
        self.drawn = 0
        self._iterator: Any = None

    @property
    def iterator(self) -> Any:
        """The iterator batches come from (made at first use)."""
        if self._iterator is None:
            iterator = self.source if _has_state(self.source) else iter(self.source)
            if not _has_state(iterator):
                raise TypeError(_NO_STATE.format(type(self.source).__name__))
            self._iterator = iterator
        return self._iterator

    @property
    def elastic(self) -> bool:
        """Whether the state is a global position re-split by each process (``ElasticIterator``)."""
        kind = type(self.source)
        return kind.__module__.startswith("grain.") and kind.__name__ in _ELASTIC_GRAIN_CLASSES

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self.drawn += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """This process's iterator state, as JSON values."""
        return _encode(self.iterator.get_state())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Puts back this process's iterator state."""
        self.iterator.set_state(_decode(state))


def stateful_dataset(source: Any) -> StatefulDataset:
    """A dataset that a checkpoint saves by its iterator's own state (Grain's ``DataLoader``...),
    resumed without replaying batches; per process, or global for ``ElasticIterator``.

    Example:
        >>> class Counter:  # any iterator with get_state()/set_state()
        ...     def __init__(self): self.i = 0
        ...     def __iter__(self): return self
        ...     def __next__(self): self.i += 1; return self.i
        ...     def get_state(self): return {"i": self.i}
        ...     def set_state(self, state): self.i = state["i"]
        >>> data = stateful_dataset(Counter())
        >>> next(data), next(data)
        (1, 2)
        >>> saved = data.state_dict()
        >>> again = stateful_dataset(Counter())
        >>> again.load_state_dict(saved)
        >>> next(again)
        3
    """
    return StatefulDataset(source)
