"""``ciclo.restore`` and ``ciclo.restore_best``: read a run back from its checkpoints."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from .._records._history import History
from .._time._elapsed import Elapsed
from . import _format, _integrity
from ._lazy import LazyState

__all__ = ["Restored", "restore", "restore_best"]


class Restored(NamedTuple):
    """What :func:`restore` reads: ``(state, history, elapsed)``, like a loop returns."""

    state: Any
    history: History
    elapsed: Elapsed


def restore(directory: str | os.PathLike[str], state: Any, *, step: int | None = None) -> Restored:
    """Reads a checkpoint written by :class:`ciclo.checkpoint`.

    Each array comes back with the dtype and sharding of ``state``'s (reading only each
    device's part); leaves a checkpoint does not store are taken from ``state``.

    Args:
        directory: the checkpoint directory.
        state: a state built like the saved one (only its structure, shapes, dtypes and
            shardings are used), or a ``ciclo.lazy_state(fn)`` (only traced).
        step: which checkpoint (its ``elapsed.steps``); by default the newest intact one
            of a finite state (damaged or non-finite ones are passed over with a warning).

    Returns:
        ``(state, history, elapsed)`` as the checkpointed loop had them.

    Example:
        >>> import ciclo, jax.numpy as jnp, numpy as np, tempfile
        >>> directory = tempfile.mkdtemp()
        >>> tasks = {
        ...     ciclo.every(1): lambda state, batch: state + batch.sum(),
        ...     ciclo.every(10): ciclo.checkpoint(directory),
        ... }
        >>> _ = ciclo.loop(jnp.zeros(()), [np.ones(2)] * 3, tasks)
        >>> state, history, elapsed = ciclo.restore(directory, jnp.zeros(()))
        >>> float(state), elapsed.steps
        (6.0, 3)
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"restore(step={step!r}): pass an int (Checkpoint.all_steps()) or None.")
    path = _format.checkpoint_path(directory)
    manager = _format.open_reader(path, must_exist=True)
    if isinstance(state, LazyState):
        state = state.shapes()
    try:
        steps = _integrity.steps_on_disk(manager, path)
        if step is None:
            contents = _format.read_newest(manager, path, state, copies=False)
        elif step not in steps:
            raise FileNotFoundError(
                f"no checkpoint of step {step} in {path!r}; it holds steps {sorted(steps)}."
            )
        else:
            contents = _format.read(manager, path, step, state, copies=False)
    finally:
        manager.close()
    history = History()
    history.load_state_dict(contents.fields["history"])
    return Restored(contents.state, history, contents.fields["elapsed"])


def restore_best(directory: str | os.PathLike[str], state: Any) -> Restored:
    """Like :func:`restore`, for the checkpoint with the best monitored value
    (``ciclo.checkpoint(directory, monitor=..., mode=...)``).

    Example:
        >>> state, history, elapsed = ciclo.restore_best("runs/1", init_state)  # doctest: +SKIP
    """
    path = _format.checkpoint_path(directory)
    manager = _format.open_reader(path, must_exist=True)
    try:
        step = _format.best_step(manager, path)
    finally:
        manager.close()
    return restore(path, state, step=step)
