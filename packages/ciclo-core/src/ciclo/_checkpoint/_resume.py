"""Exact resume: how ``ciclo.loop(..., resume=directory)`` continues a run from its newest
checkpoint. The checkpoint's items are put back (:mod:`._items`: the tasks must be those of
the interrupted run, in the same order), and the data already consumed is skipped, in the
first way the dataset allows (:func:`skip_consumed`):

a stateful dataset loads its saved state (per process: :mod:`._topology`); a sequence starts
at the first batch not consumed, by index; any other iterable is replayed, dropping the
consumed batches. A run whose checkpoint records that it ended stays finished
(``loop_state.finished``) unless it asks for more (a later ``stop``, ``resume_stopped=True``).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from .._loop._state import ENDING_WORDS, STOPPED_ENDINGS, LoopState
from .._processes._outputs import OUTPUT_PROCESS, writes_here
from .._time._elapsed import Period, as_period
from . import _format, _integrity, _items, _topology
from ._in_place import restore_in_place
from ._lazy import is_shapes

__all__ = ["resume", "put_back", "skip_consumed", "iterated_by_index"]

_DATASET_NOT_STATEFUL = (
    "the checkpoint holds the dataset's state_dict(), but this dataset ({kind}) has no "
    "load_state_dict(): resume with the same kind of dataset as the interrupted run."
)
#: The line printed before the batches of a dataset that cannot seek are replayed.
_REPLAYING = (
    "ciclo: reaching the checkpoint's data position by replaying {count} batches: {kind} "
    "cannot seek{hint}."
)
_GRAIN_HINT = " (wrap it in ciclo.stateful_dataset to resume from its iterator's state)"
_SEEK_HINT = (
    " (a sequence of batches, or a dataset with state_dict()/load_state_dict(), seeks at once)"
)


def skip_consumed(dataset: Any, position: int, state: Any) -> Iterable[Any]:
    """``dataset`` from its first batch not consumed (see the module docstring).

    Example:
        >>> list(skip_consumed([10, 11, 12, 13], 2, None))
        [12, 13]
    """
    if state is not None:
        if not _topology.is_stateful_dataset(dataset):
            raise TypeError(_DATASET_NOT_STATEFUL.format(kind=type(dataset).__name__))
        if isinstance(state, _topology.OtherTopology):
            state = _topology.resplit(dataset, state.states)
        dataset.load_state_dict(state)
        return dataset  # type: ignore[no-any-return]
    if position <= 0:
        return dataset  # type: ignore[no-any-return]
    if _topology.is_sequence(dataset):
        return map(dataset.__getitem__, range(position, len(dataset)))
    if iterated_by_index(dataset):
        return _from_index(dataset, position)
    if writes_here(OUTPUT_PROCESS):
        grain = type(dataset).__module__.split(".")[0] == "grain"
        kind, hint = getattr(dataset, "replay_words", None) or (
            f"a {type(dataset).__name__}",
            _GRAIN_HINT if grain else _SEEK_HINT,
        )
        print(
            _REPLAYING.format(count=position, kind=kind, hint=hint),
            file=sys.stderr,
            flush=True,
        )
    iterator: Iterator[Any] = iter(dataset)
    for consumed in range(position):
        try:
            next(iterator)
        except StopIteration:
            raise ValueError(
                f"the dataset ended after {consumed} batches while skipping the {position} "
                f"batches the interrupted run had consumed: resume with the same dataset."
            ) from None
    return iterator


def iterated_by_index(dataset: Any) -> bool:
    """Whether Python iterates ``dataset`` by index: it has ``__getitem__`` and no
    ``__iter__`` of its own (nor is a mapping), so ``iter()`` yields ``dataset[0]``,
    ``dataset[1]``, ... up to an ``IndexError``, and a resume can start at any index.

    Example:
        >>> class Batches:
        ...     def __getitem__(self, i):
        ...         if i >= 3: raise IndexError(i)
        ...         return i * 10
        >>> iterated_by_index(Batches()), list(skip_consumed(Batches(), 1, None))
        (True, [10, 20])
    """
    kind = type(dataset)
    return (
        hasattr(kind, "__getitem__")
        and not hasattr(kind, "__iter__")
        and not isinstance(dataset, Mapping)
    )


def _from_index(dataset: Any, start: int) -> Iterator[Any]:
    """``dataset[start]``, ``dataset[start + 1]``, ... up to an ``IndexError``."""
    for index in itertools.count(start):
        try:
            batch = dataset[index]
        except IndexError:
            return
        yield batch


def may_resume(directory: str | os.PathLike[str] | None) -> bool:
    """Whether a loop given ``resume=directory`` may find a checkpoint there (a step's
    directory, complete or not; a URL may), read without opening it.

    Example:
        >>> may_resume(None), may_resume("/no/such/directory")
        (False, False)
    """
    if directory is None:
        return False
    path = _format.checkpoint_path(directory)
    if "://" in path:
        return True
    return os.path.isdir(path) and any(name.isdigit() for name in os.listdir(path))


def resume(
    directory: str | os.PathLike[str],
    loop_state: LoopState,
    *,
    stop: int | Period | None = None,
    resume_stopped: bool = False,
) -> Iterable[Any]:
    """Puts the newest intact checkpoint of a finite state in ``directory`` into
    ``loop_state`` (damaged and non-finite ones are passed over with a warning, see
    :func:`._format.read_newest`); returns what the loop should iterate (the dataset past
    the consumed batches). With no checkpoint there, leaves ``loop_state`` as it is and
    returns its dataset. When the run had ended and this loop asks for nothing more (see
    the module docstring), puts its final checkpoint into ``loop_state``, sets
    ``loop_state.finished``, says so in one line and returns no batch."""
    path = _format.checkpoint_path(directory)
    manager = _format.open_reader(path, must_exist=False)
    if manager is None:
        dataset: Iterable[Any] = loop_state.inputs.dataset
        return dataset
    try:
        newest = max(manager.all_steps())
        ending = _format.read_ending(manager, newest)
        if ending is not None and ending["reason"] in STOPPED_ENDINGS and not resume_stopped:
            try:
                return _finished(manager, path, newest, ending, loop_state, "resume_stopped=True")
            except _integrity.DamagedCheckpoint:  # read_newest below passes it over, and says so
                ending = None
        contents = _format.read_newest(manager, path, loop_state.state)
    finally:
        manager.close()
    source = _load(contents, path, loop_state)
    if ending is None or ending["reason"] in STOPPED_ENDINGS or contents.step != newest:
        return source
    period = as_period(stop, "stop")
    if period is not None and period.reached_by(contents.fields["elapsed"]):
        return _finished(None, path, newest, ending, loop_state, "a larger stop", contents)
    if _topology.is_stateful_dataset(loop_state.inputs.dataset):
        if period is None:  # its own position says nothing of what is left: finished
            return _finished(None, path, newest, ending, loop_state, "a stop", contents)
        return source
    batches = iter(source)
    try:
        first = next(batches)
    except StopIteration:  # no batch past those consumed
        return _finished(None, path, newest, ending, loop_state, "more data", contents)
    return itertools.chain([first], batches)


def put_back(
    contents: _format.Contents, path: str, loop_state: LoopState, *, tasks: bool = True
) -> None:
    """Puts ``contents`` into ``loop_state``: the state (in place where it can be), and the
    checkpoint's items (:func:`._items.put_back`; those of the tasks only with ``tasks``).
    The dataset is the caller's."""
    _items.put_back(contents.fields, loop_state, _items.Where(path, contents.step), tasks=tasks)
    original = loop_state.state  # a lazy state's shapes: nothing to restore in place
    in_place = not is_shapes(original)
    loop_state.state = restore_in_place(original, contents.state) if in_place else contents.state


def _load(contents: _format.Contents, path: str, loop_state: LoopState) -> Iterable[Any]:
    """Puts ``contents`` into ``loop_state``; returns the dataset past the consumed
    batches."""
    put_back(contents, path, loop_state)
    loop_state.resumed = True
    data = contents.fields["data"]
    return skip_consumed(loop_state.inputs.dataset, data["position"], data["state"])


def _finished(
    manager: Any,
    path: str,
    step: int,
    ending: dict[str, Any],
    loop_state: LoopState,
    fix: str,
    contents: _format.Contents | None = None,
) -> Iterable[Any]:
    """Puts the final checkpoint of a finished run into ``loop_state`` (read with
    ``manager`` unless ``contents`` holds it), marks the loop finished and says so."""
    if contents is None:  # the final checkpoint itself, even of a non-finite state
        contents = _format.read(manager, path, step, loop_state.state, copies=False)
    put_back(contents, path, loop_state)  # the callbacks too: early_stopping's best_step
    loop_state.resumed = loop_state.finished = True
    loop_state.ending = ending
    if writes_here(OUTPUT_PROCESS):
        print(
            f"ciclo: the run in {path} already ended after {ending['step']} steps "
            f"({ENDING_WORDS.get(ending['reason'], ending['reason'])}); returning its final "
            f"state without training. To train on, give {fix}.",
            file=sys.stderr,
            flush=True,
        )
    return ()
