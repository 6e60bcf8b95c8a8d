"""``ciclo.loop``: thread a state through a dataset, running callbacks on schedules.

Per batch, the engine asks each schedule in order and runs the callbacks of those that fire
(:func:`~ciclo._loop._step.run_callbacks`), commits the step's logs, bounds the steps in
flight and runs what callbacks queued for the step's end. The callback contract is in
:mod:`ciclo._loop._hooks`; loops whose tasks hold a fusable step are driven by
:mod:`ciclo._loop._fusion` instead.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .._checkpoint import _resume
from .._processes._agreement import Agreement, end_agreement, preemption_service_on, start_agreement
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period, elapse
from .._time._schedules import NamedSchedule, Schedule, as_schedule
from ._agreed import AgreedLoopState, agreed_elapse
from ._arguments import check_arguments, check_dataset, checked_batch_size_fn
from ._callback import Callback, as_callback, callback_name
from ._fusion import run_fused_steps
from ._hooks import EndHook, end_hook_owners, steps_per_call
from ._in_flight import InFlight
from ._signals import exit_if_terminated, stop_gracefully_on
from ._state import LoopState
from ._step import commit, run_callbacks

__all__ = ["loop", "Tasks", "normalize_tasks"]

Tasks = Mapping[Any, Any]


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


def _run_steps(
    loop_state: LoopState,
    steps: elapse,
    task_list: list[tuple[Schedule, list[Callback]]],
    in_flight: InFlight,
) -> None:
    """Runs every batch: the callbacks whose schedules fire, in order (each schedule asked
    when the previous task's callbacks have run), then a commit of the step's logs, then
    what callbacks queued with ``loop_state.at_step_end``. Tasks holding a fusable callback
    asking for several steps per call (K > 1) when the loop starts are run by
    :func:`~ciclo._loop._fusion.run_fused_steps` instead. (A fusable callback whose K
    becomes larger than 1 later runs one step per call here: the same steps, unfused.)"""
    if any(
        callback.fusable and steps_per_call(callback.fn, loop_state) > 1
        for _, callbacks in task_list
        for callback in callbacks
    ):
        run_fused_steps(loop_state, steps, task_list, in_flight)
        return
    for elapsed, batch in steps:
        loop_state.elapsed = elapsed
        loop_state.batch = batch
        loop_state.logs = Logs()
        for schedule, callbacks in task_list:
            if schedule(elapsed):
                run_callbacks(callbacks, loop_state)
        commit(loop_state)
        in_flight.push(loop_state)
        loop_state.end_step()
        if loop_state.stop_iteration:
            break


def _run_end_hooks(
    hooks: list[EndHook], loop_state: LoopState, error: BaseException | None
) -> None:
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
    agree_every: int = 1,
    fault_timeout: float = 60.0,
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
        agree_every: with several processes (``jax.distributed``), the steps between two
            agreements of the processes on the loop's decisions (one small exchange through
            JAX's coordination service). 1, the default, takes every decision at exactly
            the step one process would; with N, time-based schedules and stops requested by
            callbacks or signals take effect up to N - 1 steps late, the same step on every
            process. Ignored with one process (nothing is exchanged).
        fault_timeout: with several processes, the seconds a process waits for another
            before the job ends with an error naming it (an exception on one process ends
            the others at once).

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
    check_arguments(history, elapsed, batch_size_fn, stop_signals)
    check_dataset(dataset)
    if batch_size_fn is not None:
        batch_size_fn = checked_batch_size_fn(batch_size_fn)
    task_list = normalize_tasks(tasks)
    start_callbacks = _as_callback_list(on_start)
    end_callbacks = _as_callback_list(on_end)
    every_callback = itertools.chain(start_callbacks, *(c for _, c in task_list), end_callbacks)
    end_hooks = end_hook_owners(callback.fn for callback in every_callback)
    history = History() if history is None else history
    agreement = start_agreement(every=agree_every, timeout=fault_timeout)
    loop_state = (LoopState if agreement is None else AgreedLoopState)(
        state,
        history,
        elapsed or Elapsed.create(),
        metadata,
        batch_size_fn,
        tasks=task_list,
        dataset=dataset,
        **({} if agreement is None else {"process_count": agreement.count}),
    )
    try:
        received = _run(
            loop_state, resume, stop, batch_size_fn, max_steps_in_flight, stop_signals, agreement,
            start_callbacks, task_list, end_callbacks, end_hooks,
        )  # fmt: skip
    except BaseException as error:
        if agreement is not None:
            agreement.fail(error)
        raise
    finally:
        if agreement is not None:
            end_agreement(agreement)
    exit_if_terminated(received, loop_state)
    return loop_state.state, history, loop_state.elapsed


def _run(
    loop_state: LoopState,
    resume: str | os.PathLike[str] | None,
    stop: int | Period | None,
    batch_size_fn: Callable[[Any], int] | None,
    max_steps_in_flight: int,
    stop_signals: Sequence[signal.Signals],
    agreement: Agreement | None,
    start_callbacks: list[Callback],
    task_list: list[tuple[Schedule, list[Callback]]],
    end_callbacks: list[Callback],
    end_hooks: list[EndHook],
) -> list[signal.Signals]:
    """Runs the loop; returns the signals that stopped it (see ``stop_gracefully_on``)."""
    source = loop_state.dataset if resume is None else _resume.resume(resume, loop_state)
    steps: elapse
    if agreement is None:
        steps = elapse(source, stop=stop, initial=loop_state.elapsed, batch_size_fn=batch_size_fn)
    else:
        assert isinstance(loop_state, AgreedLoopState)
        steps = agreed_elapse(
            source,
            stop=stop,
            initial=loop_state.elapsed,
            batch_size_fn=batch_size_fn,
            agreement=agreement,
            loop_state=loop_state,
        )
        if preemption_service_on():  # JAX's preemption notifier owns SIGTERM
            stop_signals = [s for s in stop_signals if s != signal.SIGTERM]
    loop_state.elapsed = steps.elapsed
    in_flight = InFlight(max_steps_in_flight)

    run_callbacks(start_callbacks, loop_state)
    if loop_state.resumed:  # the checkpoint's history already holds them
        loop_state.logs = Logs()
    commit(loop_state)
    loop_state.end_step()
    with stop_gracefully_on(loop_state, stop_signals) as received:
        if isinstance(steps, agreed_elapse):
            steps.received = received
        try:
            _run_steps(loop_state, steps, task_list, in_flight)
            loop_state.elapsed = steps.finish()
            loop_state.batch = None
            loop_state.logs = Logs()
        except BaseException as error:
            if agreement is not None:  # at once, so the others end too
                agreement.fail(error)
            _run_end_hooks(end_hooks, loop_state, error)
            raise
        _run_end_hooks(end_hooks, loop_state, None)
    run_callbacks(end_callbacks, loop_state)
    commit(loop_state)
    loop_state.end_step()
    return received
