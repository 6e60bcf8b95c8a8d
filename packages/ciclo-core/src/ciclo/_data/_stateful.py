"""``stateful_dataset``: a dataset whose iterator has ``get_state()``/``set_state()`` (a Grain
``DataLoader``, ``IterDataset`` or ``DatasetIterator``), exposed as the ``state_dict()`` /
``load_state_dict()`` pair that a checkpoint saves with each step, so a resumed run continues
from the iterator's own state instead of replaying batches.

With several processes, each process's iterator has its own state: a checkpoint holds every
process's (``_checkpoint/_format.py``) and each process loads its own back. Grain's
``ElasticIterator`` is :attr:`StatefulDataset.elastic`: its state is the global count of
records consumed, the same on every process, which each process re-splits by its own shard
options, so its checkpoints resume on another number of processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["StatefulDataset", "stateful_dataset"]

#: Grain's iterators whose state is a global position (``{"global_next_index": records}``),
#: recognised by their class (Grain is never imported here).
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


_NOT_ITERABLE = (
    "stateful_dataset: {kind} is not iterable; give a Grain DataLoader, IterDataset or "
    "DatasetIterator (an iterator with get_state() and set_state())."
)
_ITERATOR_WITHOUT_STATE = (
    "stateful_dataset: the iterator of {kind} ({iterator}) has no get_state()/set_state(); "
    "a Grain DataLoader or IterDataset has them."
)


class StatefulDataset:
    """Iterates ``source`` through one iterator whose state a checkpoint holds; made by
    :func:`stateful_dataset`.

    Attributes:
        source: what was given.
        drawn: how many batches were drawn from the iterator by this object (not counting
            the batches before a loaded state).
    """

    def __init__(self, source: Any) -> None:
        if not (_has_state(source) or callable(getattr(source, "__iter__", None))):
            raise TypeError(_NOT_ITERABLE.format(kind=type(source).__name__))
        self.source = source
        self.drawn = 0
        self._iterator: Any = None

    @property
    def iterator(self) -> Any:
        """The iterator batches come from (made at first use)."""
        if self._iterator is None:
            iterator = self.source if _has_state(self.source) else iter(self.source)
            if not _has_state(iterator):
                raise TypeError(
                    _ITERATOR_WITHOUT_STATE.format(
                        kind=type(self.source).__name__, iterator=type(iterator).__name__
                    )
                )
            self._iterator = iterator
        return self._iterator

    @property
    def elastic(self) -> bool:
        """Whether the state is a global position, the same on every process, that each
        process re-splits when it loads it (Grain's ``ElasticIterator``): a checkpoint then
        resumes on any number of processes."""
        kind = type(self.source)
        return kind.__module__.startswith("grain.") and kind.__name__ in _ELASTIC_GRAIN_CLASSES

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        batch = next(self.iterator)
        self.drawn += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """This process's iterator state, as JSON values (with several processes, a
        checkpoint holds every process's, and gives each its own back)."""
        return _encode(self.iterator.get_state())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Puts back this process's iterator state."""
        self.iterator.set_state(_decode(state))


def stateful_dataset(source: Any) -> StatefulDataset:
    """A dataset that a checkpoint saves by its iterator's own state (``get_state`` /
    ``set_state``: Grain's ``DataLoader``, ``IterDataset``, ``DatasetIterator``), so a
    resumed run continues exactly where the interrupted one was, without replaying batches.

    Give it to the loop in place of ``source``: ``ciclo.train_loop(state,
    ciclo.stateful_dataset(loader), ...)``. With several processes, each keeps its own state,
    and a checkpoint resumes on as many processes only; around Grain's
    ``grain.experimental.ElasticIterator`` the state is global (:attr:`StatefulDataset.elastic`)
    and resumes on any number of processes.

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
