"""``ciclo.loop``: thread a state through a dataset, running callbacks on schedules."""

from __future__ import annotations

import signal
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from ._callback import NO_CHANGE, Callback, LoopState, as_callback
from ._elapsed import Elapsed, Period, elapse
from ._history import History
from ._logs import Logs
from ._named import NamedSchedule
from ._schedules import Schedule, as_schedule
from ._signals import stop_gracefully_on

__all__ = ["loop", "Tasks", "run_callbacks", "normalize_tasks"]

Tasks = Mapping[Any, Any]
CallbackList = Sequence[Callback]


def _as_callback_list(value: Any) -> list[Callback]:
    if value is None:
        return []
    if isinstance(value, list | tuple):
        return [as_callback(v) for v in value]
    return [as_callback(value)]


def normalize_tasks(tasks: Tasks | None) -> list[tuple[Schedule, list[Callback]]]:
    """``{schedule: callback | [callbacks]}`` as a list of ``(Schedule, [Callback])``.

    The caller's mapping is read, never changed.
    """
    if tasks is None:
        return []
    if not isinstance(tasks, Mapping):
        raise TypeError(
            f"tasks must be a dict {{schedule: callback or [callbacks]}}, got "
            f"{type(tasks).__name__}. Example: {{ciclo.every(1): train_step}}."
        )
    out: list[tuple[Schedule, list[Callback]]] = []
    for schedule, callbacks in tasks.items():
        if isinstance(schedule, NamedSchedule):
            raise TypeError(
                f"tasks key {schedule!r} is a named schedule: it belongs to ciclo.train_loop, "
                f"test_loop or predict_loop, which know when it happens. In loop(), use a "
                f"schedule such as ciclo.every(1)."
            )
        if isinstance(schedule, str):
            raise TypeError(
                f"tasks key {schedule!r} is a name, but loop() needs schedules such as "
                f"ciclo.every(1). Named schedules (on_train_step, ...) belong to "
                f"ciclo.train_loop / test_loop / predict_loop."
            )
        out.append((as_schedule(schedule), _as_callback_list(callbacks)))
    return out


def run_callbacks(callbacks: Iterable[Callback], loop_state: LoopState) -> None:
    """Runs callbacks in order, threading the state and merging their logs."""
    for callback in callbacks:
        try:
            logs, state = callback(loop_state)
        except Exception as error:
            error.add_note(
                f"(in ciclo callback {callback.name} at step {loop_state.elapsed.steps})"
            )
            raise
        if state is not NO_CHANGE:
            loop_state.state = state
        if logs:
            loop_state.logs.merge(logs)


def _commit(loop_state: LoopState) -> None:
    logs = loop_state.logs
    if logs:
        loop_state.history.commit(loop_state.elapsed, logs)
        loop_state.accumulated_logs.merge(logs)


class _InFlight:
    """Bounds how many steps JAX may have queued ahead of Python."""

    __slots__ = ("limit", "queue")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queue: deque[jax.Array] = deque()

    def push(self, loop_state: LoopState) -> None:
        if self.limit <= 0:
            return
        self.push_tree(loop_state.logs, loop_state.state)

    def push_tree(self, *trees: Any) -> None:
        """Marks the first array of the first tree that has one as this step's result."""
        if self.limit <= 0:
            return
        marker = next((m for m in map(_first_array, trees) if m is not None), None)
        if marker is None:
            return
        self.queue.append(marker)
        if len(self.queue) > self.limit:
            oldest = self.queue.popleft()
            if not oldest.is_deleted():  # donated buffers are gone, and so finished
                oldest.block_until_ready()


def _first_array(tree: Any) -> jax.Array | None:
    for leaf in jax.tree_util.tree_leaves(tree):
        if isinstance(leaf, jax.Array):
            return leaf
    return None


def loop(
    state: Any,
    dataset: Iterable[Any],
    tasks: Tasks | None = None,
    *,
    stop: int | Period | None = None,
    on_start: Any = None,
    on_end: Any = None,
    history: History | None = None,
    elapsed: Elapsed | None = None,
    batch_size_fn: Callable[[Any], int] | None = None,
    metadata: Any = None,
    max_steps_in_flight: int = 2,
    stop_signals: Sequence[signal.Signals] = (signal.SIGINT,),
) -> tuple[Any, History, Elapsed]:
    """Runs ``tasks`` over ``dataset``, threading ``state`` through the callbacks.

    At each batch, every schedule in ``tasks`` is asked (in order) whether it fires for
    the count *before* the batch; the callbacks of those that fire run in order. A callback
    takes the first 0-4 of ``(state, batch, elapsed, loop_state)`` and returns
    ``(logs, state)``, ``(outputs, logs, state)``, logs, a state or ``None``. The logs of
    a step are committed to ``history``; values stay on device until read.

    Args:
        state: any pytree or object (a plain dict, a ``ManagedState``, ...).
        dataset: an iterable of batches.
        tasks: ``{schedule: callback or [callbacks]}``. Callback objects such as
            ``ciclo.keras_bar(...)`` can be spread in with ``**``.
        stop: an int (steps) or ``ciclo.at(...)``; by default the dataset's end.
        on_start, on_end: callbacks (or lists) run once before the first / after the last
            step; their logs reach history.
        history: a :class:`History` to append to (new by default).
        elapsed: the count to continue from (what an earlier loop returned).
        batch_size_fn: ``batch -> int`` to count samples (leading dimension by default).
        metadata: free-form data exposed as ``loop_state.metadata``.
        max_steps_in_flight: how many steps JAX may run ahead of Python (0: unbounded).
        stop_signals: signals that end the loop gracefully: the current step finishes,
            ``on_end`` runs and the loop returns (Ctrl-C by default; a second Ctrl-C
            interrupts at once). ``loop_state.stop_reason`` says why it stopped.

    Returns:
        ``(state, history, elapsed)``, ``elapsed`` counting every batch consumed.

    Example:
        >>> import ciclo, jax, numpy as np
        >>> @jax.jit
        ... def train_step(state, batch):
        ...     logs = ciclo.logs().add_metric("mean", batch.mean())
        ...     return logs, state + 1
        >>> state, history, elapsed = ciclo.loop(
        ...     0, [np.ones((4, 2))] * 5, {ciclo.every(1): train_step}
        ... )
        >>> int(state), elapsed.steps, history.collect("mean")
        (5, 5, [1.0, 1.0, 1.0, 1.0, 1.0])
    """
    task_list = normalize_tasks(tasks)
    start_callbacks = _as_callback_list(on_start)
    end_callbacks = _as_callback_list(on_end)
    history = History() if history is None else history
    steps = elapse(dataset, stop=stop, initial=elapsed, batch_size_fn=batch_size_fn)
    loop_state = LoopState(state, history, steps.elapsed, metadata, batch_size_fn)
    in_flight = _InFlight(max_steps_in_flight)

    run_callbacks(start_callbacks, loop_state)
    _commit(loop_state)
    with stop_gracefully_on(loop_state, stop_signals):
        for loop_state.elapsed, loop_state.batch in steps:
            loop_state.logs = Logs()
            current = loop_state.elapsed
            for schedule, callbacks in task_list:
                if schedule(current):
                    run_callbacks(callbacks, loop_state)
            _commit(loop_state)
            in_flight.push(loop_state)
            if loop_state.stop_iteration:
                break
    loop_state.elapsed = steps.finish()
    loop_state.batch = None
    loop_state.logs = Logs()
    run_callbacks(end_callbacks, loop_state)
    _commit(loop_state)
    return loop_state.state, history, loop_state.elapsed
