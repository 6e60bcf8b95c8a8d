"""The data position of a run of one or several processes: a stateful dataset's
``state_dict()`` is saved per process (``{"per_process": [...]}``, gathered to process 0); one
of another number of processes comes back as :class:`OtherTopology` (:func:`resplit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from .._loop._hooks import is_stateful
from .._processes._agreement import gather_to_all
from .._records import _host


def is_sequence(dataset: Any) -> bool:
    """Whether ``dataset`` is indexable by batch (a sequence, a NumPy or JAX array)."""
    return isinstance(dataset, np.ndarray | jax.Array) or (
        isinstance(dataset, Sequence) and not isinstance(dataset, str | bytes)
    )


def is_stateful_dataset(dataset: Any) -> bool:
    """Whether a checkpoint holds ``dataset.state_dict()`` (a non-sequence with
    ``state_dict`` and ``load_state_dict``)."""
    return is_stateful(dataset) and not is_sequence(dataset)


PER_PROCESS = "per_process"


def _gather(state: Any) -> list[Any]:
    """Every process's dataset ``state_dict()``, in process order (each process draws its
    own part of the data, so each has its own position)."""
    try:
        return gather_to_all("data-state", _json_ready(state))
    except TypeError as error:
        raise TypeError(f"a dataset's state_dict() must hold JSON values: {error}") from None


def _json_ready(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, Mapping):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_ready(v) for v in value]
    return value


class OtherTopology(NamedTuple):
    """The dataset states of a checkpoint written by another number of processes than this
    run has, one per process that wrote it (a run of one process saves one state). Whether
    they can be re-split over this run's processes is the dataset's business (see
    ``_resume.skip_consumed``)."""

    states: list[Any]


def own_data_state(saved: Any) -> Any:
    """This process's dataset state out of what a checkpoint holds, or an
    :class:`OtherTopology` when another number of processes wrote it."""
    if saved is None:
        return None
    per_process = isinstance(saved, Mapping) and set(saved) == {PER_PROCESS}
    states = list(saved[PER_PROCESS]) if per_process else [saved]  # one process: one state
    if len(states) != jax.process_count():
        return OtherTopology(states)
    return states[jax.process_index()]


def data_state(dataset: Any) -> Any:
    """What a checkpoint holds of ``dataset``'s state: ``state_dict()`` on the host (every
    process's, with several), or ``None`` for a dataset without one."""
    if not is_stateful_dataset(dataset):
        return None
    state = _host.to_host(dataset.state_dict())
    return {PER_PROCESS: _gather(state)} if jax.process_count() > 1 else state


def resplit(dataset: Any, states: list[Any]) -> Any:
    """The state ``dataset`` loads on this process out of ``states``, saved by another
    number of processes: their one global position, which a dataset whose ``elastic`` is
    ``True`` (``ciclo.stateful_dataset`` around Grain's ``ElasticIterator``) re-splits.

    Raises:
        ValueError: the dataset's state is per process, or the saved states differ.
    """
    fields = {"name": type(dataset).__name__, "saved": len(states), "now": jax.process_count()}
    if getattr(dataset, "elastic", False) is not True:
        raise ValueError(_PER_PROCESS_STATE.format(**fields))
    for index, other in enumerate(states[1:], start=1):
        if other != states[0]:
            raise ValueError(
                _STATES_DIFFER.format(index=index, other=other, first=states[0], **fields)
            )
    return states[0]


_OTHER_COUNT = "the checkpoint holds the dataset state of {saved} process(es), this run has {now}"
_PER_PROCESS_STATE = (
    _OTHER_COUNT + ", and {name} keeps a position per process: resume on {saved} process(es), "
    "or feed a sequence of batches or grain.experimental.ElasticIterator (docs/multihost.md)."
)
_STATES_DIFFER = (
    _OTHER_COUNT + ", and process {index} saved {other!r} but process 0 {first!r}, yet {name} "
    "keeps a global position: resume on {saved} processes."
)
