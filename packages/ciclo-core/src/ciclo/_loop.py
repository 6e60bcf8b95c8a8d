"""``ciclo.loop``: thread a state through a dataset, running callbacks on schedules."""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax

from . import _resume
from ._callback import NO_CHANGE, Callback, LoopState, as_callback, callback_name
from ._elapsed import Elapsed, Period, elapse
from ._history import History
from ._logs import Logs
from ._schedules import Schedule, as_schedule
from ._signals import exit_if_terminated, stop_gracefully_on

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
        marker = _first_array(loop_state.logs)
        if marker is None:
            marker = _first_array(loop_state.state)
            if marker is None:
                return
        self.queue.append(marker)
        if len(self.queue) > self.limit:
            oldest = self.queue.popleft()
            if not oldest.is_deleted():  # donated buffers are gone, and so finished
                oldest.block_until_ready()


def _first_array(tree: Any) -> jax.Array | None:
    if isinstance(tree, Logs):  # the common case, without flattening
        for values in tree.values():
            for value in values.values():
                if isinstance(value, jax.Array):
                    return value
        return None
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
    stop_signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    resume: str | os.PathLike[str] | None = None,
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
            a ``ciclo.checkpoint`` in ``tasks`` saves, ``on_end`` runs, then the loop
            returns after Ctrl-C (SIGINT), and the process exits with status
            ``128 + signal`` (143 for SIGTERM) after any other signal, so a scheduler sees
            an interrupted run. The same signal twice interrupts at once.
            ``loop_state.stop_reason`` says why the loop stopped.
        resume: a checkpoint directory (of ``ciclo.checkpoint``). When it holds a
            checkpoint, the loop continues from the latest one as if it had never stopped:
            state, ``elapsed``, history, the state of schedules and stateful callbacks are
            restored and the batches already consumed are skipped (see
            :func:`ciclo.restore` for how). A missing or empty directory starts afresh, so
            the same command starts a run and continues it after a preemption. On resume,
            ``on_start`` runs but its logs are not recorded again.

    Callback objects in ``tasks`` may define ``__loop_end__(loop_state, error)``: it is
    called once when the loop ends, before ``on_end`` (``error`` is ``None``), or when an
    exception leaves the loop (``error`` is that exception, raised again afterwards).

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
    end_hooks = _end_hooks(task_list)
    history = History() if history is None else history
    loop_state = LoopState(
        state,
        history,
        elapsed or Elapsed.create(),
        metadata,
        tasks=task_list,
        dataset=dataset,
    )
    source = dataset if resume is None else _resume.resume(resume, loop_state)
    steps = elapse(source, stop=stop, initial=loop_state.elapsed, batch_size_fn=batch_size_fn)
    loop_state.elapsed = steps.elapsed
    in_flight = _InFlight(max_steps_in_flight)

    run_callbacks(start_callbacks, loop_state)
    if loop_state.resumed:  # the checkpoint's history already holds them
        loop_state.logs = Logs()
    _commit(loop_state)
    if loop_state._step_end:
        loop_state.run_step_end()
    with stop_gracefully_on(loop_state, stop_signals) as received:
        try:
            for loop_state.elapsed, loop_state.batch in steps:
                loop_state.logs = Logs()
                current = loop_state.elapsed
                for schedule, callbacks in task_list:
                    if schedule(current):
                        run_callbacks(callbacks, loop_state)
                _commit(loop_state)
                if loop_state._step_end:
                    loop_state.elapsed = steps.finish()
                    loop_state.run_step_end()
                in_flight.push(loop_state)
                if loop_state.stop_iteration:
                    break
            loop_state.elapsed = steps.finish()
            loop_state.batch = None
            loop_state.logs = Logs()
        except BaseException as error:
            _run_end_hooks(end_hooks, loop_state, error)
            raise
        _run_end_hooks(end_hooks, loop_state, None)
    run_callbacks(end_callbacks, loop_state)
    _commit(loop_state)
    if loop_state._step_end:
        loop_state.run_step_end()
    exit_if_terminated(received, loop_state)
    return loop_state.state, history, loop_state.elapsed


def _end_hooks(task_list: list[tuple[Schedule, list[Callback]]]) -> list[Any]:
    """The distinct objects behind the callbacks (or their bound methods) that define
    ``__loop_end__``, in order of appearance."""
    found: dict[int, Any] = {}
    for _, callbacks in task_list:
        for callback in callbacks:
            for owner in (callback.fn, getattr(callback.fn, "__self__", None)):
                if owner is not None and callable(getattr(type(owner), "__loop_end__", None)):
                    found.setdefault(id(owner), owner)
    return list(found.values())


def _run_end_hooks(hooks: list[Any], loop_state: LoopState, error: BaseException | None) -> None:
    for owner in hooks:
        try:
            owner.__loop_end__(loop_state, error)
        except Exception as hook_error:
            if error is None:
                hook_error.add_note(f"(in ciclo callback {callback_name(owner)}.__loop_end__)")
                raise
            error.add_note(f"(and {callback_name(owner)}.__loop_end__ failed: {hook_error!r})")
