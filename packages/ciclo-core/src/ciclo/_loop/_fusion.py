"""Step fusion: consecutive steps of a fusable callback run as one call.

A callback that implements ``__loop_steps_per_call__`` and ``__loop_callback_many__`` (see
:mod:`ciclo._loop._hooks`) runs up to K consecutive batches in one call. The engine's one
per-step path (:mod:`ciclo._loop._engine`) collects such steps in a :class:`Group` and runs
it here; the grouping rules are documented in :func:`ciclo.loop`. Its
``__loop_callback_many__`` may return the last row's logs as a third item, ``(stacked logs,
state, last row)``: the group then needs no call of its own to take that row.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import jax
import numpy as np

from .._records._logs import Logs
from .._time._elapsed import ARRAY_TYPE, Elapsed
from ._callback import NO_CHANGE, Callback
from ._in_flight import InFlight
from ._state import LoopState
from ._step import commit, run_step

__all__ = ["Group"]


def _batch_signature(batch: Any) -> tuple[Any, ...]:
    """What a group's batches share: shapes, dtypes and structure (an array's or a tuple's
    read without flattening, the common cases)."""
    if type(batch) is np.ndarray or type(batch) is ARRAY_TYPE or isinstance(batch, jax.Array):
        return batch.shape, batch.dtype
    if type(batch) is tuple:
        return (tuple, *map(_batch_signature, batch))
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    return (treedef, *((getattr(x, "shape", None), getattr(x, "dtype", type(x))) for x in leaves))


class Group:
    """Consecutive steps whose fused callback runs in one call (see :func:`ciclo.loop`)."""

    __slots__ = (
        "after",
        "batches",
        "before_logs",
        "elapsed",
        "fused",
        "observers",
        "signature",
        "size",
    )

    def __init__(self, fused: Callback, size: int, before_logs: Logs, batch: Any) -> None:
        self.fused, self.size, self.before_logs = fused, size, before_logs
        self.signature = _batch_signature(batch)
        self.elapsed: list[Elapsed] = []
        self.batches: list[Any] = []
        self.after: list[Callback] = []
        # Observers (progress bars, loggers) that fired inside the group run once, at its
        # last step: they only read, so they need not cut the group.
        self.observers: list[Callback] = []

    def accepts_batch(self, batch: Any) -> bool:
        """Whether the group can take this step (its fused callback fired first)."""
        return not self.after and _batch_signature(batch) == self.signature

    def add(self, elapsed: Elapsed, batch: Any, after: list[Callback]) -> None:
        self.elapsed.append(elapsed)
        self.batches.append(batch)
        if after:  # (else the group was open: nothing ran after it yet)
            self.after = [c for c in after if not c.observer]
            observers = self.observers
            for callback in after:  # `in`: a Callback compares by identity
                if callback.observer and callback not in observers:
                    observers.append(callback)

    def is_complete(self, loop_state: LoopState) -> bool:
        """Whether the group must run now: a callback after the fused one fired, it holds
        K steps, or the loop stops."""
        # loop_state._stop: the slot behind stop_iteration, read once per step of a group
        return bool(self.after) or len(self.batches) >= self.size or loop_state._stop

    def run(self, loop_state: LoopState, in_flight: InFlight) -> None:
        """Runs the group's steps (one fused call) and commits them."""
        loop_state.elapsed, loop_state.batch = self.elapsed[-1], self.batches[-1]
        if len(self.batches) == 1:  # a plain step
            loop_state.logs = self.before_logs
            run_step(loop_state, [self.fused, *self.after, *self.observers], in_flight)
            return
        loop_state.elapsed = self.elapsed[0]
        try:
            out = self.fused.fn.__loop_callback_many__(loop_state, self.batches)
            last_logs = out[2] if type(out) is tuple and len(out) == 3 else None
            logs, state = self.fused.result(out if last_logs is None else out[:2])
        except Exception as error:
            first, last = self.elapsed[0].steps, self.elapsed[-1].steps
            error.add_note(f"(in ciclo callback {self.fused.name} at steps {first}-{last})")
            raise
        if state is not NO_CHANGE:
            loop_state.state = state
        logs = logs or Logs()
        if self.before_logs or self.after:
            self._commit_rows(loop_state, logs, in_flight)
        else:
            self._commit_stacked(loop_state, logs, last_logs)
            in_flight.push_tree(loop_state.logs, loop_state.state)

    def _commit_rows(self, loop_state: LoopState, logs: Logs, in_flight: InFlight) -> None:
        """Callbacks ran before the group or run after it: the stacked logs are split in
        rows, the first merged with what ran before, the last, the group's step, seen by
        what runs after."""
        rows = _unstack(logs, len(self.batches))
        rows[0] = Logs(self.before_logs).merge(rows[0])
        for elapsed, batch, row in zip(self.elapsed[:-1], self.batches, rows, strict=False):
            loop_state.elapsed, loop_state.batch, loop_state.logs = elapsed, batch, row
            commit(loop_state)
        loop_state.elapsed, loop_state.batch = self.elapsed[-1], self.batches[-1]
        loop_state.logs = rows[-1]
        run_step(loop_state, [*self.after, *self.observers], in_flight)

    def _commit_stacked(self, loop_state: LoopState, logs: Logs, last_logs: Any) -> None:
        """Only the fused callback ran: the stacked logs go to history as one block."""
        loop_state.elapsed = self.elapsed[-1]
        if logs:
            loop_state.history.commit_many(self.elapsed, logs)
            loop_state.logs = _last_row(logs) if last_logs is None else last_logs
        _run_observers(self.observers, loop_state)


_OBSERVER_CHANGED = (
    "callback {name} is marked __loop_observer__ = True (it only reads the loop), but "
    "returned logs or a state; remove the marker or the return value."
)


def _run_observers(observers: list[Callback], loop_state: LoopState) -> None:
    """Runs observers after a fused group was committed; they may not change anything."""
    for callback in observers:
        logs, state = callback(loop_state)
        if logs or state is not NO_CHANGE:
            raise TypeError(_OBSERVER_CHANGED.format(name=callback.name))


@jax.jit
def _last_row(logs: Logs) -> Logs:
    return cast(Logs, jax.tree.map(lambda x: x[-1], logs))


@functools.partial(jax.jit, static_argnums=1)
def _unstack_rows(logs: Logs, count: int) -> list[Logs]:
    return [jax.tree.map(lambda x, i=i: x[i], logs) for i in range(count)]


def _unstack(logs: Logs, count: int) -> list[Logs]:
    """Stacked logs as one :class:`Logs` per row (in one dispatch)."""
    if not jax.tree_util.tree_leaves(logs):
        return [Logs() for _ in range(count)]
    return cast(list[Logs], _unstack_rows(logs, count))
