"""``ciclo.loop``: the public loop, composed around the engine.

It reads top to bottom, in the order a run happens: the arguments are checked, the tasks
read, a checkpoint to resume from is put back, the processes of a job agree (several
processes only), the signals that stop a run gracefully are caught, ``on_start`` runs, the
record of the loop's phases is made for a time ledger or a watchdog among the callbacks, the
engine (:func:`ciclo._loop._engine.run`) runs every batch (again from an earlier point
after a callback such as ``rollback_on_nan`` put the loop back there), the loop's end hooks and
``on_end`` run, and a run stopped by SIGTERM exits with its status. The engine knows none
of these: each composes around it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .._checkpoint import _resume
from .._checkpoint._lazy import LazyState, is_shapes
from .._loop._agreed import AgreedDecisions
from .._loop._arguments import check_arguments, check_dataset, checked_batch_size_fn
from .._loop._engine import run
from .._loop._hooks import PhaseWatcher, RestartHook, hook_owners
from .._loop._in_flight import STEPS_IN_FLIGHT
from .._loop._signals import exit_if_terminated, stop_gracefully_on
from .._loop._state import LoopInputs, LoopState, record_ending
from .._loop._step import commit, run_step
from .._loop._tasks import Tasks, as_callback_list, normalize_tasks, restart, run_end_hooks
from .._processes._agreement import (
    ProcessFailedError,
    end_agreement,
    preemption_service_on,
    start_agreement,
)
from .._records._history import History
from .._records._logs import Logs
from .._time._elapsed import Elapsed, Period, elapse
from .._time._phases import CHECKPOINT, Phases, marked

__all__ = ["loop"]


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
    max_steps_in_flight: int | None = None,
    stop_signals: Sequence[signal.Signals] = (signal.SIGINT, signal.SIGTERM),
    resume: str | os.PathLike[str] | None = None,
    resume_stopped: bool = False,
    agree_every: int | None = None,
    fault_timeout: float = 60.0,
) -> tuple[Any, History, Elapsed]:
    """Runs ``tasks`` over ``dataset``, threading ``state`` through the callbacks.

    At each batch, every schedule in ``tasks`` is asked (in order) whether it fires for
    the count *before* the batch; the callbacks of those that fire run in order. A callback
    takes the first 0-4 of ``(state, batch, elapsed, loop_state)`` and returns
    ``(logs, state)``, ``(outputs, logs, state)``, logs, a state or ``None``. The logs of
    a step are committed to ``history``; values stay on device until read.

    Args:
        state: any pytree or object (a plain dict, a ``ManagedState``, ...), or
            ``ciclo.lazy_state(fn)``: built by ``fn()`` unless ``resume`` restores it (then
            only traced for its shapes).
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
        max_steps_in_flight: how many steps JAX may run ahead of Python (0: unbounded;
            by default 8; a fused call counts as one). The loop marks a step every
            ``max_steps_in_flight`` steps and waits for the mark before it, so at most
            twice as many are queued, and a step pays a counter.
        stop_signals: signals that end the loop gracefully: the current step finishes,
            a ``ciclo.checkpoint`` of the loop saves, ``on_end`` runs, then the loop
            returns after Ctrl-C (SIGINT), and the process exits with status
            ``128 + signal`` (143 for SIGTERM) after any other signal, so that a scheduler
            sees an interrupted run. The same signal twice interrupts at once. Only the
            outermost loop handles them: a loop run inside a callback (an evaluation)
            ends at its next batch and its callback records nothing.
            ``loop_state.stop_reason`` says why the loop stopped.
        resume: a checkpoint directory (or the ``ciclo.checkpoint`` itself). When it holds a
            checkpoint, the loop continues from the latest one as if it had never stopped:
            state, ``elapsed``, history, the state of schedules and stateful callbacks are
            restored and the batches already consumed are skipped (see
            :class:`ciclo.checkpoint` for how). A missing or empty directory starts afresh, so
            that one command starts a run and continues it after a preemption. On resume,
            ``on_start`` runs but its logs are not recorded again. A run that had ended
            (its ``stop`` reached, its data run out, or stopped by a callback such as
            early stopping) stays finished: the loop returns at once with its final state,
            history and elapsed, says so in one line, and runs and writes nothing. A larger
            ``stop`` (or more data) continues it.
        resume_stopped: with ``resume=``, continue a run that a callback stopped (early
            stopping, ``terminate_on_nan``, ``loop_state.request_stop``) instead of
            returning it as finished. Early stopping goes on counting its patience from
            where it stopped: give it a larger ``patience`` (or leave it out) to train on.
        agree_every: with several processes (``jax.distributed``), the steps between two
            rounds of agreement of the processes on what differs between them: their
            clocks, stops requested by a callback or a signal on one of them. ``None``, the
            default, lets process 0 space the rounds about 0.1 s apart whatever a step
            takes, and up to 0.5 s apart when a round is slow (at most 0.5% of its time in
            rounds); ``N``: every N steps. No step waits for a round: each process reads the
            others' records of the round before, so such a decision takes effect the same
            step on every process, one to two rounds after it was due (at most ``2N - 1``
            steps, or 0.2-1 s by default). Step and sample schedules, ``stop=`` in steps
            or samples, and early stopping are never exchanged: they take effect at once.
            Ignored with one process (nothing is exchanged).
        fault_timeout: with several processes, the seconds a process waits for another
            before the job ends with an error naming it (an exception on one process ends
            the others at once).

    A callback ends the loop with ``loop_state.request_stop(reason)`` (or by setting
    ``loop_state.stop_iteration = True``), with one process or several alike.

    Callback objects (in ``tasks``, ``on_start`` or ``on_end``, or whose bound methods are)
    may define ``__loop_end__(loop_state, error)``: it is called once when the loop ends,
    before ``on_end`` (``error`` is ``None``), or when an exception leaves the loop
    (``error`` is that exception, raised again afterwards). Callbacks may queue work for the
    end of the current step with ``loop_state.at_step_end(fn)``.

    Fused steps: a callback that implements ``__loop_steps_per_call__(loop_state) -> K`` and
    ``__loop_callback_many__(loop_state, batches) -> (stacked logs, state[, last row])`` (a
    managed step under a strategy with ``steps_per_call=K``) runs up to K consecutive batches in
    one call. Every schedule is still asked once per batch, in order, when the batch is drawn,
    and a group is cut so that each callback runs on exactly the steps, the state and the logs
    it would see with K=1: a group holds consecutive steps where the fused callback fires, ends
    after a step where a callback placed *after* it fires too (that callback then runs on the
    group's final state and that step's logs), and starts anew at a step where one placed
    *before* it fires (it runs first, on the state before the group). Batches of another shape
    (a smaller last batch) also start a new group; a group of one is a plain step. So a callback
    that fires on every step (put in the same task as the fused step) leaves nothing to fuse:
    give it its own, sparser schedule. The exception are *observers*, callback objects whose
    class sets ``__loop_observer__ = True`` (progress bars, loggers): they only read the loop
    and return nothing, so when they fire inside a group they run once, after it, on its last
    step, and do not cut it.

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
    # 1. The arguments and the tasks, read once.
    check_arguments(history, elapsed, batch_size_fn, stop_signals)
    if not isinstance(resume_stopped, bool):
        raise TypeError(f"loop(resume_stopped={resume_stopped!r}): expected True or False.")
    if resume_stopped and resume is None:
        raise ValueError("loop(resume_stopped=True) continues a run: give resume=its directory.")
    check_dataset(dataset)
    if batch_size_fn is not None:
        batch_size_fn = checked_batch_size_fn(batch_size_fn)
    task_list = normalize_tasks(tasks)
    start_callbacks = as_callback_list(on_start)
    end_callbacks = as_callback_list(on_end)
    every_callback = itertools.chain(start_callbacks, *(c for _, c in task_list), end_callbacks)
    every_fn = [callback.fn for callback in every_callback]
    end_hooks = hook_owners(every_fn, "__loop_end__")
    restarts = hook_owners(every_fn, "__loop_restart__")
    watchers = hook_owners(every_fn, "__loop_phases__")
    history = History() if history is None else history
    lazy = state if isinstance(state, LazyState) else None
    if lazy is not None:  # traced for a resume's shapes, or built now
        state = lazy.shapes() if _resume.may_resume(resume) else lazy.build()
    loop_state = LoopState(
        state,
        history,
        elapsed or Elapsed.create(),
        metadata,
        batch_size_fn,
        inputs=LoopInputs(tasks=task_list, dataset=dataset, stop=stop),
    )
    # 2. Several processes: their decisions are agreed (None with one process).
    agreement = start_agreement(every=agree_every, timeout=fault_timeout)
    received: list[signal.Signals] = []
    decisions = None if agreement is None else AgreedDecisions(agreement, loop_state, received)
    if decisions is not None and preemption_service_on():  # JAX's notifier owns SIGTERM
        stop_signals = [s for s in stop_signals if s != signal.SIGTERM]
    try:
        # 3. Resume: the state, counts, history and callbacks of the latest checkpoint, and
        # the dataset past the batches it consumed.
        # A finished run returns at once: nothing runs, nothing is written.
        source = (
            dataset
            if resume is None
            else _resume.resume(resume, loop_state, stop=stop, resume_stopped=resume_stopped)
        )
        if loop_state.finished:
            run_end_hooks(end_hooks, loop_state, None)  # they release what they hold
            return loop_state.state, history, loop_state.elapsed
        if lazy is not None and is_shapes(loop_state.state):  # nothing restored: built
            loop_state.state = lazy.build()
        count_size = (
            batch_size_fn
            if decisions is None
            else decisions.batch_size_fn(loop_state.batch_size_fn)
        )

        def counted(batches: Iterable[Any]) -> elapse:
            steps = elapse(
                batches,
                stop=stop,
                initial=loop_state.elapsed,
                batch_size_fn=count_size,
                clock=decisions is None,
            )
            loop_state.elapsed = steps.elapsed
            return steps

        steps = counted(source)
        if decisions is not None:
            decisions.attach(steps)
        steps_in_flight = STEPS_IN_FLIGHT if max_steps_in_flight is None else max_steps_in_flight
        # 4. on_start (its logs are already in a resumed history).
        run_step(loop_state, start_callbacks)
        if loop_state.resumed:
            loop_state.logs = Logs()
        commit(loop_state)
        loop_state.end_step()
        # 5. The batches, with stop signals caught.
        with (
            stop_gracefully_on(loop_state, stop_signals, received),
            _phases_watched(loop_state, watchers),
        ):
            try:
                while True:
                    run(
                        loop_state,
                        steps,
                        task_list,
                        max_steps_in_flight=steps_in_flight,
                        phases=loop_state.phases,
                    )
                    # A callback that stopped the engine to roll the loop back
                    # (rollback_on_nan) put back an earlier state: the engine runs again
                    # from there.
                    if received or (batches := _restart(restarts, loop_state)) is None:
                        break
                    steps = counted(batches)
                    if decisions is not None:
                        decisions.restart(steps)
                if decisions is not None:
                    decisions.finish(loop_state.elapsed.steps)
                record_ending(loop_state, stop)
            except BaseException as error:
                lost = None
                if agreement is not None:
                    if isinstance(error, Exception) and not isinstance(error, ProcessFailedError):
                        # A collective with a dead process? Asked while the others still
                        # beat: once they learn of this error they end, and beat no more.
                        lost = agreement.lost_process()
                    agreement.fail(error)  # so the others end too
                run_end_hooks(end_hooks, loop_state, error)
                if lost is not None:
                    raise lost from error
                raise
            run_end_hooks(end_hooks, loop_state, None)
        # 6. on_end.
        run_step(loop_state, end_callbacks)
        commit(loop_state)
        loop_state.end_step()
    except BaseException as error:
        if agreement is not None:
            agreement.fail(error)
        raise
    finally:
        if agreement is not None:
            end_agreement(agreement)
    # 7. A run stopped by SIGTERM (not Ctrl-C) exits with status 128 + signal.
    exit_if_terminated(received, loop_state)
    return loop_state.state, history, loop_state.elapsed


def _restart(restarts: list[RestartHook], loop_state: LoopState) -> Iterable[Any] | None:
    """:func:`restart`, in the checkpoint phase for the ledger and the watchdog (a rollback
    restores a checkpoint)."""
    with marked(loop_state.phases, CHECKPOINT):
        return restart(restarts, loop_state)


@contextlib.contextmanager
def _phases_watched(loop_state: LoopState, watchers: list[PhaseWatcher]) -> Iterator[None]:
    """The record of phases this loop owns and marks (``loop_state.phases``) while its
    batches run, when the ledger or the watchdog is among its callbacks: they are told when
    the steps begin, and once the loop's end hooks have run."""
    if not watchers:
        yield
        return
    try:
        with Phases() as loop_state.phases:
            for watcher in watchers:
                watcher.__loop_phases__(loop_state, loop_state.phases)
            yield
    finally:
        loop_state.phases = None
        for watcher in watchers:
            watcher.__loop_phases__(loop_state, None)
