"""``ciclo.loop``: thread a state through a dataset, running callbacks on schedules."""

from __future__ import annotations

import functools
import itertools
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import jax

from .._checkpoint import _resume
from .._loops._named import NamedSchedule
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period, elapse
from .._time._schedules import Schedule, as_schedule
from ._callback import NO_CHANGE, Callback, LoopState, as_callback, callback_name
from ._in_flight import InFlight
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


def _is_fusable(callback: Callback) -> bool:
    return hasattr(callback.fn, "__loop_callback_many__")


def _steps_per_call(callback: Callback, loop_state: LoopState) -> int:
    return int(callback.fn.__loop_steps_per_call__(loop_state))


def _batch_signature(batch: Any) -> tuple[Any, ...]:
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    return (treedef, *((getattr(x, "shape", None), getattr(x, "dtype", type(x))) for x in leaves))


class _Group:
    """Consecutive steps whose fused callback runs in one call (see :func:`loop`)."""

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
        self.after = [c for c in after if not c.observer]
        for callback in after:
            if callback.observer and not any(callback is o for o in self.observers):
                self.observers.append(callback)

    def run(self, loop_state: LoopState, in_flight: InFlight) -> None:
        loop_state.elapsed, loop_state.batch = self.elapsed[-1], self.batches[-1]
        if len(self.batches) == 1:  # a plain step
            loop_state.logs = self.before_logs
            run_callbacks([self.fused, *self.after, *self.observers], loop_state)
            _commit(loop_state)
            in_flight.push(loop_state)
            return
        loop_state.elapsed = self.elapsed[0]
        try:
            logs, state = self.fused.parse(
                self.fused.fn.__loop_callback_many__(loop_state, self.batches)
            )
        except Exception as error:
            first, last = self.elapsed[0].steps, self.elapsed[-1].steps
            error.add_note(f"(in ciclo callback {self.fused.name} at steps {first}-{last})")
            raise
        if state is not NO_CHANGE:
            loop_state.state = state
        logs = logs or Logs()
        if self.before_logs or self.after:
            rows = _unstack(logs, len(self.batches))
            rows[0] = Logs(self.before_logs).merge(rows[0])
            for elapsed, batch, row in zip(self.elapsed[:-1], self.batches, rows, strict=False):
                loop_state.elapsed, loop_state.batch, loop_state.logs = elapsed, batch, row
                _commit(loop_state)
            loop_state.elapsed, loop_state.batch = self.elapsed[-1], self.batches[-1]
            loop_state.logs = rows[-1]
            run_callbacks([*self.after, *self.observers], loop_state)
            _commit(loop_state)
        else:
            loop_state.elapsed = self.elapsed[-1]
            if logs:
                loop_state.history.commit_many(self.elapsed, logs)
                loop_state.logs = _last_row(logs)
                loop_state.accumulated_logs.merge(loop_state.logs)
            _run_observers(self.observers, loop_state)
        in_flight.push(loop_state)


def _run_observers(observers: list[Callback], loop_state: LoopState) -> None:
    """Runs observers after a fused group was committed; they may not change anything."""
    for callback in observers:
        logs, state = callback(loop_state)
        if logs or state is not NO_CHANGE:
            raise TypeError(
                f"callback {callback.name} is marked __loop_observer__ = True (it only reads "
                f"the loop), but returned logs or a state; remove the marker or the return "
                f"value."
            )


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


def _fired(
    task_list: list[tuple[Schedule, list[Callback]]], elapsed: Elapsed
) -> Iterator[Callback]:
    """The callbacks whose schedule fires, in order; each schedule is asked only when the
    iteration reaches it, so callbacks that ran before it have already run."""
    for schedule, callbacks in task_list:
        if schedule(elapsed):
            yield from callbacks


def _start_step(
    loop_state: LoopState,
    elapsed: Elapsed,
    batch: Any,
    fired: Iterator[Callback],
    in_flight: InFlight,
) -> _Group | None:
    """Runs a step's callbacks in order, up to a fused callback (K > 1): then asks the
    remaining schedules and returns the group that step starts. Without one, the step is
    complete (committed) and the result is ``None``."""
    loop_state.elapsed, loop_state.batch, loop_state.logs = elapsed, batch, Logs()
    for callback in fired:
        if _is_fusable(callback):
            size = _steps_per_call(callback, loop_state)
            if size > 1:
                group = _Group(callback, size, loop_state.logs, batch)
                group.add(elapsed, batch, list(fired))
                return group
        run_callbacks([callback], loop_state)
    _commit(loop_state)
    in_flight.push(loop_state)
    return None


def _run_steps(
    loop_state: LoopState,
    steps: elapse,
    task_list: list[tuple[Schedule, list[Callback]]],
    in_flight: InFlight,
) -> None:
    """Runs every batch: the callbacks whose schedules fire, in order, then a commit of the
    step's logs. Consecutive steps of a fused callback run as one group (see :func:`loop`).

    What callbacks queued with ``loop_state.at_step_end`` runs once a step (or a group) is
    complete and no batch is drawn but not yet run, so it sees a consistent run."""
    group: _Group | None = None
    for elapsed, batch in steps:
        # Schedules may look at the step being decided (train_loop's clock does).
        loop_state.elapsed, loop_state.batch = elapsed, batch
        fired = _fired(task_list, elapsed)  # asked lazily, in order
        if group is not None:
            first = next(fired, None)
            if first is group.fused and group.accepts_batch(batch):
                group.add(elapsed, batch, list(fired))
            else:
                group.run(loop_state, in_flight)
                loop_state.elapsed, loop_state.batch = elapsed, batch
                head = [] if first is None else [first]
                group = _start_step(
                    loop_state, elapsed, batch, itertools.chain(head, fired), in_flight
                )
        else:
            group = _start_step(loop_state, elapsed, batch, fired, in_flight)
        if group is not None and (
            group.after or len(group.batches) >= group.size or loop_state.stop_iteration
        ):
            group.run(loop_state, in_flight)
            group = None
        if group is None:
            _end_step(loop_state)
        if loop_state.stop_iteration:
            break
    if group is not None:
        group.run(loop_state, in_flight)
        _end_step(loop_state)


def _end_step(loop_state: LoopState) -> None:
    """Runs the step-end hooks, with ``elapsed`` counting the step just done."""
    if not loop_state._step_end:
        return
    before = loop_state.elapsed
    loop_state.elapsed = loop_state.elapsed_after_step()
    try:
        loop_state.run_step_end()
    finally:
        loop_state.elapsed = before


def _end_hooks(callback_lists: Iterable[list[Callback]]) -> list[Any]:
    """The distinct objects behind the callbacks (or their bound methods) that define
    ``__loop_end__``, in order of appearance."""
    found: dict[int, Any] = {}
    for callbacks in callback_lists:
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
            a ``ciclo.checkpoint`` of the loop saves, ``on_end`` runs, then the loop
            returns after Ctrl-C (SIGINT), and the process exits with status
            ``128 + signal`` (143 for SIGTERM) after any other signal, so that a scheduler
            sees an interrupted run. The same signal twice interrupts at once. Only the
            outermost loop handles them: a loop run inside a callback runs to its end.
            ``loop_state.stop_reason`` says why the loop stopped.
        resume: a checkpoint directory (or the ``ciclo.checkpoint`` itself). When it holds a
            checkpoint, the loop continues from the latest one as if it had never stopped:
            state, ``elapsed``, history, the state of schedules and stateful callbacks are
            restored and the batches already consumed are skipped (see
            :func:`ciclo.checkpoint` for how). A missing or empty directory starts afresh, so
            that one command starts a run and continues it after a preemption. On resume,
            ``on_start`` runs but its logs are not recorded again.

    Callback objects (in ``tasks``, ``on_start`` or ``on_end``, or whose bound methods are)
    may define ``__loop_end__(loop_state, error)``: it is called once when the loop ends,
    before ``on_end`` (``error`` is ``None``), or when an exception leaves the loop
    (``error`` is that exception, raised again afterwards). Callbacks may queue work for the
    end of the current step with ``loop_state.at_step_end(fn)``.

    Fused steps: a callback that implements ``__loop_steps_per_call__(loop_state) -> K``
    and ``__loop_callback_many__(loop_state, batches) -> (stacked logs, state)`` (a managed
    step under a strategy with ``steps_per_call=K``) runs up to K consecutive batches in one
    call. Every schedule is still asked once per batch, in order, when the batch is drawn,
    and a group is cut so that each callback runs on exactly the steps, the state and the
    logs it would see with K=1: a group holds consecutive steps where the fused callback
    fires, ends after a step where a callback placed *after* it fires too (that callback
    then runs on the group's final state and that step's logs), and starts anew at a step
    where one placed *before* it fires (it runs first, on the state before the group).
    Batches of another shape (a smaller last batch) also start a new group; a group of one
    is a plain step. So a callback that fires on every step (put in the same task as the
    fused step) leaves nothing to fuse: give it its own, sparser schedule. The exception
    are *observers*, callback objects whose class sets ``__loop_observer__ = True``
    (progress bars, loggers): they only read the loop and return nothing, so when they fire
    inside a group they run once, after it, on its last step, and do not cut it.

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
    end_hooks = _end_hooks([start_callbacks, *(c for _, c in task_list), end_callbacks])
    history = History() if history is None else history
    loop_state = LoopState(
        state,
        history,
        elapsed or Elapsed.create(),
        metadata,
        batch_size_fn,
        tasks=task_list,
        dataset=dataset,
    )
    source = dataset if resume is None else _resume.resume(resume, loop_state)
    steps = elapse(source, stop=stop, initial=loop_state.elapsed, batch_size_fn=batch_size_fn)
    loop_state.elapsed = steps.elapsed
    in_flight = InFlight(max_steps_in_flight)

    run_callbacks(start_callbacks, loop_state)
    if loop_state.resumed:  # the checkpoint's history already holds them
        loop_state.logs = Logs()
    _commit(loop_state)
    _end_step(loop_state)
    with stop_gracefully_on(loop_state, stop_signals) as received:
        try:
            _run_steps(loop_state, steps, task_list, in_flight)
            loop_state.elapsed = steps.finish()
            loop_state.batch = None
            loop_state.logs = Logs()
        except BaseException as error:
            _run_end_hooks(end_hooks, loop_state, error)
            raise
        _run_end_hooks(end_hooks, loop_state, None)
    run_callbacks(end_callbacks, loop_state)
    _commit(loop_state)
    _end_step(loop_state)
    exit_if_terminated(received, loop_state)
    return loop_state.state, history, loop_state.elapsed
